package cli

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"transferconsumer/dlq"
)

// run runs the command line args as the binary does, but for the service
// itself (the run command), which it refuses.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return App{Migrations: os.DirFS("../sql"), Stdin: os.Stdin, Stdout: stdout, Stderr: stderr}.Run(ctx, args)
}

// --help names every command, then lists the variables.
func TestHelpNamesEveryCommand(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"--help"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"migrate", "topology", "prune", "repartition", "dlq list", "dlq replay", "dlq drop", "reconcile"} {
		if !strings.Contains(out.String(), "  "+cmd) {
			t.Errorf("--help does not mention the command %s", cmd)
		}
	}
	if !strings.Contains(out.String(), "\nVARIABLE ") {
		t.Errorf("--help has no table of variables:\n%s", out.String())
	}
}

func TestUnknownCommandFails(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"frobnicate"}, &out, &out); err == nil || !strings.Contains(err.Error(), "frobnicate") {
		t.Errorf("got %v", err)
	}
}

// noBroker makes any attempt to load the configuration or reach the broker
// fail, so that what passes needed neither.
func noBroker(t *testing.T) {
	t.Setenv("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")
	t.Setenv("QUEUE_COUNT", "0")
}

func TestDLQHelpNeedsNoBroker(t *testing.T) {
	noBroker(t)
	tests := []struct {
		args  []string
		flags bool // the subcommand's flags are listed too
	}{
		{[]string{"dlq", "--help"}, false},
		{[]string{"dlq", "-h"}, false},
		{[]string{"dlq", "-help"}, false},
		{[]string{"dlq", "help"}, false},
		{[]string{"dlq", "list", "--help"}, true},
		{[]string{"dlq", "list", "-h"}, true},
		{[]string{"dlq", "replay", "--help"}, true},
		{[]string{"dlq", "replay", "--class", "poison", "-h"}, true},
		{[]string{"dlq", "drop", "--help"}, true},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if err := run(t.Context(), tt.args, &stdout, &stderr); err != nil {
				t.Fatalf("exit with %v, want 0", err)
			}
			out := stdout.String()
			if !strings.Contains(out, "Usage:") || !strings.Contains(out, "dlq replay [--class C]") {
				t.Errorf("stdout is not the usage:\n%s", out)
			}
			if got := strings.Contains(out, "Flags of dlq"); got != tt.flags {
				t.Errorf("flags listed: %v, want %v:\n%s", got, tt.flags, out)
			}
			if stderr.Len() > 0 {
				t.Errorf("stderr: %s", stderr.String())
			}
		})
	}
}

func TestDLQRejectsWrongArgumentsBeforeConnecting(t *testing.T) {
	noBroker(t)
	tests := []struct {
		args  []string
		want  []string
		usage bool
	}{
		{[]string{"dlq"}, []string{"dlq needs list, replay or drop"}, true},
		{[]string{"dlq", "frobnicate"}, []string{`unknown dlq command "frobnicate"`}, true},
		{[]string{"dlq", "list", "extra"}, []string{`dlq list takes no arguments, got ["extra"]`}, true},
		{[]string{"dlq", "replay", "--dry-run", "poison"}, []string{"dlq replay takes no arguments"}, true},
		{[]string{"dlq", "replay", "--bogus"}, []string{"dlq replay: flag provided but not defined: -bogus"}, true},
		{[]string{"dlq", "list", "-n", "many"}, []string{"dlq list:", `invalid value "many"`}, true},
		{[]string{"dlq", "list", "-n", "-1"}, []string{"-n must not be negative"}, true},
		{[]string{"dlq", "replay", "--limit", "-1"}, []string{"--limit must not be negative"}, true},
		{[]string{"dlq", "replay", "--class", "bogus"}, append([]string{`--class "bogus" is not a class`}, dlq.Classes()...), false},
		{[]string{"dlq", "replay", "--class", "Poison"}, []string{`--class "Poison" is not a class`}, false},
		{[]string{"dlq", "drop"}, []string{"dlq drop: --record FILE is required", "--record - writes to stdout"}, true},
		{[]string{"dlq", "drop", "--yes", "--class", "poison"}, []string{"--record FILE is required"}, true},
		{[]string{"dlq", "drop", "--record"}, []string{"dlq drop: flag needs an argument: -record"}, true},
		{[]string{"dlq", "drop", "--record", "r.jsonl", "poison"}, []string{"dlq drop takes no arguments"}, true},
		{[]string{"dlq", "drop", "--record", "r.jsonl", "--limit", "-2"}, []string{"dlq drop: --limit must not be negative"}, true},
		{[]string{"dlq", "drop", "--record", "r.jsonl", "--class", "bogus"},
			append([]string{`dlq drop: --class "bogus" is not a class`}, dlq.Classes()...), false},
		{[]string{"dlq", "drop", "--dry-run", "--include-older-than-ttl"},
			[]string{"dlq drop: flag provided but not defined: -include-older-than-ttl"}, true},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tt.args, &stdout, &stderr)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
			if got := strings.Contains(err.Error(), "Usage:"); got != tt.usage {
				t.Errorf("usage in the error: %v, want %v", got, tt.usage)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout: %s", stdout.String())
			}
		})
	}
}

// Every class a dead letter can have is accepted and named in the usage.
func TestDLQReplayAcceptsEveryClass(t *testing.T) {
	for _, class := range dlq.Classes() {
		a, err := parseDLQ([]string{"replay", "--class", class, "--limit", "3", "--dry-run"}, nil)
		if err != nil || a.filter.Class != class || a.limit != 3 || !a.dryRun {
			t.Errorf("--class %s: %+v, %v", class, a, err)
		}
		if !strings.Contains(dlqUsage, class) {
			t.Errorf("the usage does not name class %s", class)
		}
	}
}

// migrate's help and a wrong use of its flags need neither the
// configuration nor the database.
func TestMigrateArgumentsNeedNoDatabase(t *testing.T) {
	noBroker(t)
	tests := []struct {
		args []string
		want string // in the error; "" for the help, which succeeds
	}{
		{[]string{"migrate", "--help"}, ""},
		{[]string{"migrate", "-h"}, ""},
		{[]string{"migrate", "--grant-to"}, "migrate: flag needs an argument: -grant-to"},
		{[]string{"migrate", "--grant-to", ""}, "migrate: --grant-to needs a role"},
		{[]string{"migrate", "--grant-to", "svc", "extra"}, `migrate takes no arguments, got ["extra"]`},
		{[]string{"migrate", "--bogus"}, "migrate: flag provided but not defined: -bogus"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tt.args, &stdout, &stderr)
			if tt.want == "" {
				if err != nil || !strings.Contains(stdout.String(), "--grant-to ROLE then grants ROLE") {
					t.Errorf("exit with %v, want 0 and the usage; stdout:\n%s", err, stdout.String())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "Usage: transferconsumer migrate") {
				t.Errorf("got %v, want %q and the usage", err, tt.want)
			}
		})
	}
	// The role is taken as it is given: a name PostgreSQL folds to lower
	// case unquoted is quoted, and so kept.
	if role, err := parseMigrate([]string{"--grant-to", "Svc Role"}, nil); err != nil || role != "Svc Role" {
		t.Errorf("parseMigrate = %q, %v", role, err)
	}
}

// repartition --help says what each flag does and its default.
func TestRepartitionHelpSaysWhatTheDrainTimeoutDoes(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"repartition", "--help"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--to N", "--drain-timeout D", "default 10m", "running it\n                      again"} {
		if !strings.Contains(stdout.String(), strings.ReplaceAll(want, "\\n", "\n")) {
			t.Errorf("repartition --help does not say %q:\n%s", want, stdout.String())
		}
	}
}

// repartition's wrong arguments are said with its usage, before it
// connects anywhere.
func TestRepartitionRejectsWrongArgumentsBeforeConnecting(t *testing.T) {
	noBroker(t)
	t.Setenv("QUEUE_COUNT", "8")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"repartition", "--to"}, "repartition: flag needs an argument: -to"},
		{[]string{"repartition", "--to", "12", "now"}, `repartition takes no arguments, got ["now"]`},
		{[]string{"repartition", "--to", "4"}, "--to must be above QUEUE_COUNT=8"},
	} {
		err := run(t.Context(), tt.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want it to say %q", tt.args, err, tt.want)
		}
	}
}
