package integration

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/consumer"
	"transferconsumer/dlq"
	"transferconsumer/event"
)

// A transition whose message carries a NUL in a header is a valid event:
// the service applies it, and when it waited for its creation and then
// contradicts it, its dead letter carries the header as it came. (jsonb
// refuses \u0000; the database once turned such a header into a dead
// letter of a valid event, class data-rejected.)
func TestTransitionWithANULInAHeader(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	svc := e.start(1, nil)
	tr := newTransfer("acc_nul1_"+e.name, "acc_nul2_"+e.name, 400)
	wrong := transition(tr, event.TransferCompleted)
	wrong.Data.AmountMinor = 401
	headers := amqp.Table{"x-note": "before\x00after", "x-nested": amqp.Table{"k\x00": "v\x00"}}

	e.publishMsg(wrong.Data.FromAccount, wrong.body(), wrong.EventID, headers)
	waitFor(t, 20*time.Second, "the waiting transition applied", func() bool { return len(svc.rec.of(wrong.EventID)) > 0 })
	if d := svc.rec.of(wrong.EventID)[0]; d.Action != consumer.ActionAck {
		t.Fatalf("the waiting transition with a NUL in a header: %+v, want it applied (acked)", d)
	}
	if p := e.pendingCount(); p != 1 {
		t.Fatalf("%d transitions waiting, want 1", p)
	}

	e.publish(tr)
	waitFor(t, 20*time.Second, "the waiting transition dead-lettered", func() bool {
		for _, d := range svc.rec.of(wrong.EventID) {
			if d.Action == consumer.ActionDeadLetter {
				return true
			}
		}
		return false
	})
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var m amqp.Delivery
	waitFor(t, 10*time.Second, "the dead letter in the DLQ", func() bool {
		d, ok, err := ch.Get(dlq.Queue(prefix), true)
		if err != nil {
			t.Fatal(err)
		}
		m = d
		return ok
	})
	nested, _ := m.Headers["x-nested"].(amqp.Table)
	if m.Headers["x-failure-class"] != "invalid-transition" || m.Headers["x-note"] != "before\x00after" ||
		nested["k\x00"] != "v\x00" || string(m.Body) != string(wrong.body()) {
		t.Errorf("dead letter: class %v, x-note %q, x-nested %q, body %s; want invalid-transition with the headers as they came",
			m.Headers["x-failure-class"], m.Headers["x-note"], m.Headers["x-nested"], m.Body)
	}
}
