package consumer

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"transferconsumer/event"
)

// failingLane fails every attempt, one event or a batch.
type failingLane struct{ countedLane }

var errEnvironment = errors.New("environment down")

func (*failingLane) Apply(context.Context, event.Event) (event.Result, error) {
	return event.Result{}, errEnvironment
}

func (*failingLane) ApplyBatch(context.Context, []event.Event) ([]event.Outcome, error) {
	return nil, errEnvironment
}

// Each attempt, of one event or of a batch, is one apply_event span that
// carries the attempt's error; a batch's span says how many events it
// took.
func TestAnAttemptIsOneSpanWithItsError(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	svc := &Service{cfg: Config{Tracer: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")}}
	w := &worker{svc: svc, lane: &failingLane{}, work: context.Background()}
	batch := func(n int) []*inHand {
		hand := make([]*inHand, n)
		for i := range hand {
			hand[i] = &inHand{Tag: uint64(i + 1)}
		}
		return hand
	}
	for _, n := range []int{1, 3} {
		if _, err := w.apply(batch(n)); !errors.Is(err, errEnvironment) {
			t.Fatalf("%d events: err = %v", n, err)
		}
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans ended, want 2", len(spans))
	}
	for i, s := range spans {
		if s.Name() != "apply_event" || s.Status().Code != codes.Error || len(s.Events()) != 1 {
			t.Errorf("span %d: %s, status %v, %d events; want apply_event, an error and its record", i, s.Name(), s.Status(), len(s.Events()))
		}
	}
	count := attribute.Key("messaging.batch.message_count")
	has := func(s sdktrace.ReadOnlySpan) (attribute.Value, bool) {
		for _, kv := range s.Attributes() {
			if kv.Key == count {
				return kv.Value, true
			}
		}
		return attribute.Value{}, false
	}
	if v, ok := has(spans[0]); ok {
		t.Errorf("one event's span has a batch count, %v", v.Emit())
	}
	if v, ok := has(spans[1]); !ok || v.AsInt64() != 3 {
		t.Errorf("a batch of 3's span: count %v (set %v), want 3", v.Emit(), ok)
	}
}
