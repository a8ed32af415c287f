package topology

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// The JSON below is the shape RabbitMQ 3.10.8, 4.0.5 and 4.3.6 answer for
// GET /api/queues/{vhost}/{name} and /api/exchanges/{vhost}/{name}.
func TestVerify(t *testing.T) {
	top := Spec{Prefix: "transfers", Queues: 2, DeliveryLimit: 10}
	queue := func(typ string, args map[string]any) []byte {
		b, _ := json.Marshal(map[string]any{"name": "q", "type": typ, "durable": true, "arguments": args,
			"effective_policy_definition": nil})
		return b
	}
	work := func(edit func(map[string]any)) []byte {
		args := map[string]any{}
		for k, v := range top.QueueArgs() {
			args[k] = v
		}
		if edit != nil {
			edit(args)
		}
		return queue("quorum", args)
	}
	exchange := func(typ string) []byte {
		return []byte(`{"name":"x","type":"` + typ + `","durable":true,"arguments":{}}`)
	}
	bound := []byte(`[{"source":"","destination":"transfers.dlq"},{"source":"transfers.dlx","destination":"transfers.dlq","routing_key":""}]`)
	good := func(version string) Observed {
		dlqArgs := map[string]any{"x-queue-type": "quorum"}
		if strings.HasPrefix(version, "4") {
			dlqArgs["x-delivery-limit"] = -1
		}
		return Observed{Version: version,
			Queues: map[string][]byte{"transfers.0": work(nil), "transfers.1": work(nil),
				"transfers.dlq": queue("quorum", dlqArgs)},
			Exchanges:   map[string][]byte{"transfers": exchange("x-consistent-hash"), "transfers.dlx": exchange("fanout")},
			DLQBindings: bound,
		}
	}
	type want struct {
		severity Severity
		object   string
		argument string
		found    string
	}
	tests := []struct {
		name    string
		version string
		edit    func(*Observed)
		want    []want
		stopped []string
		all     bool
	}{
		{"as declared, 3.10", "3.10.8", nil, nil, nil, false},
		{"as declared, 4.0", "4.0.5", nil, nil, nil, false},
		{"as declared, 4.3", "4.3.6", nil, nil, nil, false},
		{"without single active consumer", "4.3.6", func(o *Observed) {
			o.Queues["transfers.1"] = work(func(a map[string]any) { delete(a, "x-single-active-consumer") })
		}, []want{{Refuse, "queue transfers.1", "x-single-active-consumer", "none"}}, []string{"transfers.1"}, false},
		{"a classic queue", "3.10.8", func(o *Observed) {
			o.Queues["transfers.0"] = queue("classic", map[string]any{"x-dead-letter-exchange": "transfers.dlx"})
		}, []want{{Refuse, "queue transfers.0", "type", "classic"}}, []string{"transfers.0"}, false},
		{"a missing queue", "3.10.8", func(o *Observed) { delete(o.Queues, "transfers.1") },
			[]want{{Refuse, "queue transfers.1", "exists", "missing"}}, []string{"transfers.1"}, false},
		{"another dead-letter exchange", "4.0.5", func(o *Observed) {
			o.Queues["transfers.0"] = work(func(a map[string]any) { a["x-dead-letter-exchange"] = "elsewhere" })
		}, []want{{Refuse, "queue transfers.0", "x-dead-letter-exchange", "elsewhere"}}, []string{"transfers.0"}, false},
		{"the dead-letter exchange from a policy", "4.0.5", func(o *Observed) {
			b, _ := json.Marshal(map[string]any{"type": "quorum", "arguments": map[string]any{"x-single-active-consumer": true, "x-delivery-limit": 10,
				"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"},
				"effective_policy_definition": map[string]any{"dead-letter-exchange": "transfers.dlx"}})
			o.Queues["transfers.0"] = b
		}, nil, nil, false},
		{"another delivery limit", "3.10.8", func(o *Observed) {
			o.Queues["transfers.0"] = work(func(a map[string]any) { a["x-delivery-limit"] = 5 })
		}, []want{{Warn, "queue transfers.0", "x-delivery-limit", "5"}}, nil, false},
		{"no delivery limit on 3.x", "3.10.8", func(o *Observed) {
			o.Queues["transfers.0"] = work(func(a map[string]any) { delete(a, "x-delivery-limit") })
		}, []want{{Refuse, "queue transfers.0", "x-delivery-limit", "none"}}, []string{"transfers.0"}, false},
		{"no delivery limit on 4.x: the default 20", "4.3.6", func(o *Observed) {
			o.Queues["transfers.0"] = work(func(a map[string]any) { delete(a, "x-delivery-limit") })
		}, []want{{Warn, "queue transfers.0", "x-delivery-limit", "none (the broker's default, 20)"}}, nil, false},
		{"at-most-once dead-lettering", "4.0.5", func(o *Observed) {
			o.Queues["transfers.1"] = work(func(a map[string]any) { delete(a, "x-dead-letter-strategy"); delete(a, "x-overflow") })
		}, []want{{Warn, "queue transfers.1", "x-dead-letter-strategy", "none"}}, nil, false},
		{"at-least-once without reject-publish", "4.0.5", func(o *Observed) {
			o.Queues["transfers.1"] = work(func(a map[string]any) { delete(a, "x-overflow") })
		}, []want{{Warn, "queue transfers.1", "x-overflow", "none"}}, nil, false},
		{"a DLQ without the -1 limit on 4.x", "4.3.6", func(o *Observed) {
			o.Queues["transfers.dlq"] = queue("quorum", map[string]any{"x-queue-type": "quorum"})
		}, []want{{Refuse, "queue transfers.dlq", "x-delivery-limit", "none (the broker's default, 20)"}}, nil, true},
		{"a DLQ with -1 on 3.x drops at the first return", "3.10.8", func(o *Observed) {
			o.Queues["transfers.dlq"] = queue("quorum", map[string]any{"x-delivery-limit": -1})
		}, []want{{Refuse, "queue transfers.dlq", "x-delivery-limit", "-1"}}, nil, true},
		{"a DLQ with a TTL", "3.10.8", func(o *Observed) {
			o.Queues["transfers.dlq"] = queue("quorum", map[string]any{"x-message-ttl": 60000})
		}, []want{{Refuse, "queue transfers.dlq", "x-message-ttl", "60000"}}, nil, true},
		{"a classic DLQ", "3.10.8", func(o *Observed) { o.Queues["transfers.dlq"] = queue("classic", nil) },
			[]want{{Warn, "queue transfers.dlq", "type", "classic"}}, nil, false},
		{"no DLQ", "4.0.5", func(o *Observed) { delete(o.Queues, "transfers.dlq") },
			[]want{{Refuse, "queue transfers.dlq", "exists", "missing"}}, nil, true},
		{"a DLQ not bound to the DLX", "4.0.5", func(o *Observed) { o.DLQBindings = []byte(`[{"source":""}]`) },
			[]want{{Refuse, "queue transfers.dlq", "binding", "not bound to transfers.dlx"}}, nil, true},
		{"no DLX", "4.0.5", func(o *Observed) { delete(o.Exchanges, "transfers.dlx") },
			[]want{{Refuse, "exchange transfers.dlx", "exists", "missing"}}, nil, true},
		{"a direct hash exchange", "4.0.5", func(o *Observed) { o.Exchanges["transfers"] = exchange("direct") },
			[]want{{Warn, "exchange transfers", "type", "direct"}}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs := good(tt.version)
			if tt.edit != nil {
				tt.edit(&obs)
			}
			got := top.Verify(obs)
			var gotW []want
			for _, f := range got {
				gotW = append(gotW, want{f.Severity, f.Object, f.Argument, f.Found})
				if f.Wanted == "" || f.Why == "" || f.Fix == "" {
					t.Errorf("%+v does not say what is wanted, why and how to fix it", f)
				}
			}
			if !slices.Equal(gotW, tt.want) {
				t.Errorf("findings %+v, want %+v", gotW, tt.want)
			}
			stopped, all := Stopped(got)
			if !slices.Equal(stopped, tt.stopped) || all != tt.all {
				t.Errorf("Stopped = %v, %v; want %v, %v", stopped, all, tt.stopped, tt.all)
			}
		})
	}
}
