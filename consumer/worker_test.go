package consumer

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
)

// fakeAck records what the handler told the broker about a delivery.
type fakeAck struct {
	acks, nacks, rejects int
	requeued             bool
}

func (f *fakeAck) Ack(uint64, bool) error { f.acks++; return nil }
func (f *fakeAck) Nack(_ uint64, _ bool, requeue bool) error {
	f.nacks++
	f.requeued = requeue
	return nil
}
func (f *fakeAck) Reject(_ uint64, requeue bool) error {
	f.rejects++
	f.requeued = requeue
	return nil
}

type stubApplier struct {
	results []error // returned in turn; the last one repeats
	calls   int
	dup     bool
	onCall  func()
}

// errPanic makes stubApplier panic instead of returning.
var errPanic = errors.New("panic")

func (s *stubApplier) Apply(context.Context, Event) (Result, error) {
	err := s.results[min(s.calls, len(s.results)-1)]
	s.calls++
	if s.onCall != nil {
		s.onCall()
	}
	if err == errPanic {
		var m map[string]int
		m["boom"]++ // a nil map write: a bug that some message triggers
	}
	return Result{Duplicate: s.dup && err == nil}, err
}

const validBody = `{"eventId":"3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10","eventType":"TransferCreated",
"occurredAt":"2026-07-10T12:00:00Z","data":{"transferId":"0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33",
"fromAccount":"acc_00001","toAccount":"acc_00002","amountMinor":10000,"currency":"EUR"}}`

// Every path through the handler ends in exactly one of: ack after commit,
// dead-letter (copy confirmed, then ack; or reject without requeue when the
// copy fails), or redelivery (reject with requeue). Shutdown never
// dead-letters.
func TestHandleEndsInExactlyOneOutcome(t *testing.T) {
	transient := Transient(errors.New("connection refused"))
	tests := []struct {
		name       string
		body       string
		results    []error
		dup        bool
		publishErr error
		shutdown   bool // shutdown starts during the first apply
		stopCopy   bool // shutdown ends the wait for the dead-letter copy's confirm
		wantAction Action
		wantClass  Class
		want       fakeAck
		wantCopies int
	}{
		{name: "applied", body: validBody, results: []error{nil},
			wantAction: ActionAck, want: fakeAck{acks: 1}},
		{name: "duplicate", body: validBody, results: []error{nil}, dup: true,
			wantAction: ActionAck, want: fakeAck{acks: 1}},
		{name: "bad JSON is poison", body: `{"eventId":`, results: []error{nil},
			wantAction: ActionDeadLetter, wantClass: ClassPoison, want: fakeAck{acks: 1}, wantCopies: 1},
		{name: "poison whose copy is not confirmed is rejected to the broker's DLX", body: `nope`, results: []error{nil},
			publishErr: errors.New("nacked"),
			wantAction: ActionDeadLetter, wantClass: ClassPoison, want: fakeAck{rejects: 1}, wantCopies: 1},
		{name: "producer conflict", body: validBody, results: []error{Conflict(errors.New("other content"))},
			wantAction: ActionDeadLetter, wantClass: ClassConflict, want: fakeAck{acks: 1}, wantCopies: 1},
		{name: "invalid transition", body: validBody, results: []error{Transition(errors.New("already failed"))},
			wantAction: ActionDeadLetter, wantClass: ClassTransition, want: fakeAck{acks: 1}, wantCopies: 1},
		{name: "transient is retried in place, then applied", body: validBody, results: []error{transient, transient, nil},
			wantAction: ActionAck, want: fakeAck{acks: 1}},
		{name: "data the database rejects is dead-lettered at once", body: validBody, results: []error{Rejected(errors.New("bigint out of range"))},
			wantAction: ActionDeadLetter, wantClass: ClassRejected, want: fakeAck{acks: 1}, wantCopies: 1},
		{name: "unknown is retried in place like the environment's fault, then applied", body: validBody,
			results:    []error{errors.New("boom"), errors.New("boom"), Transient(errors.New("refused")), nil},
			wantAction: ActionAck, want: fakeAck{acks: 1}},
		{name: "panic is requeued, so the delivery limit ends a crash loop", body: validBody, results: []error{errPanic},
			wantAction: ActionRequeue, wantClass: ClassPanic, want: fakeAck{rejects: 1, requeued: true}},
		{name: "shutdown while the dead-letter copy waits for its confirm requeues", body: `nope`, results: []error{nil},
			publishErr: context.Canceled, stopCopy: true,
			wantAction: ActionRequeue, wantClass: ClassPoison, want: fakeAck{nacks: 1, requeued: true}, wantCopies: 1},
		{name: "transient cut short by shutdown is requeued with a nack, which 4.3+ does not count", body: validBody, results: []error{transient},
			shutdown: true, wantAction: ActionRequeue, wantClass: ClassShutdown, want: fakeAck{nacks: 1, requeued: true}},
		{name: "unknown during shutdown is requeued, not dead-lettered", body: validBody, results: []error{errors.New("boom")},
			shutdown: true, wantAction: ActionRequeue, wantClass: ClassShutdown, want: fakeAck{nacks: 1, requeued: true}},
		{name: "applied during shutdown is acked", body: validBody, results: []error{nil},
			shutdown: true, wantAction: ActionAck, want: fakeAck{acks: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			session, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			app := &stubApplier{results: tt.results, dup: tt.dup}
			if tt.shutdown {
				app.onCall = func() { cancel(ErrShutdown) }
			}
			var got Decision
			svc := New(Config{
				Topology:     Topology{Prefix: "transfers", Queues: 1, DeliveryLimit: 5},
				ApplyTimeout: time.Second,
				Retry:        Backoff{Min: time.Millisecond, Max: time.Millisecond},
				Observe:      func(d Decision) { got = d },
			}, app)
			copies := 0
			work, stopWork := context.WithCancelCause(context.Background())
			defer stopWork(nil)
			if tt.stopCopy {
				stopWork(ErrShutdown)
			}
			w := &worker{svc: svc, queue: "transfers.0", work: work,
				publish: func(exchange, key string, msg amqp.Publishing) error {
					copies++
					if exchange != dlq.Exchange("transfers") || key != "acc_00001" {
						t.Errorf("copy published to %s/%s, want transfers.dlx/acc_00001", exchange, key)
					}
					if msg.Headers[dlq.HeaderClass] != string(tt.wantClass) {
						t.Errorf("copy class header = %v, want %s", msg.Headers[dlq.HeaderClass], tt.wantClass)
					}
					return tt.publishErr
				}}
			ack := &fakeAck{}
			d := amqp.Delivery{Acknowledger: ack, Body: []byte(tt.body), RoutingKey: "acc_00001", DeliveryTag: 1}

			if err := w.handle(session, d); err != nil {
				t.Fatalf("handle: %v", err)
			}
			if *ack != tt.want {
				t.Errorf("broker was told %+v, want %+v", *ack, tt.want)
			}
			if ack.acks+ack.rejects+ack.nacks != 1 {
				t.Errorf("%d acks/rejects/nacks, want exactly one", ack.acks+ack.rejects+ack.nacks)
			}
			if got.Action != tt.wantAction || got.Class != tt.wantClass {
				t.Errorf("decision %s/%q, want %s/%q (err %v)", got.Action, got.Class, tt.wantAction, tt.wantClass, got.Err)
			}
			if copies != tt.wantCopies {
				t.Errorf("%d dead-letter copies, want %d", copies, tt.wantCopies)
			}
			if tt.shutdown && copies > 0 {
				t.Error("shutdown dead-lettered a message")
			}
			if len(svc.State().Blocked) != 0 {
				t.Errorf("queue still reported blocked after the decision: %+v", svc.State().Blocked)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	tests := []struct {
		class Class
		want  Action
	}{
		{"", ActionAck},
		{ClassPoison, ActionDeadLetter},
		{ClassConflict, ActionDeadLetter},
		{ClassTransition, ActionDeadLetter},
		{ClassRejected, ActionDeadLetter},
		{ClassTransient, ActionRetry},
		{ClassUnknown, ActionRetry},
		{ClassPanic, ActionRequeue},
		{ClassShutdown, ActionRequeue},
	}
	for _, tt := range tests {
		if got := decide(tt.class); got != tt.want {
			t.Errorf("decide(%q) = %s, want %s", tt.class, got, tt.want)
		}
		if tt.want == ActionDeadLetter && !slices.Contains(dlq.Classes(), string(tt.class)) {
			t.Errorf("dlq.Classes() lacks %q: dlq replay --class would refuse its letters", tt.class)
		}
	}
}

func TestClassOf(t *testing.T) {
	live := context.Background()
	stopping, cancel := context.WithCancelCause(context.Background())
	cancel(ErrShutdown)
	plain := errors.New("x")
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want Class
	}{
		{"nil", live, nil, ""},
		{"plain", live, plain, ClassUnknown},
		{"poison", live, Poison(plain), ClassPoison},
		{"wrapped transient", live, errors.Join(errors.New("ctx"), Transient(plain)), ClassTransient},
		{"poison while stopping stays poison", stopping, Poison(plain), ClassPoison},
		{"conflict while stopping stays conflict", stopping, Conflict(plain), ClassConflict},
		{"transition while stopping stays transition", stopping, Transition(plain), ClassTransition},
		{"rejected while stopping stays rejected", stopping, Rejected(plain), ClassRejected},
		{"transient while stopping", stopping, Transient(plain), ClassShutdown},
		{"unknown while stopping", stopping, plain, ClassShutdown},
	}
	for _, tt := range tests {
		if got := ClassOf(tt.ctx, tt.err); got != tt.want {
			t.Errorf("%s: ClassOf = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestBackoffStaysWithinBounds(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: 2 * time.Second}
	for attempt := 0; attempt < 20; attempt++ {
		ceiling := min(b.Min<<min(attempt, 30), b.Max)
		for i := 0; i < 50; i++ {
			d := b.Delay(attempt)
			if d < ceiling/2 || d > ceiling {
				t.Fatalf("Delay(%d) = %s, want within [%s, %s]", attempt, d, ceiling/2, ceiling)
			}
		}
	}
}
