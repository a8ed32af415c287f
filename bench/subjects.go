package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/lib/pq"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The subjects other than the service run as child processes of the harness
// (the same binary, another first argument), so that their CPU time and
// peak RSS are measured the same way as the service's. Each reads
// BENCH_AMQP_URL, BENCH_DATABASE_URL, BENCH_QUEUES and BENCH_EVENTS, runs
// until SIGTERM (or, for ackonly, until it has acked every event), and prints
// its latency summary as JSON on stdout.

type subjectEnv struct {
	amqpURL, dbURL string
	queues, events int
}

func readSubjectEnv() subjectEnv {
	q, _ := strconv.Atoi(os.Getenv("BENCH_QUEUES"))
	n, _ := strconv.Atoi(os.Getenv("BENCH_EVENTS"))
	return subjectEnv{os.Getenv("BENCH_AMQP_URL"), os.Getenv("BENCH_DATABASE_URL"), q, n}
}

func queueName(i int) string { return fmt.Sprintf("transfers.%d", i) }

// latencies records durations from delivery to ack, and when the first and
// the last were recorded.
type latencies struct {
	mu          sync.Mutex
	d           []time.Duration
	first, last time.Time
}

func (l *latencies) add(d time.Duration) {
	now := time.Now()
	l.mu.Lock()
	l.d = append(l.d, d)
	if l.first.IsZero() {
		l.first = now
	}
	l.last = now
	l.mu.Unlock()
}

type summary struct {
	Events  int       `json:"events"`
	P50ms   float64   `json:"p50_ms"`
	P99ms   float64   `json:"p99_ms"`
	FirstAt time.Time `json:"first_at"`
	LastAt  time.Time `json:"last_at"`
}

func (l *latencies) summary() summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := summarize(l.d)
	s.FirstAt, s.LastAt = l.first, l.last
	return s
}

func summarize(d []time.Duration) summary {
	if len(d) == 0 {
		return summary{}
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	return summary{Events: len(d), P50ms: ms(d[len(d)/2]), P99ms: ms(d[len(d)*99/100])}
}

// consume opens a channel for queue i with prefetch 1 and manual acks, as
// the service does, and returns its deliveries.
func consume(conn *amqp.Connection, i int) <-chan amqp.Delivery {
	ch, err := conn.Channel()
	if err != nil {
		fail(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		fail(err)
	}
	deliveries, err := ch.Consume(queueName(i), "", false, false, false, false, nil)
	if err != nil {
		fail(err)
	}
	return deliveries
}

func openDB(url string, conns int) *sql.DB {
	db, err := sql.Open("postgres", url)
	if err != nil {
		fail(err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db
}

// onFail, when set, runs before fail exits: the harness removes its
// temporary files (the service build, the subjects' logs in /dev/shm).
var onFail func()

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	if onFail != nil {
		onFail()
	}
	os.Exit(1)
}

func untilSignal() context.Context {
	ctx, _ := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	return ctx
}

// runBare is the floor of any consumer: amqp091-go and database/sql, one
// channel per queue, prefetch 1, the service's transaction, ack after commit.
func runBare() {
	env := readSubjectEnv()
	app := newTxApplier(openDB(env.dbURL, env.queues+4))
	conn, err := amqp.Dial(env.amqpURL)
	if err != nil {
		fail(err)
	}
	ctx := untilSignal()
	lat := &latencies{}
	var wg sync.WaitGroup
	for i := 0; i < env.queues; i++ {
		deliveries := consume(conn, i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case d, ok := <-deliveries:
					if !ok {
						return
					}
					start := time.Now()
					if err := app.apply(context.Background(), d.Body); err != nil {
						_ = d.Reject(true)
						continue
					}
					_ = d.Ack(false)
					lat.add(time.Since(start))
				}
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
	json.NewEncoder(os.Stdout).Encode(lat.summary())
}

// runPeer is what a Go team would otherwise pick: Watermill's router over
// watermill-amqp, one subscription per queue, prefetch 1, the same
// transaction in the handler; the router acks after the handler returns.
func runPeer() {
	env := readSubjectEnv()
	app := newTxApplier(openDB(env.dbURL, env.queues+4))
	cfg := wamqp.NewDurableQueueConfig(env.amqpURL)
	cfg.TopologyBuilder = existingQueues{} // the queues exist, with the service's arguments
	cfg.Consume.Qos = wamqp.QosConfig{PrefetchCount: 1}
	logger := watermill.NopLogger{}
	sub, err := wamqp.NewSubscriber(cfg, logger)
	if err != nil {
		fail(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	if err != nil {
		fail(err)
	}
	lat := &latencies{}
	for i := 0; i < env.queues; i++ {
		router.AddConsumerHandler(queueName(i), queueName(i), sub, func(m *message.Message) error {
			start := time.Now()
			if err := app.apply(m.Context(), m.Payload); err != nil {
				return err
			}
			lat.add(time.Since(start))
			return nil
		})
	}
	ctx := untilSignal()
	go func() {
		<-ctx.Done()
		router.Close()
	}()
	if err := router.Run(context.Background()); err != nil {
		fail(err)
	}
	json.NewEncoder(os.Stdout).Encode(lat.summary())
}

// existingQueues declares nothing: the harness made the topology with the
// service's own command, and a redeclare with other arguments would fail.
type existingQueues struct{}

func (existingQueues) BuildTopology(*amqp.Channel, wamqp.BuildTopologyParams, wamqp.Config, watermill.LoggerAdapter) error {
	return nil
}
func (existingQueues) ExchangeDeclare(*amqp.Channel, string, wamqp.Config) error { return nil }

// runDBOnly is the database's limit: the same transactions at the same
// concurrency, fed from memory, no broker.
func runDBOnly() {
	env := readSubjectEnv()
	app := newTxApplier(openDB(env.dbURL, env.queues+4))
	work := make(chan []byte, 1024)
	go func() {
		for _, e := range backlog(env.events, accountsFor(), seed) {
			b, _ := json.Marshal(e)
			work <- b
		}
		close(work)
	}()
	ctx := untilSignal()
	lat := &latencies{}
	var wg sync.WaitGroup
	for i := 0; i < env.queues; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range work {
				start := time.Now()
				if err := app.apply(context.Background(), b); err != nil {
					fail(err)
				}
				lat.add(time.Since(start))
			}
		}()
	}
	wg.Wait()
	<-ctx.Done()
	json.NewEncoder(os.Stdout).Encode(lat.summary())
}

// runAckOnly is the broker's limit: drain the backlog with prefetch 1 per
// queue and an immediate ack, no database; it exits once every event is
// acked.
func runAckOnly() {
	env := readSubjectEnv()
	conn, err := amqp.Dial(env.amqpURL)
	if err != nil {
		fail(err)
	}
	var acked atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	lat := &latencies{}
	for i := 0; i < env.queues; i++ {
		deliveries := consume(conn, i)
		go func() {
			for d := range deliveries {
				start := time.Now()
				_ = d.Ack(false)
				lat.add(time.Since(start))
				n := acked.Add(1)
				if n == 1 {
					fmt.Println("first") // the harness starts its window
				}
				if n == int64(env.events) {
					once.Do(func() { close(done) })
				}
			}
		}()
	}
	<-done
	json.NewEncoder(os.Stdout).Encode(lat.summary())
}
