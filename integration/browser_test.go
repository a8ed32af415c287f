package integration

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"transferconsumer/consumer"
	"transferconsumer/dlq"
	"transferconsumer/event"
)

// The dead letters as a person sees them: three letters of three classes,
// made by the service, looked at in the management UI in a real browser
// (log in, the DLQ's page, "Get messages" with Ack mode "Nack message
// requeue true"). The page shows each letter's x-failure-class and
// x-failure-reason, and looking takes nothing out of the DLQ. A screenshot
// of the page is kept (TEST_SCREENSHOT_DIR, else the test's temporary
// directory). The UI's markup is the same on 3.10 and 4.x where this
// reads it; CI runs it on 3.10.8, 4.0.5 and 4.3.6.
func TestDLQInTheBrowser(t *testing.T) {
	parallel(t)
	chromium := chromiumPath(t)
	e := newEnv(t)
	want := e.deadLetterOneOfEachKind()

	queue := dlq.Queue(prefix)
	// The page shows the management database's statistics, which lag
	// the queue by a few seconds: wait until they count the letters, so
	// that the page agrees with itself.
	waitFor(t, 30*time.Second, "the management statistics to count three letters in "+queue, func() bool {
		var q struct {
			Messages int `json:"messages"`
		}
		err := e.b.mgmtErr(http.MethodGet, "/api/queues/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(queue), nil, &q)
		return err == nil && q.Messages == len(want)
	})

	version := brokerVersion(t, e.b)
	base, user, password := managementCredentials(t, e.b.managementURL)
	b := newBrowser(t, chromium)
	b.managementLogin(base, user, password)

	shown := b.getMessages(e, queue, len(want))
	if len(shown) != len(want) {
		t.Errorf("the page shows %d letters, want %d", len(shown), len(want))
	}
	seen := map[string]bool{}
	for i, l := range shown {
		id := l.Rows["message_id"]
		w, ok := want[id]
		if !ok {
			t.Errorf("letter %d on the page has message_id %q, not one of the test's; it shows:\n%s", i+1, id, l.Text)
			continue
		}
		seen[id] = true
		for _, h := range []struct{ name, value string }{{dlq.HeaderClass, w.class}, {dlq.HeaderReason, w.reason}} {
			if !strings.Contains(l.Text, h.name) {
				t.Errorf("letter %d (%s): the page does not show %s; it shows:\n%s", i+1, w.class, h.name, l.Text)
			}
			if got := oneLine(l.Rows[h.name]); got != oneLine(h.value) {
				t.Errorf("letter %d (%s): the page shows %s %q, want %q", i+1, w.class, h.name, got, h.value)
			}
		}
	}
	for id, w := range want {
		if !seen[id] {
			t.Errorf("the %s letter (message_id %s) is not on the page", w.class, id)
		}
	}

	// From the top of the page, where the UI's header belongs.
	b.step("scroll to the top", 10*time.Second, chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
	png := browserRun(b, "take a screenshot", 30*time.Second, chromedp.FullScreenshot(100))
	shot := filepath.Join(screenshotDir(t), "dlq-management-ui-rabbitmq-"+version+".png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the DLQ's page on RabbitMQ %s: %s", version, shot)

	// Looking took nothing out: the three letters are still there.
	waitFor(t, 10*time.Second, "the three letters back in the DLQ", func() bool { return e.ready(queue) == len(want) })
	after := map[string]bool{}
	for _, m := range e.peekDLQ() {
		after[fmt.Sprint(m.Properties["message_id"])] = true
	}
	for id, w := range want {
		if !after[id] {
			t.Errorf("the %s letter (message_id %s) is gone from the DLQ after looking at it", w.class, id)
		}
	}
}

// getMessages opens queue's page in e's vhost, asks for count messages
// with Ack mode "Nack message requeue true", as a person does, and returns
// what the page shows of each.
func (b *browser) getMessages(e *env, queue string, count int) []shownLetter {
	e.t.Helper()
	b.step("open "+queue+"'s page in vhost "+e.vhost, 30*time.Second,
		chromedp.Evaluate[chromedp.Void](`location.hash = `+jsString(queuePageHash(e.vhost, queue))),
		chromedp.WaitReady(chromedp.CSS(`form[action="#/queues/get"]`)),
		chromedp.WaitVisible(chromedp.Search(`//h1[contains(., `+jsString(queue)+`)]`)),
	)
	b.clickStill(`open "Get messages"`, `//h2[normalize-space(.)="Get messages"]`)
	b.step(`wait for the "Get messages" form`, 30*time.Second,
		chromedp.WaitVisible(chromedp.CSS(`form[action="#/queues/get"] select[name="ackmode"]`)))
	// The Ack mode is chosen by the label a person reads, not by the
	// option's value.
	b.choose(`form[action="#/queues/get"] select[name="ackmode"]`, "Nack message requeue true")
	b.step(fmt.Sprintf("ask for %d messages", count), 10*time.Second,
		chromedp.SetValue(chromedp.CSS(`form[action="#/queues/get"] input[name="count"]`), strconv.Itoa(count)))
	b.clickStill("press Get Message(s)", `form[action="#/queues/get"] input[type="submit"]`)
	b.step("wait for the letters", 30*time.Second,
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#msg-wrapper div.box:nth-of-type(%d)`, count))))
	// The letters slide in: wait until the last one is shown whole.
	browserRun(b, "wait for the letters to be shown whole", 10*time.Second, chromedp.Poll[bool](`(() => {
		const w = document.getElementById('msg-wrapper'), boxes = w.querySelectorAll('div.box');
		return boxes.length >= `+strconv.Itoa(count)+` && w.scrollHeight <= w.clientHeight + 1 &&
			boxes[boxes.length - 1].getBoundingClientRect().bottom <= w.getBoundingClientRect().bottom + 1;
	})()`))

	// What the page shows of each letter: its rendered text, and each
	// row of its tables (the properties, and the headers inside them) as
	// name → rendered value.
	return browserRun(b, "read the letters on the page", 10*time.Second, chromedp.Evaluate[[]shownLetter](`
		[...document.querySelectorAll('#msg-wrapper div.box')].map(box => {
			const rows = {};
			for (const tr of box.querySelectorAll('tr')) {
				const th = tr.querySelector(':scope > th'), td = tr.querySelector(':scope > td');
				if (th && td) rows[th.innerText.trim().replace(/:$/, '')] = td.innerText.trim();
			}
			return {text: box.innerText, rows: rows};
		})`))
}

// shownLetter is one letter as the management UI renders it.
type shownLetter struct {
	Text string            `json:"text"`
	Rows map[string]string `json:"rows"`
}

// wantLetter is a letter's failure class and reason, as the service decided them.
type wantLetter struct{ class, reason string }

// deadLetterOneOfEachKind has the service dead-letter three messages, a
// poison one (not JSON), one the database rejects (the target's balance
// would overflow) and an invalid transition (a TransferCompleted after the
// transfer failed), waits until all three are in the DLQ, and returns the
// class and reason of each, by message_id, from the service's own
// decisions. Nothing reads the DLQ before the browser does.
func (e *env) deadLetterOneOfEachKind() map[string]wantLetter {
	e.t.Helper()
	rich := "acc_rich_" + e.name
	e.db.MustExec(`INSERT INTO balance_projection (account, balance_minor) VALUES ($1, 9223372036854775000)`, rich)
	svc := e.start(1, nil)
	from, to := "acc_b_"+e.name, "acc_c_"+e.name

	poison := "poison-" + e.name // its message_id; the body has no eventId to read
	e.publishRaw(prefix, from, []byte(`{"eventId": "not json`), poison)
	overflow := newTransfer(from, rich, 10_000)
	e.publish(overflow)
	created := newTransfer(from, to, 250)
	failed := transition(created, event.TransferFailed)
	completed := transition(created, event.TransferCompleted)
	for _, tr := range []transfer{created, failed, completed} {
		e.publish(tr)
	}

	queue := dlq.Queue(prefix)
	waitFor(e.t, 30*time.Second, "three letters in "+queue+", and the service's decisions about them", func() bool {
		return e.ready(queue) == 3 && len(svc.rec.of(poison)) > 0 && len(svc.rec.of(overflow.EventID)) > 0 &&
			len(svc.rec.of(completed.EventID)) > 0
	})
	for _, tr := range []transfer{created, failed} {
		if ds := svc.rec.of(tr.EventID); len(ds) != 1 || ds[0].Action != consumer.ActionAck {
			e.t.Fatalf("%s: decisions %+v, want applied", tr.EventType, ds)
		}
	}
	want := map[string]wantLetter{}
	for id, class := range map[string]event.Class{
		poison:            event.ClassPoison,
		overflow.EventID:  event.ClassRejected,
		completed.EventID: event.ClassTransition,
	} {
		ds := svc.rec.of(id)
		if len(ds) == 0 {
			e.t.Fatalf("no decision about %s, want it dead-lettered as %s", id, class)
		}
		d := ds[len(ds)-1]
		if d.Action != consumer.ActionDeadLetter || d.Class != class || d.Err == nil {
			e.t.Fatalf("%s: %+v, want dead-lettered as %s", id, d, class)
		}
		want[id] = wantLetter{string(class), d.Err.Error()}
	}
	return want
}

// queuePageHash is the management UI's address of a queue's page, the
// vhost and the name escaped as the UI escapes them.
func queuePageHash(vhost, queue string) string {
	return "#/queues/" + uiEscape(vhost) + "/" + uiEscape(queue)
}

// uiEscape is JavaScript's encodeURIComponent, which the UI's links use.
func uiEscape(s string) string {
	var out strings.Builder
	for _, c := range []byte(s) {
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.!~*'()", c) >= 0 {
			out.WriteByte(c)
		} else {
			fmt.Fprintf(&out, "%%%02X", c)
		}
	}
	return out.String()
}

// oneLine collapses s's white space as a browser renders it.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
