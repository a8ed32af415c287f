package topology

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The reasons below are what RabbitMQ 3.10.8 answers.
func TestTranslateDeclareError(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		topology bool
		mentions []string
	}{
		{"plugin missing", &amqp.Error{Code: amqp.CommandInvalid,
			Reason: "COMMAND_INVALID - unknown exchange type 'x-consistent-hash'"},
			true, []string{"exchange transfers", "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange"}},
		{"plugin disabled after exchanges of its type existed", &amqp.Error{Code: amqp.CommandInvalid,
			Reason: "COMMAND_INVALID - invalid exchange type 'x-consistent-hash'"},
			true, []string{"rabbitmq-plugins enable rabbitmq_consistent_hash_exchange"}},
		{"queue with other arguments", &amqp.Error{Code: amqp.PreconditionFailed,
			Reason: "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'transfers.3' in vhost '/': received the value '5' of type 'signedint' but current is none"},
			true, []string{"queue transfers.3", "x-delivery-limit", "DECLARE_TOPOLOGY"}},
		{"no permission", &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED"},
			true, []string{"DECLARE_TOPOLOGY=false", "transferconsumer topology",
				`configure '^$', write '^transfers\.dl[xq]$', read '^transfers\.[0-9]+$'`,
				`configure '^transfers(\.dlx|\.dlq|\.[0-9]+)?$', write '^transfers\.(dlx|dlq|[0-9]+)$', read '^transfers(\.dlx|\.[0-9]+)?$'`}},
		{"connection lost", amqp.ErrClosed, false, []string{"declare exchange transfers"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Spec{Prefix: "transfers"}.translateDeclareError("exchange transfers", tt.err)
			var te *Error
			if errors.As(err, &te) != tt.topology {
				t.Errorf("Error = %v, want %v: %v", !tt.topology, tt.topology, err)
			}
			for _, m := range tt.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("%q does not mention %q", err, m)
				}
			}
		})
	}
}

func TestQueueArgs(t *testing.T) {
	args := Spec{Prefix: "p", Queues: 2, DeliveryLimit: 7}.QueueArgs()
	want := map[string]any{
		"x-queue-type": "quorum", "x-single-active-consumer": true, "x-delivery-limit": int64(7),
		"x-dead-letter-exchange": "p.dlx", "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
	}
	for k, v := range want {
		if args[k] != v {
			t.Errorf("%s = %v, want %v", k, args[k], v)
		}
	}
}

// The grants follow TOPOLOGY_PREFIX, its dots escaped, and match the
// names they are for and no other.
func TestLeastGrantsFollowThePrefix(t *testing.T) {
	for _, declare := range []bool{false, true} {
		g := LeastGrants("a.b", declare)
		match := func(re, name string) bool { return regexp.MustCompile(re).MatchString(name) }
		for _, name := range []string{"a.b.0", "a.b.17"} {
			if !match(g.Read, name) {
				t.Errorf("declare %v: read %s does not match %s", declare, g.Read, name)
			}
		}
		if !match(g.Write, "a.b.dlx") {
			t.Errorf("declare %v: write %s does not match a.b.dlx", declare, g.Write)
		}
		for _, name := range []string{"aXb.0", "a.b.dlq.x", "other.0", "a.b.dlxx", "a.b"} {
			if match(g.Read, name) && (!declare || name != "a.b") {
				t.Errorf("declare %v: read %s matches %s", declare, g.Read, name)
			}
		}
		if !declare && g.Configure != "^$" {
			t.Errorf("without declaring, configure is %s, want ^$", g.Configure)
		}
	}
}
