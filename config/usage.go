package config

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/kelseyhightower/envconfig"
)

// DefaultGCPercent is the garbage collector's target when GOGC is not set.
// The service's live heap is about a megabyte, under the runtime's 4 MB
// minimum, so at Go's default of 100 it collects every 4 MB allocated,
// about every 600 events; each cycle scans the same globals and goroutine
// stacks, which makes the cost per cycle nearly fixed. At 400 the heap may
// grow to 16 MB between cycles (peak RSS about 30 MiB at 32 queues instead
// of 21) and a quarter of the cycles run (BENCHMARKS.md).
const DefaultGCPercent = 400

// Variable is one environment variable the service reads that is not a
// field of Config: the Go runtime's GOGC and OpenTelemetry's.
type Variable struct {
	Name, Default, Meaning string
}

// Standard returns the variables the service reads beyond Config's, with
// their defaults ("" for unset), in the order --help lists them.
func Standard() []Variable {
	// GOGC is the Go runtime's, not a field: main sets DefaultGCPercent only
	// when it is unset.
	gogc := Variable{"GOGC", fmt.Sprint(DefaultGCPercent),
		"Go's garbage-collection target, in percent of the live heap, set by the service when GOGC is unset; the service's heap is small, " +
			"so this trades about 12 MiB of memory for a quarter of the collections (BENCHMARKS.md)"}
	return append([]Variable{gogc}, otelVariables...)
}

// PrintUsage writes the table of every variable, with its default and
// meaning, to w.
func PrintUsage(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	const format = "Environment variables:\n\n" +
		"VARIABLE\tDEFAULT\tMEANING\n" +
		"{{range .}}{{usage_key .}}\t{{usage_default .}}\t{{usage_description .}}\n{{end}}"
	if err := envconfig.Usagef("", &Config{}, tw, format); err != nil {
		return err
	}
	for _, v := range Standard() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Name, v.Default, v.Meaning)
	}
	fmt.Fprintln(tw)
	return tw.Flush()
}
