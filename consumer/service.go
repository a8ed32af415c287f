// Package consumer is the AMQP side of the service: the topology, one consume
// loop per queue, and the decision of what happens to each delivery. It knows
// nothing of PostgreSQL; it applies events through the Applier interface.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
)

// Applier applies one event in one local transaction, inbox claim and
// business effect together. A redelivered event comes back as
// Result{Duplicate: true} with a nil error. Errors are classified with
// Poison, Conflict or Transient; anything else counts as unknown.
type Applier interface {
	Apply(ctx context.Context, ev Event) (Result, error)
}

// Lanes is implemented by an Applier that can give each worker a lane of
// its own: the worker applies all its events through it, one at a time, so
// the lane can keep per-worker state (a database connection, a timer)
// instead of setting it up for every event.
type Lanes interface {
	// Lane returns a lane that bounds each attempt by timeout itself and
	// also ends it when the context given to Apply ends.
	Lane(timeout time.Duration) Lane
}

// Lane applies one worker's events, one at a time.
type Lane interface {
	Applier
	Close() // releases what the lane holds; it is not used again
}

// BatchLane is a Lane that can apply several events in one local
// transaction (adr/0006).
type BatchLane interface {
	Lane
	// ApplyBatch applies evs, in order, in one transaction, and returns one
	// Outcome per event: its Result, or the error that event alone met (a
	// producer conflict). An error for the whole batch means nothing of it
	// was committed: the environment failed, or one of the events is one
	// the database refuses (a contradicting transition, data it rejects),
	// which the caller finds by splitting the batch.
	ApplyBatch(ctx context.Context, evs []Event) ([]Outcome, error)
}

// Outcome is what applying one event of a batch did.
type Outcome struct {
	Result
	Err error
}

// Prober is implemented by an Applier that can tell, without an event,
// whether applying one would work now: after a broker session ended while a
// queue was blocked, the service resumes consuming only once Probe passes,
// so that a long outage returns the message in hand to the broker once, not
// once per consumer timeout (adr/0002).
type Prober interface {
	Probe(ctx context.Context) error
}

// Result is what applying an event did.
type Result struct {
	Duplicate bool // the event had been applied before; nothing changed
	// Outbox: the transaction left a dead letter to publish after the
	// commit (see Outbox).
	Outbox bool
}

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
	Topology Topology
	Declare  bool // declare the topology on every (re)connect
	// Management, when set and Declare is false, is read at each connect
	// to verify the topology made by others (Topology.Verify): a queue
	// that would lose an account's order or a dead letter is not
	// consumed. nil: the arguments are not checked, and the service says
	// so once.
	Management *Management
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
	// dead-lettered undecoded. 0: no bound.
	MaxBodyBytes    int
	ShutdownTimeout time.Duration // how long the message in hand may take once shutdown starts
	ApplyTimeout    time.Duration // one attempt to apply an event
	Retry           Backoff       // between attempts of a transient failure
	Reconnect       Backoff       // between broker sessions
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
	DeliveryCount int64 // x-delivery-count: 0 on the first delivery
	Class         Class // "" when the event was applied or was a duplicate
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

// Backoff is a capped, jittered exponential delay.
type Backoff struct {
	Min, Max time.Duration
}

// Delay returns the wait before retry number attempt (0-based): Min doubled
// per attempt, capped at Max, then drawn uniformly from its upper half so
// that many consumers retrying together spread out.
func (b Backoff) Delay(attempt int) time.Duration {
	d := b.Min
	for i := 0; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

// Service consumes every partition queue and applies each event once in
// effect.
type Service struct {
	cfg       Config
	app       Applier
	log       *slog.Logger
	connected atomic.Bool
	consuming atomic.Int32
	letters   atomic.Pointer[letters]  // the session's dead-letter connection
	next      int                      // the URL the next session tries first; Run's alone
	brokerErr atomic.Pointer[string]   // why there is no broker session, while there is none
	dlqDepth  atomic.Int64             // dead letters waiting, as last seen; -1 before
	extra     atomic.Pointer[[]string] // queues beyond QUEUE_COUNT that exist, as last seen
	check     atomic.Pointer[TopologyCheck]
	unchecked sync.Once // said that the topology could not be checked

	mu       sync.Mutex
	blockedQ map[string]Blocked // by queue

	drainNow chan struct{} // a commit left a dead letter in the outbox: drain it now
}

// State is what readiness checks need to know about the broker side.
type State struct {
	Connected bool      // a broker session is up
	Consuming int       // queues with a running consumer
	Queues    int       // queues there are to consume
	Blocked   []Blocked // queues retrying their message in hand, by name
	// PublishBlocked is the broker's reason while a resource alarm blocks
	// the connection dead letters go out on, else "".
	PublishBlocked string
	// BrokerErr says why there is no broker session, while there is none
	// and one was tried: the last error, with a hint when the broker
	// refused access.
	BrokerErr string
	// DLQDepth is the number of dead letters waiting, as last seen (every
	// lookEvery); -1 before the first look.
	DLQDepth int
	// Unconsumed are partition queues numbered from Queues up that exist
	// but that this instance does not consume: messages routed there wait
	// for a consumer with a larger QUEUE_COUNT (adr/0004).
	Unconsumed []string
	// Topology is what the last check of a topology made by others found
	// (Declare false); nil when the service declares its own.
	Topology *TopologyCheck
}

// State returns the service's current broker-side state.
func (s *Service) State() State {
	st := State{
		Connected: s.connected.Load(),
		Consuming: int(s.consuming.Load()),
		Queues:    s.cfg.Topology.Queues,
		Blocked:   s.blocked(),
	}
	if l := s.letters.Load(); l != nil {
		st.PublishBlocked = l.blockedBy()
	}
	if e := s.brokerErr.Load(); e != nil && !st.Connected {
		st.BrokerErr = *e
	}
	st.DLQDepth = int(s.dlqDepth.Load())
	if extra := s.extra.Load(); extra != nil {
		st.Unconsumed = *extra
	}
	st.Topology = s.check.Load()
	return st
}

// Queue returns the name of partition queue i.
func (s *Service) Queue(i int) string { return s.cfg.Topology.Queue(i) }

// New returns a Service; Run starts it.
func New(cfg Config, app Applier) *Service {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, app: app, log: log, blockedQ: map[string]Blocked{}, drainNow: make(chan struct{}, 1)}
	s.dlqDepth.Store(-1)
	return s
}

// Run consumes until ctx is cancelled, reconnecting after any broker failure
// for as long as it takes. On cancellation it stops taking deliveries,
// finishes the message in hand within ShutdownTimeout, and returns nil. It
// returns a *TopologyError, without retrying, when the broker's topology
// cannot be used as it stands.
func (s *Service) Run(ctx context.Context) error {
	// stop ends when shutdown starts; its cause tells shutdown apart from
	// failure. work outlives it by ShutdownTimeout, so the message in hand
	// can still commit and be acked.
	stop, cancelStop := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelStop(nil)
	work, cancelWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelWork(nil)
	go func() {
		select {
		case <-ctx.Done():
			cancelStop(ErrShutdown)
			select {
			case <-time.After(s.cfg.ShutdownTimeout):
				cancelWork(ErrShutdown)
			case <-work.Done():
			}
		case <-work.Done():
		}
	}()

	for attempt := 0; ; attempt++ {
		started := time.Now()
		err := s.session(stop, work)
		if stop.Err() != nil {
			s.log.Info("consumer stopped")
			return nil
		}
		var te *TopologyError
		if errors.As(err, &te) {
			return err
		}
		if time.Since(started) > s.cfg.Reconnect.Max {
			attempt = 0 // a long session was healthy: start the backoff over
		}
		delay := s.cfg.Reconnect.Delay(attempt)
		reason := err.Error()
		if refused(err) {
			// Wrong credentials or vhost may yet be fixed by someone, so
			// the service keeps trying; but it says so at error level.
			reason += "; " + accessHint
			s.log.Error("the broker refused access, retrying", "err", err, "hint", accessHint, "delay_ms", delay.Milliseconds())
		} else {
			s.log.Warn("broker session ended, reconnecting", "err", err, "delay_ms", delay.Milliseconds())
		}
		s.brokerErr.Store(&reason)
		select {
		case <-stop.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// session runs one broker connection: declare, consume every queue, and
// return when the connection or any worker fails, or when stop ends.
func (s *Service) session(stop, work context.Context) error {
	if err := s.awaitHealthy(stop); err != nil {
		return err
	}
	urls, err := s.cfg.urls()
	if err != nil {
		return fmt.Errorf("connect to broker: %w", err)
	}
	conn, used, err := Dial(urls, s.next, s.cfg.Instance)
	if err != nil {
		return fmt.Errorf("connect to broker: %w", err)
	}
	s.brokerErr.Store(nil)
	defer conn.Close()
	s.next = (used + 1) % len(urls) // should this session be lost, try another node first
	if len(urls) > 1 {
		s.log.Info("connected to broker", "node", fmt.Sprintf("%d of %d", used+1, len(urls)))
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	s.connected.Store(true)
	defer s.connected.Store(false)
	letters := &letters{urls: s.cfg.urls, first: used, name: s.cfg.Instance + " dead-letters", log: s.log,
		unblocked: s.kickDrain}
	s.letters.Store(letters)
	defer letters.close()

	var stopped []string // partition queues the topology's check keeps from being consumed
	if s.cfg.Declare {
		if err := s.cfg.Topology.Declare(conn); err != nil {
			return err
		}
	} else {
		stopped = s.verify(stop, conn, urls[used])
	}

	session, endSession := context.WithCancel(stop)
	defer endSession()
	var wg sync.WaitGroup
	errs := make(chan error, s.cfg.Topology.Queues)
	for i := 0; i < s.cfg.Topology.Queues; i++ {
		if slices.Contains(stopped, s.cfg.Topology.Queue(i)) {
			continue
		}
		w, err := s.openWorker(conn, letters, i, work)
		if err != nil {
			endSession()
			wg.Wait()
			return err
		}
		wg.Add(1)
		s.consuming.Add(1)
		go func() {
			defer wg.Done()
			defer s.consuming.Add(-1)
			defer w.close()
			errs <- w.run(session)
		}()
	}
	if len(stopped) == 0 {
		s.log.Info("consuming", "queues", s.cfg.Topology.Queues, "prefix", s.cfg.Topology.Prefix)
	} else {
		s.log.Info("consuming", "queues", s.cfg.Topology.Queues-len(stopped), "prefix", s.cfg.Topology.Prefix, "not_consumed", stopped)
	}
	wg.Add(1)
	go func() { defer wg.Done(); s.drainLoop(session, letters) }()

	look := time.NewTicker(s.lookInterval())
	defer look.Stop()
	var result error
	for first := true; result == nil && stop.Err() == nil; first = false {
		s.look(stop, conn, urls[used], first)
		select {
		case <-stop.Done():
		case e := <-closed:
			result = fmt.Errorf("connection closed: %v", e)
		case e := <-errs:
			result = e
		case <-look.C:
			if len(stopped) > 0 && !slices.Equal(s.verify(stop, conn, urls[used]), stopped) {
				result = errors.New("the topology made by others changed: reconnecting to consume what it allows now")
			}
		}
	}
	// Every worker finishes the message in hand before the connection
	// closes, so nothing is returned to the queue that could be finished.
	endSession()
	s.waitWorkers(&wg, work)
	return result
}

// abandonAfter is how long, once shutdown has cancelled the work in hand
// (SHUTDOWN_TIMEOUT after SIGTERM), a session waits for workers that have
// not returned before it closes its connection without them.
const abandonAfter = 5 * time.Second

// waitWorkers waits for the session's workers. Once work has ended, a
// worker whose database call cannot be interrupted (lib/pq waits for a
// server that does not answer its cancel, such as a client queued in
// PgBouncer for a server connection) is left behind after abandonAfter,
// so that shutdown always ends: the connection's close returns what the
// worker held to the broker, its transaction never commits or, had its
// commit gone through, the redelivery is a duplicate the inbox absorbs.
func (s *Service) waitWorkers(wg *sync.WaitGroup, work context.Context) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-work.Done():
	}
	t := time.NewTimer(abandonAfter)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Error("shutdown: a worker is stuck in a database call that cannot be interrupted; "+
			"closing the broker connection without it (what it held is redelivered)",
			"waited_ms", (s.cfg.ShutdownTimeout + abandonAfter).Milliseconds())
	}
}

// lookEvery is how often, unless Config.LookEvery says otherwise, a
// session reads the DLQ's depth and looks for partition queues it does not
// consume, and the outbox is drained.
const lookEvery = 10 * time.Second

// maxQueues bounds the look for queues beyond QUEUE_COUNT (the largest
// count the configuration accepts).
const maxQueues = 1024

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

func (s *Service) openWorker(conn *amqp.Connection, letters *letters, i int, work context.Context) (*worker, error) {
	queue := s.cfg.Topology.Queue(i)
	w := &worker{svc: s, index: i, queue: queue, tag: s.cfg.Instance + "/" + queue, conn: conn, work: work,
		now: time.Now, core: newCore(s.cfg.BatchMax, s.cfg.BatchLinger > 0)}
	w.parker, _ = s.app.(Parker)
	w.letters = &letterChannel{letters: letters, parks: w.parker != nil}
	// Prefetch BatchMax (1 unless batches are on) per consumer: what the
	// broker gave us is the batch in hand at most, so order holds and a
	// crash returns one batch.
	if err := w.open(w.core.max); err != nil {
		return nil, err
	}
	if lanes, ok := s.app.(Lanes); ok {
		w.lane = lanes.Lane(s.cfg.ApplyTimeout)
	}
	return w, nil
}

// accessHint is what a person should check when the broker refuses access.
const accessHint = "check the user name, password and vhost in AMQP_URL, and the user's permissions on the vhost"

// refused reports whether err is the broker refusing access: wrong
// credentials or a vhost the user may not use (403), or a vhost that does
// not exist (530).
func refused(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && (ae.Code == amqp.AccessRefused || ae.Code == amqp.NotAllowed)
}

// awaitHealthy holds the next broker session back while a queue is still
// reported blocked from the last one and the applier can probe: until the
// probe passes, consuming again would only take the same message back and,
// at the next consumer timeout, spend one more of its deliveries. It
// returns when the probe passes or stop ends; then no queue is blocked.
func (s *Service) awaitHealthy(stop context.Context) error {
	p, ok := s.app.(Prober)
	if !ok || len(s.blocked()) == 0 {
		s.clearAllBlocked()
		return nil
	}
	var th Throttle
	start := time.Now()
	waiting := "not consuming until a probe of the database passes: a queue was blocked when the last broker session ended"
	s.brokerErr.Store(&waiting)
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(stop, s.cfg.ApplyTimeout)
		err := p.Probe(ctx)
		cancel()
		if err == nil {
			s.clearAllBlocked()
			if attempt > 0 {
				s.log.Info("environment healthy again, consuming", "probe_attempts", attempt+1,
					"waited_ms", time.Since(start).Milliseconds())
			}
			return nil
		}
		delay := s.cfg.Retry.Delay(attempt)
		if s.cfg.ObserveRetry != nil {
			s.cfg.ObserveRetry(Retry{Attempt: attempt + 1, Delay: delay, Err: err})
		}
		if due, _ := th.Due(attempt+1, err.Error()); due {
			s.log.Warn("a queue was blocked when the broker session ended; consuming resumes once a probe of the database passes",
				"attempts", attempt+1, "waited_ms", time.Since(start).Milliseconds(), "next_retry_ms", delay.Milliseconds(), "err", err)
		}
		select {
		case <-stop.Done():
			return context.Cause(stop)
		case <-time.After(delay):
		}
	}
}

func (s *Service) clearAllBlocked() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.blockedQ)
}
