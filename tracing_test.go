package main

import (
	"strings"
	"testing"
)

// Traces are exported only when the standard variables ask for them;
// otherwise there is no tracer at all, so tracing costs nothing.
func TestTracerOnlyWhenAskedFor(t *testing.T) {
	tests := []struct {
		env     map[string]string
		tracing bool
		err     string
	}{
		{map[string]string{}, false, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, false, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false, "OTEL_EXPORTER_OTLP_PROTOCOL"},
	}
	for _, tt := range tests {
		for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
			t.Setenv(k, tt.env[k])
		}
		tracer, stop, err := newTracer(t.Context())
		if (tracer != nil) != tt.tracing || (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%v: tracer %v, err %v; want tracing %v, error naming %q", tt.env, tracer != nil, err, tt.tracing, tt.err)
		}
		if err := stop(t.Context()); err != nil {
			t.Errorf("%v: stop: %v", tt.env, err)
		}
	}
}
