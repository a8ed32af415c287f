package integration

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"transferconsumer/consumer"
)

// A W3C traceparent published with an event comes back as the parent of
// the delivery's span, a consumer span with the messaging attributes, and
// the transaction's span is the delivery span's child; the decision names
// the trace for its log line.
func TestTraceparentIsTheParentOfTheDeliverySpan(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(t.Context())
	svc := e.startWith(1, nil, func(c *consumer.Config) { c.Tracer = tp.Tracer("test") })

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	tr := newTransfer("acc_tr1_"+e.name, "acc_tr2_"+e.name, 5)
	e.publishMsg(tr.Data.FromAccount, tr.body(), tr.EventID, amqp.Table{"traceparent": "00-" + traceID + "-" + parentID + "-01"})
	waitFor(t, 20*time.Second, "the event applied", func() bool { return len(svc.rec.of(tr.EventID)) == 1 })
	if d := svc.rec.of(tr.EventID)[0]; d.TraceID != traceID {
		t.Errorf("decision names trace %q, want %q", d.TraceID, traceID)
	}

	var delivery, txn sdktrace.ReadOnlySpan
	waitFor(t, 10*time.Second, "both spans ended", func() bool {
		for _, s := range rec.Ended() {
			switch s.Name() {
			case "process transfers.0":
				delivery = s
			case "apply_event":
				txn = s
			}
		}
		return delivery != nil && txn != nil
	})
	if got := delivery.Parent(); got.TraceID().String() != traceID || got.SpanID().String() != parentID || !got.IsRemote() {
		t.Errorf("delivery span's parent = %s/%s, want the published %s/%s", got.TraceID(), got.SpanID(), traceID, parentID)
	}
	if delivery.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("delivery span kind %v, want consumer", delivery.SpanKind())
	}
	attrs := map[string]string{}
	for _, a := range delivery.Attributes() {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	for k, v := range map[string]string{"messaging.system": "rabbitmq", "messaging.operation.type": "process",
		"messaging.destination.name": "transfers.0", "messaging.message.id": tr.EventID,
		"transferconsumer.outcome": "applied"} {
		if attrs[k] != v {
			t.Errorf("delivery span %s = %q, want %q", k, attrs[k], v)
		}
	}
	if txn.Parent().SpanID() != delivery.SpanContext().SpanID() {
		t.Error("the transaction's span is not the delivery span's child")
	}
}
