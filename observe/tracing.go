package observe

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"transferconsumer/config"
)

// NewTracer returns the service's tracer when the standard OpenTelemetry
// variables ask for traces (config.LoadTracing): spans go out over
// OTLP/HTTP in batches, the exporter reading the OTEL_EXPORTER_OTLP_*
// variables itself. Otherwise it returns nil and nothing is traced at all.
// The returned function flushes what is held and stops the exporter.
func NewTracer(ctx context.Context, t config.Tracing) (trace.Tracer, func(context.Context) error, error) {
	none := func(context.Context) error { return nil }
	if !t.On {
		return nil, none, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, none, fmt.Errorf("trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(),
		resource.NewSchemaless(semconv.ServiceName(t.ServiceName)))
	if err != nil {
		return nil, none, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp.Tracer("transferconsumer"), tp.Shutdown, nil
}
