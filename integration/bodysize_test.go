package integration

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/event"
)

// A body over MAX_BODY_BYTES is poison: dead-lettered on its first
// delivery, undecoded, with its size in the reason, even when it would
// decode into a valid event (here a valid transfer padded with spaces to
// one byte over the bound); a body of exactly MAX_BODY_BYTES is applied,
// and so is the event behind them on the same key.
func TestBodyOverTheBoundIsDeadLetteredUndecoded(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	const bound = 4096
	svc := e.startWith(2, nil, func(c *consumer.Config) { c.MaxBodyBytes = bound })
	from := "acc_big_" + e.name
	atBound := newTransfer(from, "acc_to_"+e.name, 20)
	big, after := newTransfer(from, "acc_to_"+e.name, 10), newTransfer(from, "acc_to_"+e.name, 5)
	pad := func(b []byte, size int) []byte { return append(b, bytes.Repeat([]byte(" "), size-len(b))...) }
	body := pad(big.body(), bound+1)
	e.publishRaw(prefix, from, pad(atBound.body(), bound), atBound.EventID)
	e.publishRaw(prefix, from, body, big.EventID)
	e.publish(after)
	waitFor(t, 30*time.Second, "all three decided", func() bool {
		return len(svc.rec.of(atBound.EventID)) == 1 && len(svc.rec.of(big.EventID)) == 1 && len(svc.rec.of(after.EventID)) == 1
	})
	if d := svc.rec.of(atBound.EventID)[0]; d.Action != consumer.ActionAck {
		t.Errorf("want the body of exactly MAX_BODY_BYTES applied, got %+v", d)
	}
	if d := svc.rec.of(big.EventID)[0]; d.Action != consumer.ActionDeadLetter || d.Class != event.ClassPoison || d.DeliveryCount != 0 {
		t.Errorf("want the large body dead-lettered as poison on its first delivery, got %+v", d)
	}
	msgs := e.peekDLQ()
	if len(msgs) != 1 {
		t.Fatalf("DLQ holds %d, want the large message", len(msgs))
	}
	reason := fmt.Sprint(msgs[0].header("x-failure-reason"))
	if msgs[0].header("x-failure-class") != "poison" || !strings.Contains(reason, "MAX_BODY_BYTES") ||
		!strings.Contains(reason, fmt.Sprint(len(body))) {
		t.Errorf("dead letter: class %v, reason %q; want poison naming MAX_BODY_BYTES and the size %d",
			msgs[0].header("x-failure-class"), reason, len(body))
	}
	if n := e.inboxRows(big.EventID); n != 0 {
		t.Errorf("the large event left %d inbox rows, want 0", n)
	}
	if got := e.balance(from); got != -25 {
		t.Errorf("source balance = %d, want -25 (the body at the bound and the event behind applied)", got)
	}
}
