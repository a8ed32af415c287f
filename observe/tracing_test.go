package observe

import (
	"strings"
	"testing"

	"transferconsumer/config"
)

// Traces are exported only when the standard variables ask for them;
// otherwise there is no tracer at all, so tracing costs nothing. An
// exporter or a protocol the service cannot use stops the start.
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
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, true, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, false,
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
	}
	for _, tt := range tests {
		for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
			"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
			t.Setenv(k, tt.env[k])
		}
		settings, err := config.LoadTracing()
		if (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%v: err %v; want an error naming %q", tt.env, err, tt.err)
		}
		if _, err := config.Load(); (err == nil) != (tt.err == "") {
			t.Errorf("%v: the configuration's load says %v: an unusable exporter or protocol must stop the start", tt.env, err)
		}
		if err != nil {
			continue
		}
		tracer, stop, err := NewTracer(t.Context(), settings)
		if err != nil || (tracer != nil) != tt.tracing {
			t.Errorf("%v: tracer %v, err %v; want tracing %v", tt.env, tracer != nil, err, tt.tracing)
		}
		if err := stop(t.Context()); err != nil {
			t.Errorf("%v: stop: %v", tt.env, err)
		}
	}
}
