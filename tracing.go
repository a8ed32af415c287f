package main

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// newTracer returns the service's tracer when the standard OpenTelemetry
// variables ask for traces: OTEL_TRACES_EXPORTER=otlp, or an
// OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the
// exporter reads those, and the rest of the OTEL_EXPORTER_OTLP_* variables,
// itself). Spans go out over OTLP/HTTP in batches. Otherwise, or with
// OTEL_TRACES_EXPORTER=none, it returns nil and nothing is traced at all.
// The returned function flushes what is held and stops the exporter.
func newTracer(ctx context.Context) (trace.Tracer, func(context.Context) error, error) {
	none := func(context.Context) error { return nil }
	switch exporter := os.Getenv("OTEL_TRACES_EXPORTER"); exporter {
	case "none":
		return nil, none, nil
	case "otlp":
	case "":
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, none, nil
		}
	default:
		return nil, none, fmt.Errorf("configuration: OTEL_TRACES_EXPORTER: %q is not supported; use otlp or none", exporter)
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		if p := os.Getenv(v); p != "" && p != "http/protobuf" {
			return nil, none, fmt.Errorf("configuration: %s: %q is not supported; use http/protobuf", v, p)
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, none, fmt.Errorf("trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(),
		resource.NewSchemaless(semconv.ServiceName(serviceName())))
	if err != nil {
		return nil, none, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp.Tracer("transferconsumer"), tp.Shutdown, nil
}

// serviceName is OTEL_SERVICE_NAME, else transferconsumer.
func serviceName() string {
	if n := os.Getenv("OTEL_SERVICE_NAME"); n != "" {
		return n
	}
	return "transferconsumer"
}
