// Package consumer is the AMQP side of the service: one consume loop per
// queue, and the decision of what happens to each delivery. It declares or
// checks the topology through package topology, and knows nothing of
// PostgreSQL: it applies events through the Applier interface.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
	"transferconsumer/topology"
)

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
	checker   *topology.Checker        // of a topology made by others (Declare false)

	mu       sync.Mutex
	blockedQ map[string]Blocked // by queue
	journalQ map[string]Blocked // by queue: the journal's stream does not take its entries

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
	Topology *topology.Check
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
	st.Topology = s.checker.Last()
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
	s := &Service{cfg: cfg, app: app, log: log, blockedQ: map[string]Blocked{}, journalQ: map[string]Blocked{}, drainNow: make(chan struct{}, 1),
		checker: &topology.Checker{Spec: cfg.Topology, Management: cfg.Management, Log: log}}
	s.dlqDepth.Store(-1)
	return s
}

// Run consumes until ctx is cancelled, reconnecting after any broker failure
// for as long as it takes. On cancellation it stops taking deliveries,
// finishes the message in hand within ShutdownTimeout, and returns nil. It
// returns a *topology.Error, without retrying, when the broker's topology
// cannot be used as it stands.
func (s *Service) Run(ctx context.Context) error {
	// The consumer's three contexts, stop and work made here, session in
	// session; the rest of the package refers here:
	//
	//   - stop ends when shutdown starts (ctx ends), with the cause
	//     event.ErrShutdown, which tells shutdown apart from failure. Its
	//     end ends the session, and Run then returns instead of
	//     reconnecting.
	//   - session, one per broker session, is made from stop. It ends with
	//     stop, or when its broker session ends on its own (the connection
	//     closed, a worker failed, the topology made by others changed). A
	//     worker whose session ended applies nothing new: it finishes the
	//     attempt under way, settles what is final and closes its channel,
	//     which returns the rest to the queue. Dead-letter copies and the
	//     outbox drain run under it, so that no session end waits for a
	//     confirm, and its cause classifies an attempt's error as shutdown
	//     (classOf, core_class.go: the worker tells the core that cause).
	//   - work ends ShutdownTimeout after stop (else only when Run
	//     returns): it outlives session, so that the attempt in hand when the session
	//     ends can still commit and, while its channel lasts, be acked. It
	//     bounds the worker's database work (a lane closes its connection
	//     when work ends; a park runs under it) and how long settlements
	//     kept for the journal wait to be sent; once it has ended, a
	//     session waits abandonAfter for its workers, then closes without
	//     them (waitWorkers).
	//
	// stop and work are made without ctx's cancellation: each ends when
	// the goroutine below ends it.
	stop, cancelStop := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelStop(nil)
	work, cancelWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelWork(nil)
	go func() {
		select {
		case <-ctx.Done():
			cancelStop(event.ErrShutdown)
			select {
			case <-time.After(s.cfg.ShutdownTimeout):
				cancelWork(event.ErrShutdown)
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
		var te *topology.Error
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
// return when the connection or any worker fails, or when stop ends. Run
// says what stop, work and the session's own context are.
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
		stopped = s.checker.Run(stop, conn, urls[used])
	}

	session, endSession := context.WithCancel(stop) // the workers' session (Run)
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
			if len(stopped) > 0 && !slices.Equal(s.checker.Run(stop, conn, urls[used]), stopped) {
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

func (s *Service) openWorker(conn *amqp.Connection, letters *letters, i int, work context.Context) (*worker, error) {
	queue := s.cfg.Topology.Queue(i)
	w := &worker{svc: s, index: i, queue: queue, tag: s.cfg.Instance + "/" + queue, conn: conn, work: work,
		now: time.Now, letters: &letterChannel{letters: letters}}
	w.parker, _ = s.app.(Parker)
	if lanes, ok := s.app.(Lanes); ok {
		w.lane = s.lane(lanes, queue)
	}
	if err := w.open(prefetchFor(s.cfg.BatchMax, w.lane)); err != nil {
		w.close()
		return nil, err
	}
	w.core = newCore(s.coreConfig(w.lane, w.parker != nil))
	return w, nil
}

// lane returns a new lane of lanes for queue's worker, with the journal
// when there is one.
func (s *Service) lane(lanes Lanes, queue string) event.Lane {
	l := lanes.Lane(s.cfg.ApplyTimeout)
	if s.cfg.Journal != nil {
		l = s.cfg.Journal(queue, l)
	}
	return l
}

// coreConfig is the configuration of a worker's core with lane: batches
// only when the lane applies them, parking only when the applier parks.
func (s *Service) coreConfig(lane event.Lane, parks bool) coreConfig {
	batch := 1
	if _, ok := lane.(BatchLane); ok {
		batch = s.cfg.BatchMax
	}
	return coreConfig{Max: batch, Linger: s.cfg.BatchLinger > 0, MaxBody: s.cfg.MaxBodyBytes, CanPark: parks}
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
