package config

import (
	"fmt"
	"os"
)

// Tracing is what OpenTelemetry's standard variables ask of tracing. The
// service reads the variables in otelVariables itself; the OTLP/HTTP
// exporter reads those and the rest of OTEL_EXPORTER_OTLP_* (headers,
// timeout, certificates, compression) on its own.
type Tracing struct {
	On          bool   // spans go out over OTLP/HTTP, in batches
	ServiceName string // service.name of the spans
}

// defaultServiceName is OTEL_SERVICE_NAME's default.
const defaultServiceName = "transferconsumer"

// otelProtocol is the one OTLP protocol the exporter speaks.
const otelProtocol = "http/protobuf"

// otelVariables are the OpenTelemetry variables the service reads, with
// their defaults ("" when unset means off or the exporter's own), in the
// order --help lists them.
var otelVariables = []Variable{
	{"OTEL_TRACES_EXPORTER", "", "otlp to trace (with the exporter's defaults), none to never trace; any other value stops the start"},
	{"OTEL_EXPORTER_OTLP_ENDPOINT", "", "OTLP/HTTP endpoint; when set (and OTEL_TRACES_EXPORTER is not none), each delivery and transaction is traced"},
	{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "", "the same, for traces alone; it wins over OTEL_EXPORTER_OTLP_ENDPOINT"},
	{"OTEL_EXPORTER_OTLP_PROTOCOL", otelProtocol, "only " + otelProtocol + " is supported: any other value stops the start"},
	{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", otelProtocol, "the same, for traces alone"},
	{"OTEL_SERVICE_NAME", defaultServiceName, "service.name of the spans"},
}

// LoadTracing reads OpenTelemetry's variables: traces go out with
// OTEL_TRACES_EXPORTER=otlp, or when it is unset and an endpoint is set;
// never with none. An exporter or a protocol the service does not support
// is an error naming the variable, and stops the start (Load checks it).
func LoadTracing() (Tracing, error) {
	t := Tracing{ServiceName: os.Getenv("OTEL_SERVICE_NAME")}
	if t.ServiceName == "" {
		t.ServiceName = defaultServiceName
	}
	switch exporter := os.Getenv("OTEL_TRACES_EXPORTER"); exporter {
	case "none":
		return t, nil
	case "otlp":
		t.On = true
	case "":
		t.On = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	default:
		return t, fmt.Errorf("configuration: OTEL_TRACES_EXPORTER: %q is not supported; use otlp or none", exporter)
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		if p := os.Getenv(v); p != "" && p != otelProtocol {
			return t, fmt.Errorf("configuration: %s: %q is not supported; use %s", v, p, otelProtocol)
		}
	}
	return t, nil
}
