package consumer

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
	"transferconsumer/event"
)

// Producers is the allow-list of the broker users whose events may move
// money (PRODUCERS), with the users whose replays keep the first producer
// (REPLAYERS). RabbitMQ refuses a publish whose user_id property is not the
// publishing connection's user, so a user_id that is set names its
// publisher; a replaying user's message names the first producer in its
// x-original-user-id header instead (adr/0008). A nil *Producers, like an
// empty PRODUCERS, accepts any publisher, as the service did before it had
// the list.
type Producers struct {
	allowed   map[string]bool
	replayers map[string]bool
}

// NewProducers returns the allow-list from the comma-separated user names
// of PRODUCERS and REPLAYERS (spaces around a name and empty names are
// ignored; names are case-sensitive, as the broker's are). It returns an
// error for a user in both lists: a replaying user's messages are judged by
// the producer they name, so one that also produced could send its own
// events without one.
func NewProducers(producers, replayers string) (*Producers, error) {
	p := &Producers{allowed: names(producers), replayers: names(replayers)}
	for u := range p.replayers {
		if p.allowed[u] {
			return nil, fmt.Errorf("user %q is in both PRODUCERS and REPLAYERS: a replaying user must not also produce (adr/0008)", u)
		}
	}
	return p, nil
}

func names(list string) map[string]bool {
	m := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			m[n] = true
		}
	}
	return m
}

// AcceptsAny reports whether any publisher is accepted: PRODUCERS is empty.
func (p *Producers) AcceptsAny() bool { return p == nil || len(p.allowed) == 0 }

// Replayer reports whether user is one of REPLAYERS.
func (p *Producers) Replayer(user string) bool { return p != nil && p.replayers[user] }

// Log says once, at start, whom the service accepts events from.
func (p *Producers) Log(log *slog.Logger) {
	if p.AcceptsAny() {
		log.Warn("PRODUCERS is empty: events from any publisher are applied (adr/0008)",
			"replayers", sorted(p.replayersOrNil()))
		return
	}
	log.Info("events are applied only from the producers listed",
		"producers", sorted(p.allowed), "replayers", sorted(p.replayers))
}

func (p *Producers) replayersOrNil() map[string]bool {
	if p == nil {
		return nil
	}
	return p.replayers
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Admit judges a delivery by its user_id property and its headers. It
// returns the headers with x-original-user-id set to the first producer it
// found, or removed when it found none, so that every dead-letter copy of
// the message carries the producer the service judged (a header the
// publisher set is never passed on as it came). headers is changed in
// place, not copied: it is the delivery's own, decoded for it alone, and
// Admit runs on every delivery. The error is nil when PRODUCERS is empty or lists the first
// producer, else Unauthorized, naming the producer or saying that none is
// known: the message is dead-lettered and never applied.
func (p *Producers) Admit(userID string, headers amqp.Table) (amqp.Table, error) {
	producer, by := dlq.FirstProducer(userID, headers, p.Replayer)
	out := stamp(headers, producer)
	if p.AcceptsAny() || p.allowed[producer] {
		return out, nil
	}
	switch {
	case by == "" && producer == "":
		return out, event.Unauthorized(fmt.Errorf("no user_id property: the publisher is unknown, and only the users in PRODUCERS may publish transfers"))
	case by == "":
		return out, event.Unauthorized(fmt.Errorf("user_id %s is not in PRODUCERS", event.Quote(producer)))
	case producer == "":
		return out, event.Unauthorized(fmt.Errorf("replayed by %s with no %s: the first producer is unknown", event.Quote(by), dlq.HeaderOriginalUser))
	default:
		return out, event.Unauthorized(fmt.Errorf("first published by %s (replayed by %s), which is not in PRODUCERS", event.Quote(producer), event.Quote(by)))
	}
}

// stamp sets x-original-user-id in headers to producer, or removes it
// when producer is empty, and returns headers (a new table when headers is
// nil and there is a producer to stamp).
func stamp(headers amqp.Table, producer string) amqp.Table {
	switch {
	case producer == "":
		delete(headers, dlq.HeaderOriginalUser)
	case headers == nil:
		headers = amqp.Table{dlq.HeaderOriginalUser: producer}
	default:
		headers[dlq.HeaderOriginalUser] = producer
	}
	return headers
}
