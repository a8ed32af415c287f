package consumer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"transferconsumer/event"
	"transferconsumer/retry"
	"transferconsumer/topology"
)

// Config configures a Service.
type Config struct {
	// URLs are the broker's AMQP URLs, vhost included: one, or one per node
	// of a cluster. Each session connects to the first that answers,
	// starting after the one the last session lost.
	URLs []string
	// URLsFunc, when set, is called for the URLs before each dial instead
	// of reading URLs, so that a credential rotated in a file is used at
	// the next reconnect, without a restart. An error is a failed dial.
	URLsFunc func() ([]string, error)
	Topology topology.Spec
	Declare  bool // declare the topology on every (re)connect
	// Management, when set and Declare is false, is read at each connect
	// to verify the topology made by others (topology.Spec.Verify): a queue
	// that would lose an account's order or a dead letter is not
	// consumed. nil: the arguments are not checked, and the service says
	// so once.
	Management *topology.Management
	// LookEvery is how often a session reads the DLQ's depth and looks for
	// partition queues beyond Topology.Queues; 0: every 10 s.
	LookEvery time.Duration
	Instance  string // connection name, consumer tags, dead-letter headers
	// ReplicaIndex of ReplicaCount: with more than one replica, each consumes
	// the queues i with i % ReplicaCount == ReplicaIndex at a higher consumer
	// priority, so that brokers whose single active consumer honours
	// priorities (4.x) spread the queues over the replicas (see adr/0004).
	ReplicaIndex, ReplicaCount int
	// BatchMax is the prefetch of each queue and the most events a worker
	// applies in one transaction (adr/0006): it takes what has arrived, up
	// to BatchMax, waiting at most BatchLinger for more. 1 is one event per
	// transaction, acked alone.
	BatchMax    int
	BatchLinger time.Duration
	// MaxBodyBytes bounds the body a worker decodes: a larger one is poison,
	// dead-lettered undecoded. 0 means no bound, which only tests use: the
	// service's configuration requires MAX_BODY_BYTES of at least 1024, so
	// the service always sets one.
	MaxBodyBytes int
	// Producers are the broker users whose events may move money, and
	// those whose replays keep the first producer (adr/0008); nil accepts
	// any publisher.
	Producers       *Producers
	ShutdownTimeout time.Duration // how long the message in hand may take once shutdown starts
	ApplyTimeout    time.Duration // one attempt to apply an event
	Retry           retry.Backoff // between attempts of a transient failure
	Reconnect       retry.Backoff // between broker sessions
	Logger          *slog.Logger
	// Observe, when set, is called once per delivery with the decision, after
	// the ack, reject or dead-letter was sent. Tests and metrics use it.
	Observe func(Decision)
	// ObserveRetry, when set, is called before each in-place retry of a
	// transient failure.
	ObserveRetry func(Retry)
	// ObserveBatch, when set, is called with the size of each batch taken
	// (BatchMax above 1).
	ObserveBatch func(size int)
	// Tracer, when set, traces each delivery and each attempt of its
	// transaction (trace.go); nil costs nothing.
	Tracer trace.Tracer
	// Journal, when set, wraps each worker's lane, for the worker's queue:
	// the journal of what the service acked (JOURNAL_STREAM, adr/0014).
	Journal func(queue string, lane event.Lane) event.Lane
	// JournalReadable, with Journal, returns nil once a read of the
	// journal can begin. A broker session that ended with a queue held
	// by a read that could not (event.ErrJournalUnread) is followed by
	// the next only once it does, as one held by the database waits for
	// a probe of it (awaitHealthy).
	JournalReadable func(ctx context.Context) error
}

// Retry is one in-place retry of a transient failure, or one failed probe
// of the applier before consuming again (then Queue and EventID are "").
type Retry struct {
	Queue   string
	EventID string
	Attempt int // 1 for the first retry
	Delay   time.Duration
	Err     error
}

// Decision is what happened to one delivery.
type Decision struct {
	Queue         string
	EventID       string // the body's eventId when it could be read, else the message_id property
	EventType     string // the body's eventType when it is a known one, else the type property
	TraceID       string // the delivery's trace, when tracing is on or the message carries a traceparent
	Redelivered   bool
	DeliveryCount int64       // x-delivery-count: 0 on the first delivery
	Class         event.Class // "" when the event was applied or was a duplicate
	Action        Action
	Duplicate     bool
	Retries       int // transient failures retried in place
	Err           error
	Duration      time.Duration
}

// Outcome names what happened to the delivery, in the one vocabulary the
// log lines and the metrics share: applied, duplicate, dead_lettered or
// requeued.
func (d Decision) Outcome() string {
	switch {
	case d.Duplicate:
		return "duplicate"
	case d.Action == ActionDeadLetter:
		return "dead_lettered"
	case d.Action == ActionRequeue:
		return "requeued"
	}
	return "applied"
}

// urls returns the broker's URLs for a dial: URLsFunc's, when it is set.
func (c Config) urls() ([]string, error) {
	if c.URLsFunc == nil {
		return c.URLs, nil
	}
	urls, err := c.URLsFunc()
	if err == nil && len(urls) == 0 {
		err = errors.New("no broker URL")
	}
	return urls, err
}

// ConsumerArgs returns the consume arguments for queue i: a consumer priority
// that prefers this replica's share of the queues, when there are replicas.
func (c Config) ConsumerArgs(i int) amqp.Table {
	if c.ReplicaCount < 2 {
		return nil
	}
	priority := 0
	if i%c.ReplicaCount == c.ReplicaIndex {
		priority = 10
	}
	return amqp.Table{"x-priority": int32(priority)}
}
