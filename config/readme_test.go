package config

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// readmeTable returns the rows of the README's configuration table: each
// variable its row names, with the default the row gives it ("" for
// unset), and the row's meaning.
func readmeTable(t *testing.T) (defaults, meanings map[string]string) {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Configuration\n")
	if !ok {
		t.Fatal(`README.md has no "## Configuration" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, table, ok := strings.Cut(section, "\n| Variable | Default | Meaning |\n|---|---|---|\n")
	if !ok {
		t.Fatal("README.md's configuration section has no table of variables")
	}
	code := regexp.MustCompile("`([^`]*)`")
	defaults, meanings = map[string]string{}, map[string]string{}
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 3 {
			t.Fatalf("a row of README.md's configuration table without three cells: %s", line)
		}
		var names []string
		for _, m := range code.FindAllStringSubmatch(cells[0], -1) {
			names = append(names, m[1])
		}
		// One default per name, in its order; the first code span of each
		// comma-separated part is the value, the rest says more about it.
		var values []string
		if !strings.HasPrefix(strings.TrimSpace(cells[1]), "unset") {
			for _, part := range strings.SplitN(cells[1], ", ", len(names)) {
				m := code.FindStringSubmatch(part)
				if m == nil {
					t.Fatalf("README.md's default %q for %v is neither unset nor in code", cells[1], names)
				}
				values = append(values, m[1])
			}
		}
		if len(values) != 0 && len(values) != len(names) {
			t.Fatalf("README.md gives %v the defaults %q: one for each, or unset", names, cells[1])
		}
		for i, name := range names {
			if _, dup := defaults[name]; dup {
				t.Errorf("README.md's configuration table names %s twice", name)
			}
			defaults[name], meanings[name] = "", cells[2]
			if len(values) > 0 {
				defaults[name] = values[i]
			}
		}
	}
	return defaults, meanings
}

// computed are the variables without a default value whose default the
// service computes when they are unset; the README shows what it computes.
var computed = map[string]string{"INSTANCE_NAME": "HOSTNAME-PID"}

// The README's configuration table names every variable the service reads,
// Config's and the standard ones (GOGC, OpenTelemetry's), with the default
// the service uses, and none it does not read.
func TestREADMEConfigurationTableMatchesTheConfiguration(t *testing.T) {
	documented, _ := readmeTable(t)
	want := map[string]string{}
	fields := reflect.TypeFor[Config]()
	for i := range fields.NumField() {
		f := fields.Field(i)
		name := f.Tag.Get("envconfig")
		want[name] = f.Tag.Get("default")
		if c, ok := computed[name]; ok {
			if want[name] != "" {
				t.Errorf("%s has the default %q and is in computed", name, want[name])
			}
			want[name] = c
		}
	}
	for _, v := range Standard() {
		want[v.Name] = v.Default
	}
	for name, def := range want {
		got, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("README.md's configuration table does not name %s (default %q)", name, def)
		case got != def:
			t.Errorf("README.md says %s defaults to %q; the service uses %q", name, got, def)
		}
	}
	for name := range documented {
		if _, ok := want[name]; !ok {
			t.Errorf("README.md's configuration table names %s, which the service does not read", name)
		}
	}
}

// Every OpenTelemetry variable the code names is one Standard lists, so the
// test above holds the README to it; and the README says that a protocol
// the service cannot speak stops the start, as Load makes it.
func TestEveryOpenTelemetryVariableIsDocumented(t *testing.T) {
	var standard []string
	for _, v := range Standard() {
		standard = append(standard, v.Name)
	}
	otel := regexp.MustCompile(`"(OTEL_[A-Z_]+)"`)
	var read []string
	for _, dir := range []string{".", "../observe", "../consumer", "../cli"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range otel.FindAllStringSubmatch(string(b), -1) {
				read = append(read, m[1])
				if !slices.Contains(standard, m[1]) {
					t.Errorf("%s reads %s, which Standard (and so --help and the README) does not list", f, m[1])
				}
			}
		}
	}
	if !slices.Contains(read, "OTEL_SERVICE_NAME") || !slices.Contains(read, "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Errorf("the scan found only %v: it looks in the wrong places", read)
	}

	_, meanings := readmeTable(t)
	for _, name := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_EXPORTER"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, "grpc")
			t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
			if name == "OTEL_TRACES_EXPORTER" {
				t.Setenv(name, "zipkin")
			}
			if _, err := Load(); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s unsupported: Load = %v, want an error naming it", name, err)
			}
			documented := meanings[name] + " " + meanings[strings.Replace(name, "TRACES_", "", 1)]
			if !strings.Contains(documented, "stops the start") {
				t.Errorf("README.md does not say that an unsupported %s stops the start: %q", name, meanings[name])
			}
		})
	}
}
