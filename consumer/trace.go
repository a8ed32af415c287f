package consumer

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Tracing follows the design's rule: the trace context is taken from the
// message before the transaction opens, so the span covers the real work.
// A delivery gets a span of kind consumer, child of the producer's W3C
// traceparent when the message carries one; each attempt of its transaction
// a child span. With no Tracer configured none of this runs.

// propagator reads W3C traceparent and tracestate headers.
var propagator = propagation.TraceContext{}

// headerCarrier lets the propagator read an AMQP header table.
type headerCarrier amqp.Table

func (c headerCarrier) Get(key string) string {
	s, _ := c[key].(string)
	return s
}

func (c headerCarrier) Set(key, value string) { c[key] = value }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// startDelivery starts the span of one delivery, as a child of the trace
// context its headers carry.
func (w *worker) startDelivery(t trace.Tracer, d amqp.Delivery) (context.Context, trace.Span) {
	ctx := propagator.Extract(context.Background(), headerCarrier(d.Headers))
	return t.Start(ctx, "process "+w.queue, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(w.queue),
		semconv.MessagingRabbitMQDestinationRoutingKey(d.RoutingKey),
	))
}

// endDelivery records the decision on the delivery's span and ends it.
func endDelivery(span trace.Span, dec Decision) {
	span.SetAttributes(semconv.MessagingMessageID(dec.EventID), attribute.String("transferconsumer.outcome", dec.Outcome()))
	if dec.Class != "" {
		span.SetAttributes(attribute.String("transferconsumer.failure_class", string(dec.Class)))
		span.SetStatus(codes.Error, dec.Err.Error())
	}
	span.End()
}

// startTransaction starts the span of one attempt of the event's transaction.
func startTransaction(t trace.Tracer, ctx context.Context) trace.Span {
	_, span := t.Start(ctx, "apply_event", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		semconv.DBSystemNamePostgreSQL,
		semconv.DBOperationName("apply_event"),
	))
	return span
}

// traceID returns the trace id a log line names: the delivery span's when
// there is one, else the one the message's traceparent carries, read
// without the propagator (format 00-<32 hex trace id>-<16 hex>-<2 hex>).
func traceID(span trace.Span, headers amqp.Table) string {
	if span != nil {
		if sc := span.SpanContext(); sc.HasTraceID() {
			return sc.TraceID().String()
		}
	}
	tp, _ := headers["traceparent"].(string)
	if len(tp) < 55 || tp[2] != '-' || tp[35] != '-' || tp[:3] == "ff-" {
		return ""
	}
	return tp[3:35]
}
