package integration

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
	"transferconsumer/event"
)

// A letter keeps its history through each dead-lettering: one that the
// service dead-letters again after its third replay shows x-replay-count 3
// and x-replayed-at in the management UI, looked at in a real browser as
// TestDLQInTheBrowser does, and in dlq list.
func TestReplayCountInTheBrowser(t *testing.T) {
	parallel(t)
	chromium := chromiumPath(t)
	e := newEnv(t)
	rejected := "acc_rej_" + randomSuffix()
	svc := e.start(2, applierFunc(func(context.Context, event.Event) (event.Result, error) {
		return event.Result{}, event.Rejected(errors.New("the database refuses this account's events"))
	}))
	tr := newTransfer("acc_from_"+randomSuffix(), rejected, 100)
	e.publish(tr)
	queue := dlq.Queue(prefix)
	waitFor(t, 60*time.Second, "the letter in the DLQ", func() bool { return e.ready(queue) == 1 })

	conn, err := amqp.DialConfig(e.amqpURL, amqp.Config{Properties: amqp.Table{"connection_name": e.name + "-replay"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i := 1; i <= 3; i++ {
		r, err := dlq.ReplayPaced(context.Background(), conn, prefix, dlq.Filter{Class: "data-rejected"}, 0, false,
			dlq.Custody{}, dlq.Pace{})
		if err != nil || len(r.Replayed) != 1 {
			t.Fatalf("replay %d: %d replayed, %v", i, len(r.Replayed), err)
		}
		waitFor(t, 60*time.Second, "the letter dead-lettered again", func() bool { return len(svc.rec.of(tr.EventID)) > i })
		waitFor(t, 60*time.Second, "the letter back in the DLQ", func() bool { return e.ready(queue) == 1 })
	}
	s, err := dlq.List(conn, prefix, 1)
	if err != nil || len(s.Letters) != 1 || s.Letters[0].Replays != 3 || len(s.Groups) != 1 || s.Groups[0].Replayed != 1 {
		t.Fatalf("dlq list: %+v, %v; want one letter replayed 3 times", s, err)
	}

	waitFor(t, 30*time.Second, "the management statistics to count the letter in "+queue, func() bool {
		var q struct {
			Messages int `json:"messages"`
		}
		err := e.b.mgmtErr(http.MethodGet, "/api/queues/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(queue), nil, &q)
		return err == nil && q.Messages == 1
	})
	version := brokerVersion(t, e.b)
	base, user, password := managementCredentials(t, e.b.managementURL)
	b := newBrowser(t, chromium)
	b.managementLogin(base, user, password)
	shown := b.getMessages(e, queue, 1)
	if len(shown) != 1 {
		t.Fatalf("the page shows %d letters, want 1", len(shown))
	}
	l := shown[0]
	if got := l.Rows["message_id"]; got != tr.EventID {
		t.Errorf("the page shows message_id %q, want %s", got, tr.EventID)
	}
	if got := l.Rows[dlq.HeaderReplayCount]; got != "3" {
		t.Errorf("the page shows %s %q, want 3; it shows:\n%s", dlq.HeaderReplayCount, got, l.Text)
	}
	if got := l.Rows[dlq.HeaderReplayedAt]; got == "" {
		t.Errorf("the page shows no %s; it shows:\n%s", dlq.HeaderReplayedAt, l.Text)
	}
	if got := l.Rows[dlq.HeaderGroup]; got != s.Groups[0].Fingerprint {
		t.Errorf("the page shows %s %q, want %s", dlq.HeaderGroup, got, s.Groups[0].Fingerprint)
	}
	b.step("scroll to the top", 10*time.Second, chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
	png := browserRun(b, "take a screenshot", 30*time.Second, chromedp.FullScreenshot(100))
	shot := filepath.Join(screenshotDir(t), "dlq-replay-count-rabbitmq-"+version+".png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the replayed letter on RabbitMQ %s: %s", version, shot)
	waitFor(t, 10*time.Second, "the letter back in the DLQ after looking", func() bool { return e.ready(queue) == 1 })
}
