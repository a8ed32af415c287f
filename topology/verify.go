package topology

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"transferconsumer/dlq"
)

// With DECLARE_TOPOLOGY=false the topology is someone else's, and a passive
// declare says only that a queue exists, never with which arguments. The
// management API does say: Verify compares what it answers with what the
// service needs, and says each difference as a Finding.

// Severity says what the service does about a finding.
type Severity string

const (
	// Warn: the service consumes, and says what differs.
	Warn Severity = "warn"
	// Refuse: consuming would lose an account's order or a dead letter,
	// so the queue (or every queue, when the dead-letter side is wrong) is
	// not consumed until it is fixed.
	Refuse Severity = "refuse"
)

// Finding is one way a topology made by others differs from what the
// service needs.
type Finding struct {
	Severity Severity
	Object   string // "queue transfers.3", "exchange transfers.dlx"
	Queue    string // the partition queue it stops, "" when it stops every queue or none
	Argument string // "x-single-active-consumer", "type", "exists", …
	Found    string
	Wanted   string
	Why      string // what goes wrong as it is
	Fix      string // what a person should do
}

func (f Finding) String() string {
	return fmt.Sprintf("%s: %s is %s, wanted %s: %s; to fix: %s", f.Object, f.Argument, f.Found, f.Wanted, f.Why, f.Fix)
}

// Observed is what the management API answered for the topology's
// objects: each queue's and exchange's JSON (GET /api/queues/{vhost}/{name},
// /api/exchanges/{vhost}/{name}), by name, nil for one that does not
// exist, and the dead-letter queue's bindings (GET …/{dlq}/bindings).
type Observed struct {
	Version     string // the broker's, e.g. "4.0.5"
	Queues      map[string][]byte
	Exchanges   map[string][]byte
	DLQBindings []byte
}

// managedQueue is the part of the management API's queue object Verify reads.
type managedQueue struct {
	Type      string         `json:"type"`
	Durable   bool           `json:"durable"`
	Arguments map[string]any `json:"arguments"`
	// A policy may set what an argument does not: delivery-limit,
	// dead-letter-exchange, dead-letter-strategy, overflow.
	Policy map[string]any `json:"effective_policy_definition"`
}

type managedExchange struct {
	Type    string `json:"type"`
	Durable bool   `json:"durable"`
}

type binding struct {
	Source string `json:"source"`
}

// setting returns the queue's value of argument "x-"+name, or of its
// policy's name, and whether either sets it.
func (q managedQueue) setting(name string) (any, bool) {
	if v, ok := q.Arguments["x-"+name]; ok {
		return v, true
	}
	v, ok := q.Policy[name]
	return v, ok
}

// Verify returns what differs between obs and what the service needs of
// t's objects, Refuse findings first. A Refuse finding with a Queue stops
// that queue; one without stops them all (the dead-letter side would drop
// letters).
func (t Spec) Verify(obs Observed) []Finding {
	var out []Finding
	add := func(f Finding) { out = append(out, f) }
	major, _ := dlq.BrokerVersion(obs.Version)
	major4 := major >= 4
	admin := "have an administrator run `transferconsumer topology` with this service's variables"

	// The dead-letter side: a letter must reach a queue that keeps it.
	dlx, dlqName := dlq.Exchange(t.Prefix), dlq.Queue(t.Prefix)
	if raw := obs.Exchanges[dlx]; raw == nil {
		add(Finding{Severity: Refuse, Object: "exchange " + dlx, Argument: "exists", Found: "missing", Wanted: "a fanout exchange",
			Why: "dead letters would be dropped", Fix: admin})
	} else if e, err := decodeJSON[managedExchange](raw); err != nil {
		add(unreadable("exchange "+dlx, err))
	} else if e.Type != "fanout" {
		add(Finding{Severity: Warn, Object: "exchange " + dlx, Argument: "type", Found: e.Type, Wanted: "fanout",
			Why: "a dead letter keeps its original routing key, which this type may not route to " + dlqName,
			Fix: "delete the exchange and " + admin})
	}
	if raw := obs.Queues[dlqName]; raw == nil {
		add(Finding{Severity: Refuse, Object: "queue " + dlqName, Argument: "exists", Found: "missing", Wanted: "a quorum queue bound to " + dlx,
			Why: "dead letters would be dropped", Fix: admin})
	} else if q, err := decodeJSON[managedQueue](raw); err != nil {
		add(unreadable("queue "+dlqName, err))
	} else {
		out = append(out, t.verifyDLQ(q, major4)...)
		if obs.DLQBindings != nil && !boundTo(obs.DLQBindings, dlx) {
			add(Finding{Severity: Refuse, Object: "queue " + dlqName, Argument: "binding", Found: "not bound to " + dlx, Wanted: "bound to " + dlx,
				Why: "dead letters would be unroutable and dropped", Fix: admin + ", or bind " + dlqName + " to " + dlx})
		}
	}

	// The hash exchange: producers' side, so it only warns.
	if raw := obs.Exchanges[t.Prefix]; raw == nil {
		add(Finding{Severity: Warn, Object: "exchange " + t.Prefix, Argument: "exists", Found: "missing", Wanted: "an x-consistent-hash exchange",
			Why: "producers cannot publish events", Fix: admin})
	} else if e, err := decodeJSON[managedExchange](raw); err != nil {
		add(unreadable("exchange "+t.Prefix, err))
	} else if e.Type != "x-consistent-hash" {
		add(Finding{Severity: Warn, Object: "exchange " + t.Prefix, Argument: "type", Found: e.Type, Wanted: "x-consistent-hash",
			Why: "one account's events may reach several queues, and then their order is not kept",
			Fix: "delete the exchange and " + admin})
	}

	for i := range t.Queues {
		name := t.Queue(i)
		raw := obs.Queues[name]
		if raw == nil {
			add(Finding{Severity: Refuse, Object: "queue " + name, Queue: name, Argument: "exists", Found: "missing", Wanted: "a quorum queue",
				Why: "there is nothing to consume", Fix: admin + ", or set QUEUE_COUNT to the queues there are"})
			continue
		}
		q, err := decodeJSON[managedQueue](raw)
		if err != nil {
			f := unreadable("queue "+name, err)
			f.Queue = name
			add(f)
			continue
		}
		out = append(out, t.verifyQueue(name, q, major4)...)
	}
	slices.SortStableFunc(out, func(a, b Finding) int {
		if a.Severity == b.Severity {
			return 0
		}
		if a.Severity == Refuse {
			return -1
		}
		return 1
	})
	return out
}

// verifyQueue checks one partition queue.
func (t Spec) verifyQueue(name string, q managedQueue, major4 bool) []Finding {
	var out []Finding
	object := "queue " + name
	redeclare := "drain and delete " + name + ", then have an administrator run `transferconsumer topology` with this service's variables"
	refuse := func(arg, found, wanted, why, fix string) {
		out = append(out, Finding{Severity: Refuse, Object: object, Queue: name, Argument: arg, Found: found, Wanted: wanted, Why: why, Fix: fix})
	}
	warn := func(arg, found, wanted, why, fix string) {
		out = append(out, Finding{Severity: Warn, Object: object, Argument: arg, Found: found, Wanted: wanted, Why: why, Fix: fix})
	}
	if q.Type != "quorum" {
		refuse("type", orNone(q.Type), "quorum",
			"a returned message would not keep its place and no delivery limit ends a crash loop, so an account's order would be lost", redeclare)
		return out // the other arguments are a quorum queue's
	}
	if v, _ := q.Arguments["x-single-active-consumer"].(bool); !v {
		refuse("x-single-active-consumer", show(q.Arguments["x-single-active-consumer"]), "true",
			"every replica would consume the queue at once, so an account's order would be lost", redeclare)
	}
	dlx := dlq.Exchange(t.Prefix)
	if v, ok := q.setting("dead-letter-exchange"); !ok || v != dlx {
		refuse("x-dead-letter-exchange", show(v), dlx,
			"a message the broker dead-letters (its delivery limit, or a copy the broker refused) would be dropped",
			redeclare+", or set a policy with dead-letter-exchange "+dlx)
	}
	limit, limited := q.setting("delivery-limit")
	n, isNumber := number(limit)
	wanted := fmt.Sprint(t.DeliveryLimit)
	switch {
	case !limited && !major4:
		refuse("x-delivery-limit", "none", wanted,
			"on RabbitMQ 3.x a queue without a limit puts a returned message at its tail, so an account's order would be lost, and a crash loop never ends",
			redeclare+", or set a policy with delivery-limit "+wanted)
	case !limited:
		warn("x-delivery-limit", "none (the broker's default, 20)", wanted,
			"a message is dead-lettered after 20 returns, not after DELIVERY_LIMIT", "set DELIVERY_LIMIT=20, or "+redeclare)
	case !isNumber:
		warn("x-delivery-limit", show(limit), wanted, "the limit cannot be read", redeclare)
	case n < 0:
		warn("x-delivery-limit", show(limit), wanted, "no limit: a message that crashes the service is delivered for ever", redeclare)
	case n != int64(t.DeliveryLimit):
		warn("x-delivery-limit", show(limit), wanted,
			"a message is dead-lettered after "+show(limit)+" returns, not after DELIVERY_LIMIT",
			"set DELIVERY_LIMIT="+show(limit)+", or "+redeclare)
	}
	if v, _ := q.setting("dead-letter-strategy"); v != "at-least-once" {
		warn("x-dead-letter-strategy", show(v), "at-least-once",
			"the broker's own dead-lettering is at most once: a letter it moves while the DLQ is unavailable is lost",
			redeclare+", or set a policy with dead-letter-strategy at-least-once and overflow reject-publish")
	} else if v, _ := q.setting("overflow"); v != "reject-publish" {
		warn("x-overflow", show(v), "reject-publish",
			"without it the broker falls back to at-most-once dead-lettering, without a word",
			redeclare+", or set a policy with overflow reject-publish")
	}
	return out
}

// verifyDLQ checks the dead-letter queue: it must keep every letter until
// someone acts.
func (t Spec) verifyDLQ(q managedQueue, major4 bool) []Finding {
	var out []Finding
	name := dlq.Queue(t.Prefix)
	object := "queue " + name
	redeclare := "move its letters elsewhere, delete " + name + ", then have an administrator run `transferconsumer topology` with this service's variables"
	if q.Type != "quorum" {
		out = append(out, Finding{Severity: Warn, Object: object, Argument: "type", Found: orNone(q.Type), Wanted: "quorum",
			Why: "letters are not replicated as the partition queues' are", Fix: redeclare})
	}
	if q.Type == "quorum" {
		limit, limited := q.setting("delivery-limit")
		n, _ := number(limit)
		switch {
		case major4 && (!limited || n >= 0):
			found := show(limit)
			if !limited {
				found = "none (the broker's default, 20)"
			}
			out = append(out, Finding{Severity: Refuse, Object: object, Argument: "x-delivery-limit", Found: found, Wanted: "-1",
				Why: "on RabbitMQ 4.x a letter returned that many times (looking at it in the UI, `dlq list`) is dropped",
				Fix: redeclare + ", or set a policy on it with delivery-limit -1"})
		case !major4 && limited:
			out = append(out, Finding{Severity: Refuse, Object: object, Argument: "x-delivery-limit", Found: show(limit), Wanted: "none",
				Why: "a letter returned that many times (looking at it in the UI, `dlq list`) is dropped", Fix: redeclare})
		}
	}
	for _, arg := range []string{"message-ttl", "max-length", "max-length-bytes", "expires"} {
		if v, ok := q.setting(arg); ok {
			out = append(out, Finding{Severity: Refuse, Object: object, Argument: "x-" + arg, Found: show(v), Wanted: "none",
				Why: "letters would be dropped before anyone acts", Fix: redeclare + ", or remove the policy that sets it"})
		}
	}
	return out
}

func boundTo(bindings []byte, exchange string) bool {
	var bs []binding
	if json.Unmarshal(bindings, &bs) != nil {
		return true // not known to be wrong
	}
	for _, b := range bs {
		if b.Source == exchange {
			return true
		}
	}
	return false
}

func unreadable(object string, err error) Finding {
	return Finding{Severity: Warn, Object: object, Argument: "definition", Found: "unreadable (" + err.Error() + ")",
		Wanted: "the management API's JSON", Why: "its arguments could not be checked", Fix: "check MANAGEMENT_URL"}
}

func decodeJSON[T any](raw []byte) (T, error) {
	var v T
	err := json.Unmarshal(raw, &v)
	return v, err
}

// number returns v as a whole number: the API's JSON numbers are float64.
func number(v any) (int64, bool) {
	switch n := v.(type) {
	case float64:
		if n == math.Trunc(n) {
			return int64(n), true
		}
	case int64:
		return n, true
	case int:
		return int64(n), true
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	}
	return 0, false
}

func show(v any) string {
	if v == nil {
		return "none"
	}
	if n, ok := number(v); ok {
		return fmt.Sprint(n)
	}
	return fmt.Sprint(v)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// Stopped returns the partition queues findings keep from being consumed,
// and whether one keeps every queue from it.
func Stopped(findings []Finding) (queues []string, all bool) {
	for _, f := range findings {
		if f.Severity != Refuse {
			continue
		}
		if f.Queue == "" {
			all = true
		} else if !slices.Contains(queues, f.Queue) {
			queues = append(queues, f.Queue)
		}
	}
	return queues, all
}
