package consumer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// tagLog records, in order, what the handler told the broker about each
// delivery tag.
type tagLog struct{ calls []string }

func (l *tagLog) Ack(tag uint64, multiple bool) error {
	l.calls = append(l.calls, fmt.Sprintf("ack %d multiple=%v", tag, multiple))
	return nil
}
func (l *tagLog) Nack(tag uint64, multiple, requeue bool) error {
	l.calls = append(l.calls, fmt.Sprintf("nack %d requeue=%v", tag, requeue))
	return nil
}
func (l *tagLog) Reject(tag uint64, requeue bool) error {
	l.calls = append(l.calls, fmt.Sprintf("reject %d requeue=%v", tag, requeue))
	return nil
}

// batchApplier applies a batch at once, failing the whole batch when it
// holds an event of failing (as the database does for a contradicting
// transition), and reports a conflict for the event of conflicting.
type batchApplier struct {
	failing, conflicting string
	batches              [][]string
}

func (b *batchApplier) Apply(ctx context.Context, ev Event) (Result, error) {
	out, err := b.ApplyBatch(ctx, []Event{ev})
	if err != nil {
		return Result{}, err
	}
	return out[0].Result, out[0].Err
}
func (b *batchApplier) Lane(time.Duration) Lane { return b }
func (b *batchApplier) Close()                  {}
func (b *batchApplier) ApplyBatch(_ context.Context, evs []Event) ([]Outcome, error) {
	var ids []string
	for _, ev := range evs {
		ids = append(ids, ev.ID)
	}
	b.batches = append(b.batches, ids)
	out := make([]Outcome, len(evs))
	for i, ev := range evs {
		switch ev.ID {
		case b.failing:
			return nil, Transition(errors.New("contradicts its transfer"))
		case b.conflicting:
			out[i].Err = Conflict(errors.New("other content"))
		}
	}
	return out, nil
}

func eventBody(i int) string {
	return fmt.Sprintf(`{"eventId":"00000000-0000-4000-8000-%012d","eventType":"TransferCreated",
"occurredAt":"2026-07-10T12:00:00Z","data":{"transferId":"0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33",
"fromAccount":"acc_00001","toAccount":"acc_00002","amountMinor":100,"currency":"EUR"}}`, i)
}

// A batch of six: poison at tag 2 (decoded out), a conflict at tag 4 (its
// own outcome), a contradicting transition at tag 5 (found by splitting).
// The others are applied, in order, in as few transactions as the split
// allows; the dead letters' copies are confirmed before the one multiple
// ack, which names the last tag.
func TestBatchSettlesEachDeliveryOnce(t *testing.T) {
	app := &batchApplier{failing: "00000000-0000-4000-8000-000000000005",
		conflicting: "00000000-0000-4000-8000-000000000004"}
	var decided []Decision
	svc := New(Config{Topology: Topology{Prefix: "transfers", Queues: 1, DeliveryLimit: 5}, BatchMax: 10,
		ApplyTimeout: time.Second, Retry: Backoff{Min: time.Millisecond, Max: time.Millisecond},
		Observe: func(d Decision) { decided = append(decided, d) }}, app)
	log := &tagLog{}
	var copied []string
	w := &worker{svc: svc, queue: "transfers.0", work: context.Background(), lane: app,
		publish: func(_, _ string, msg amqp.Publishing) error {
			copied = append(copied, fmt.Sprint(msg.Headers["x-failure-class"]))
			log.calls = append(log.calls, "copy "+fmt.Sprint(msg.Headers["x-failure-class"]))
			return nil
		}}
	var ds []amqp.Delivery
	for i := 1; i <= 6; i++ {
		body := eventBody(i)
		if i == 2 {
			body = `{"eventId":`
		}
		ds = append(ds, amqp.Delivery{Acknowledger: log, DeliveryTag: uint64(i), Body: []byte(body), RoutingKey: "acc_00001"})
	}
	if err := w.handleBatch(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	want := []string{"copy poison", "copy producer-conflict", "copy invalid-transition", "ack 6 multiple=true"}
	if !reflect.DeepEqual(log.calls, want) {
		t.Errorf("told the broker %q, want %q", log.calls, want)
	}
	// [1 3 4 5 6] fails for 5; [1 3] commits; [4 5 6] fails; [4] commits;
	// [5 6] fails; [5] alone is the culprit; [6] commits.
	if n := len(app.batches); n != 7 {
		t.Errorf("%d transactions %v, want 7", n, app.batches)
	}
	actions := map[uint64]Action{}
	for i, d := range decided {
		actions[ds[i].DeliveryTag] = d.Action
	}
	for tag, want := range map[uint64]Action{1: ActionAck, 2: ActionDeadLetter, 3: ActionAck, 4: ActionDeadLetter,
		5: ActionDeadLetter, 6: ActionAck} {
		if actions[tag] != want {
			t.Errorf("tag %d: %s, want %s", tag, actions[tag], want)
		}
	}
}

// When the last delivery of a batch is settled on its own, the multiple
// ack names the last one acked, never a tag already settled.
func TestBatchMultipleAckNeverNamesASettledTag(t *testing.T) {
	app := &batchApplier{}
	svc := New(Config{Topology: Topology{Prefix: "transfers", Queues: 1, DeliveryLimit: 5}, BatchMax: 10,
		ApplyTimeout: time.Second, Retry: Backoff{Min: time.Millisecond, Max: time.Millisecond}}, app)
	log := &tagLog{}
	w := &worker{svc: svc, queue: "transfers.0", work: context.Background(), lane: app,
		publish: func(string, string, amqp.Publishing) error { return errors.New("nacked") }}
	ds := []amqp.Delivery{
		{Acknowledger: log, DeliveryTag: 1, Body: []byte(eventBody(1))},
		{Acknowledger: log, DeliveryTag: 2, Body: []byte(eventBody(2))},
		{Acknowledger: log, DeliveryTag: 3, Body: []byte(`poison`)},
	}
	if err := w.handleBatch(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	want := []string{"reject 3 requeue=false", "ack 2 multiple=true"}
	if !reflect.DeepEqual(log.calls, want) {
		t.Errorf("told the broker %q, want %q", log.calls, want)
	}
}
