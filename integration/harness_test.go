package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/dlq"
	"transferconsumer/retry"
	"transferconsumer/topology"
)

const prefix = "transfers"

// env is one test's private world: its own vhost on the broker and its own
// database, both removed when the test ends.
type env struct {
	t       *testing.T
	name    string // unique, readable: vhost, database, connection names
	vhost   string
	amqpURL string // service URL, vhost included
	dbURL   string
	db      *sqlx.DB
	pub     *amqp.Channel // confirm-mode publisher of the test
	returns chan amqp.Return
	limit   int     // the queues' delivery limit
	b       backend // the broker (and, by default, the database server) it lives on
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, shared)
}

// newEnvOn is newEnv with the test's database on the server of dbAdminURL
// (a URL to a maintenance database there, as a user who may create one).
func newEnvOn(t *testing.T, dbAdminURL string) *env {
	t.Helper()
	b := shared
	b.databaseURL = dbAdminURL
	return newEnvWith(t, b)
}

// newEnvWith is newEnv on backend b: another broker, or a cluster.
func newEnvWith(t *testing.T, b backend) *env {
	t.Helper()
	if unavailable != "" {
		t.Skip(unavailable)
	}
	dbAdminURL := b.databaseURL
	name := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_"))
	if len(name) > 40 {
		name = name[:40]
	}
	name = "tc_" + name + "_" + randomSuffix()
	e := &env{t: t, name: name, vhost: name, limit: 5, b: b}

	// Vhost, with the admin user's permissions.
	b.mgmt(t, http.MethodPut, "/api/vhosts/"+url.PathEscape(e.vhost), nil, nil)
	user := b.adminUser()
	b.mgmt(t, http.MethodPut, "/api/permissions/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(user),
		map[string]string{"configure": ".*", "write": ".*", "read": ".*"}, nil)
	t.Cleanup(func() { b.mgmtQuiet(http.MethodDelete, "/api/vhosts/"+url.PathEscape(e.vhost)) })
	e.amqpURL = e.vhostURL(b.amqpURL)
	var err error

	// Database, migrated with the files the binary embeds.
	admin := sqlx.MustOpen("postgres", dbAdminURL)
	t.Cleanup(func() { admin.Close() })
	admin.MustExec("CREATE DATABASE " + pq.QuoteIdentifier(name))
	t.Cleanup(func() {
		_, _ = admin.Exec("DROP DATABASE IF EXISTS " + pq.QuoteIdentifier(name) + " WITH (FORCE)")
	})
	du, _ := url.Parse(dbAdminURL)
	du.Path = "/" + name
	e.dbURL = du.String()
	e.db, err = db.Open(context.Background(), e.dbURL, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.db.Close() })
	if _, err := db.Migrate(context.Background(), e.db, os.DirFS("../sql")); err != nil {
		t.Fatal(err)
	}

	e.openPublisher()
	return e
}

// vhostURL returns the AMQP URL raw with the test's vhost as its path.
func (e *env) vhostURL(raw string) string {
	e.t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		e.t.Fatal(err)
	}
	u.Path = "/" + e.vhost
	u.RawPath = "/" + url.PathEscape(e.vhost)
	return u.String()
}

// nodeURLs returns, for a cluster, one AMQP URL per node with the test's
// vhost, in the backend's order; for a single broker, its URL alone.
func (e *env) nodeURLs() []string {
	if len(e.b.nodes) == 0 {
		return []string{e.amqpURL}
	}
	out := make([]string, len(e.b.nodes))
	for i, n := range e.b.nodes {
		out[i] = e.vhostURL(n)
	}
	return out
}

// openPublisher opens the test's own publishing channel, in confirm mode, on
// a connection named after the test in the management UI. A test calls it
// again after a broker restart closed the previous one.
func (e *env) openPublisher() {
	e.t.Helper()
	conn, err := amqp.DialConfig(e.amqpURL, amqp.Config{Properties: amqp.Table{"connection_name": e.name + "-publisher"}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	if e.pub, err = conn.Channel(); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pub.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	e.returns = e.pub.NotifyReturn(make(chan amqp.Return, 1))
}

// topology returns the topology the tests consume: two queues are enough to
// show partitioning and keep each test's set-up quick.
func (e *env) topology(queues int) topology.Spec {
	return topology.Spec{Prefix: prefix, Queues: queues, DeliveryLimit: e.limit}
}

// declare declares the topology without starting a consumer, so a test can
// publish before anything consumes.
func (e *env) declare(queues int) {
	e.t.Helper()
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	if err := e.topology(queues).Declare(conn); err != nil {
		e.t.Fatal(err)
	}
}

// service is a consumer running in the test process.
type service struct {
	svc      *consumer.Service
	instance string
	rec      *recorder
	retries  atomic.Int64 // in-place retries of transient failures
	retrying sync.Map     // queue name → true once it retried in place
	stop     func()
}

// retryingQueues returns how many queues have retried a transient failure.
func (s *service) retryingQueues() int {
	n := 0
	s.retrying.Range(func(any, any) bool { n++; return true })
	return n
}

// start runs a consumer over app (the real inbox when nil) until the test
// ends or stop is called.
func (e *env) start(queues int, app consumer.Applier) *service {
	e.t.Helper()
	return e.startWith(queues, app, nil)
}

// startWith is start with configure applied to the consumer's settings.
func (e *env) startWith(queues int, app consumer.Applier, configure func(*consumer.Config)) *service {
	e.t.Helper()
	if app == nil {
		app = db.NewInbox(e.db)
	}
	s := &service{instance: e.name + "-svc-" + randomSuffix(), rec: &recorder{}}
	cfg := consumer.Config{
		URLs:            []string{e.amqpURL},
		Topology:        e.topology(queues),
		Declare:         true,
		Instance:        s.instance,
		ShutdownTimeout: 10 * time.Second,
		ApplyTimeout:    10 * time.Second,
		BatchMax:        batchMax(),
		Retry:           retry.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Reconnect:       retry.Backoff{Min: 50 * time.Millisecond, Max: time.Second},
		Logger:          slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: testLogLevel()})),
		Observe:         s.rec.add,
		ObserveRetry: func(r consumer.Retry) {
			s.retries.Add(1)
			s.retrying.Store(r.Queue, true)
		},
	}
	if mgmt, err := url.Parse(e.b.managementURL); err == nil {
		// The broker's state through the management API, as an estate
		// would run the service.
		cfg.Management = &topology.Management{URL: mgmt}
	}
	if configure != nil {
		configure(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s.svc = consumer.New(cfg, app)
	go func() { done <- s.svc.Run(ctx) }()
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("consumer returned %v", err)
			}
		})
	}
	e.t.Cleanup(s.stop)
	top := e.topology(queues)
	waitFor(e.t, 30*time.Second, "a consumer on every queue", func() bool {
		for i := 0; i < queues; i++ {
			if q, ok := e.inspect(top.Queue(i)); !ok || q.Consumers == 0 {
				return false
			}
		}
		return true
	})
	return s
}

// batchMax is the BATCH_MAX the tests' services run with: TEST_BATCH_MAX,
// 1 by default. CI runs the suite once with 1 and once with 50.
func batchMax() int {
	n, err := strconv.Atoi(os.Getenv("TEST_BATCH_MAX"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// testLogLevel is the level of the in-process services' logs: TEST_LOG_LEVEL,
// warn by default so that a verbose run shows decisions only when they
// are not plain acks.
func testLogLevel() slog.Level {
	var l slog.Level = slog.LevelWarn
	if v := os.Getenv("TEST_LOG_LEVEL"); v != "" {
		_ = l.UnmarshalText([]byte(v))
	}
	return l
}

// testWriter sends the service's log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// recorder keeps every decision the consumer made, in order.
type recorder struct {
	mu  sync.Mutex
	all []consumer.Decision
}

func (r *recorder) add(d consumer.Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, d)
}

// of returns the decisions about one event.
func (r *recorder) of(eventID string) []consumer.Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []consumer.Decision
	for _, d := range r.all {
		if d.EventID == eventID {
			out = append(out, d)
		}
	}
	return out
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.all)
}

// transfer is a TransferCreated event of the contract's shape.
type transfer struct {
	EventID    string `json:"eventId"`
	EventType  string `json:"eventType"`
	OccurredAt string `json:"occurredAt"`
	Data       struct {
		TransferID  string `json:"transferId"`
		FromAccount string `json:"fromAccount"`
		ToAccount   string `json:"toAccount"`
		AmountMinor int64  `json:"amountMinor"`
		Currency    string `json:"currency"`
	} `json:"data"`
}

func newTransfer(from, to string, amount int64) transfer {
	var tr transfer
	tr.EventID = newUUID()
	tr.EventType = "TransferCreated"
	tr.OccurredAt = time.Now().UTC().Format(time.RFC3339)
	tr.Data.TransferID = newUUID()
	tr.Data.FromAccount, tr.Data.ToAccount = from, to
	tr.Data.AmountMinor = amount
	tr.Data.Currency = "EUR"
	return tr
}

// body is the JSON of tr; every event type carries the same data.
func (tr transfer) body() []byte {
	b, err := json.Marshal(tr)
	if err != nil {
		panic(err)
	}
	return b
}

// publish sends tr the way a producer does: to the hash exchange, keyed by
// fromAccount, persistent, with message_id and type.
func (e *env) publish(tr transfer) {
	e.t.Helper()
	e.publishRaw(prefix, tr.Data.FromAccount, tr.body(), tr.EventID)
}

// publishRaw sends body to exchange with key and waits for the confirm.
func (e *env) publishRaw(exchange, key string, body []byte, messageID string) {
	e.t.Helper()
	e.publishTo(exchange, key, body, messageID, nil)
}

// publishMsg sends body to the hash exchange with key and headers.
func (e *env) publishMsg(key string, body []byte, messageID string, headers amqp.Table) {
	e.t.Helper()
	e.publishTo(prefix, key, body, messageID, headers)
}

func (e *env) publishTo(exchange, key string, body []byte, messageID string, headers amqp.Table) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := e.pub.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		ContentType:  "application/json",
		MessageId:    messageID,
		Headers:      headers,
		Body:         body,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		e.t.Fatalf("publish to %s/%s not confirmed: %v", exchange, key, err)
	}
	select {
	case r := <-e.returns:
		e.t.Fatalf("publish to %s/%s returned unroutable: %s", exchange, key, r.ReplyText)
	default:
	}
}

func (e *env) balance(account string) int64 {
	e.t.Helper()
	var b int64
	err := e.db.Get(&b, `SELECT balance_minor FROM balance_projection WHERE account = $1`, account)
	if err != nil {
		e.t.Fatalf("balance of %s: %v", account, err)
	}
	return b
}

func (e *env) inboxRows(eventID string) int {
	e.t.Helper()
	var n int
	if err := e.db.Get(&n, `SELECT count(*) FROM processed_event WHERE event_id = $1`, eventID); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// ready returns the number of ready messages in a queue, exactly (a passive
// declare, not the management API's statistics, which lag).
func (e *env) ready(queue string) int {
	e.t.Helper()
	q, ok := e.inspect(queue)
	if !ok {
		e.t.Fatalf("queue %s does not exist", queue)
	}
	return q.Messages
}

// inspect declares queue passively; ok is false when it does not exist.
func (e *env) inspect(queue string) (amqp.Queue, bool) {
	e.t.Helper()
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return q, err == nil
}

// dlqMessage is a message as the management UI's "Get messages" shows it.
type dlqMessage struct {
	Payload    string         `json:"payload"`
	RoutingKey string         `json:"routing_key"`
	Properties map[string]any `json:"properties"`
}

func (m dlqMessage) header(name string) any {
	h, _ := m.Properties["headers"].(map[string]any)
	return h[name]
}

// peekDLQ reads the dead-letter queue through the management API, requeueing
// every message, as a person does in the UI.
func (e *env) peekDLQ() []dlqMessage {
	e.t.Helper()
	var out []dlqMessage
	e.b.mgmt(e.t, http.MethodPost, "/api/queues/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(dlq.Queue(prefix))+"/get",
		map[string]any{"count": 1000, "ackmode": "ack_requeue_true", "encoding": "auto"}, &out)
	return out
}

// closeConnections closes, through the management API, every broker
// connection whose client-provided name is name, as an operator or a network
// fault would. It waits until the broker lists one first.
func (e *env) closeConnections(name string) {
	e.t.Helper()
	closeNamedConnections(e.t, e.b, e.vhost, name, 15*time.Second)
}

// closeNamedConnections closes, through b's management API, every
// connection to vhost whose client-provided name is name, once the broker
// lists one (waiting up to patience).
func closeNamedConnections(t *testing.T, b backend, vhost, name string, patience time.Duration) {
	t.Helper()
	var found []string
	waitFor(t, patience, "connection "+name+" to be listed", func() bool {
		var conns []struct {
			Name  string `json:"name"`
			Props struct {
				Name string `json:"connection_name"`
			} `json:"client_properties"`
		}
		b.mgmt(t, http.MethodGet, "/api/vhosts/"+url.PathEscape(vhost)+"/connections", nil, &conns)
		found = found[:0]
		for _, c := range conns {
			if c.Props.Name == name {
				found = append(found, c.Name)
			}
		}
		return len(found) > 0
	})
	for _, n := range found {
		b.mgmt(t, http.MethodDelete, "/api/connections/"+url.PathEscape(n), nil, nil)
	}
}

func (b backend) adminUser() string {
	u, err := url.Parse(b.managementURL)
	if err != nil || u.User == nil {
		return "guest"
	}
	return u.User.Username()
}

// mgmt calls the shared broker's management HTTP API and decodes the
// answer into out.
func mgmt(t *testing.T, method, path string, in, out any) {
	t.Helper()
	shared.mgmt(t, method, path, in, out)
}

// mgmt calls b's management HTTP API and decodes the answer into out.
func (b backend) mgmt(t *testing.T, method, path string, in, out any) {
	t.Helper()
	if err := b.mgmtErr(method, path, in, out); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
}

// mgmtErr is mgmt that returns its error; a cluster's management API is
// asked on each node in turn until one answers.
func (b backend) mgmtErr(method, path string, in, out any) error {
	var errs []error
	for _, base := range append([]string{b.managementURL}, b.managementURLs...) {
		var body io.Reader
		if in != nil {
			j, _ := json.Marshal(in)
			body = bytes.NewReader(j)
		}
		req, err := http.NewRequest(method, base+path, body)
		if err != nil {
			return err
		}
		err = doJSON(req, out)
		if err == nil {
			return nil
		}
		var he httpError
		if errors.As(err, &he) { // the node answered: another would say the same
			return err
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (b backend) mgmtQuiet(method, path string) { _ = b.mgmtErr(method, path, nil, nil) }

func doJSON(req *http.Request, out any) error {
	if u := req.URL.User; u != nil {
		p, _ := u.Password()
		req.SetBasicAuth(u.Username(), p)
		req.URL.User = nil
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return httpError{resp.StatusCode, string(b)}
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// httpError is an answer with a status of 300 or more.
type httpError struct {
	status int
	body   string
}

func (e httpError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.status, e.body) }

// httpClient keeps no idle connections, so no goroutine of it outlives a
// call (the leak checks count goroutines).
var httpClient = &http.Client{
	Timeout:   15 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// prunedID is SQL for a random id that sorts after 2100, where retention
// deletes rows past the TTL one by one: a test that counts what a prune
// deletes inserts its expired rows with it. A random id of its own would,
// about once in 50,000, sort among the day partitions that retention drops
// whole instead, days later (adr/0011).
const prunedID = `('f' || substr(gen_random_uuid()::text, 2))::uuid`

func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// getJSON fetches url, decodes its JSON body into out, and returns the status.
func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode
}

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
