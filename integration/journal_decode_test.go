package integration

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
)

// An entry of the journal whose event no longer decodes (its occurredAt is
// not a time: a body that a later release validates more strictly) does
// not take its neighbours with it: the service's restore at start applies
// the other entries of its journal message, and the entry ends in the
// dead-letter queue, its body as journaled, with a reason that says it was
// applied and acked once; the queue goes on without an operator. The
// journal message is written to the stream as the service writes one (a
// queue's entries 1 to 3 in one message); the database holds none of them,
// as after a restore to before they were applied. Before, the whole
// message was unreadable: none of its entries applied, the queue waiting
// for recover --accept-loss.
func TestAnEntryThatNoLongerDecodesIsDeadLetteredWhileItsNeighboursAreApplied(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(1)
	stream := prefix + ".journal"
	ch := e.declareStream(stream, nil)
	good := []transfer{newTransfer("acc_dec_a", "acc_dec_b", 5), newTransfer("acc_dec_a", "acc_dec_b", 7)}
	bad := newTransfer("acc_dec_a", "acc_dec_b", 11)
	bad.OccurredAt = "yesterday"
	entry := func(seq int, tr transfer) json.RawMessage {
		b, err := json.Marshal(map[string]any{"seq": seq, "type": tr.EventType, "messageId": tr.EventID, "contentType": "application/json",
			"routingKey": tr.Data.FromAccount, "headers": map[string]any{"x-note": "journaled"}, "body": json.RawMessage(tr.body())})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	body, err := json.Marshal([]json.RawMessage{entry(1, good[0]), entry(2, bad), entry(3, good[1])})
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	c, err := ch.PublishWithDeferredConfirm("", stream, true, false, amqp.Publishing{
		Headers:     amqp.Table{"x-journal-queue": prefix + ".0", "x-journal-first": int64(1), "x-journal-last": int64(3)},
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Body: body})
	if err != nil || !c.Wait() {
		t.Fatalf("the journal message was not confirmed (%v)", err)
	}

	proc := startProcess(t, e.serviceEnv(1, "DECLARE_TOPOLOGY=false", "JOURNAL_STREAM="+stream))
	proc.waitConsuming(1)
	var letter dlqMessage
	waitFor(t, 60*time.Second, "the entry that no longer decodes in the dead-letter queue", func() bool {
		for _, m := range e.peekDLQ() {
			if m.Payload == string(bad.body()) {
				letter = m
				return true
			}
		}
		return false
	})
	reason, _ := letter.header(dlq.HeaderReason).(string)
	if class := letter.header(dlq.HeaderClass); class != "poison" ||
		!strings.Contains(reason, "applied and acked once, then no longer decodes when applied again from the journal (entry 2 of "+prefix+".0)") ||
		!strings.Contains(reason, `occurredAt "yesterday"`) || letter.RoutingKey != bad.Data.FromAccount || letter.header("x-note") != "journaled" {
		t.Errorf("the letter: class %v, reason %q, routing key %s, x-note %v; want poison, a reason that says it was applied and acked once "+
			"and why it no longer decodes, its routing key and headers as journaled", class, reason, letter.RoutingKey, letter.header("x-note"))
	}
	for _, tr := range good {
		if n := e.inboxRows(tr.EventID); n != 1 {
			t.Errorf("the neighbour %s: %d inbox rows, want 1", tr.EventID, n)
		}
	}
	if n := e.inboxRows(bad.EventID); n != 0 {
		t.Errorf("the entry that no longer decodes was applied (%d inbox rows)", n)
	}
	var mark int64
	if err := e.db.Get(&mark, `SELECT seq FROM journal_mark WHERE queue = $1`, prefix+".0"); err != nil || mark != 3 {
		t.Errorf("the queue's mark is %d (%v), want 3: past the letter's entry and its neighbours", mark, err)
	}
	// The queue goes on: its next event takes the next sequence.
	next := newTransfer("acc_dec_a", "acc_dec_b", 13)
	e.publish(next)
	waitFor(t, 60*time.Second, "the queue's next event applied", func() bool { return e.inboxRows(next.EventID) == 1 })
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}
