package integration

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/retry"
	"transferconsumer/topology"
)

// Two replicas migrating an empty database at the same moment: one applies
// every migration, the other waits on the lock and finds nothing to do.
func TestMigrateConcurrentReplicas(t *testing.T) {
	parallel(t)
	if unavailable != "" {
		t.Skip(unavailable)
	}
	name := "tc_migrate_" + randomSuffix()
	admin := sqlx.MustOpen("postgres", shared.databaseURL)
	defer admin.Close()
	admin.MustExec("CREATE DATABASE " + pq.QuoteIdentifier(name))
	defer admin.Exec("DROP DATABASE " + pq.QuoteIdentifier(name) + " WITH (FORCE)")
	u, _ := url.Parse(shared.databaseURL)
	u.Path = "/" + name

	const replicas = 4
	applied := make([][]string, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < replicas; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			database, err := db.Open(context.Background(), u.String(), 2)
			if err != nil {
				errs[i] = err
				return
			}
			defer database.Close()
			<-start
			applied[i], errs[i] = db.Migrate(context.Background(), database, os.DirFS("../sql"))
		}()
	}
	close(start)
	wg.Wait()

	files := migrationFiles(t)
	total := 0
	for i := 0; i < replicas; i++ {
		if errs[i] != nil {
			t.Errorf("replica %d: %v", i, errs[i])
		}
		total += len(applied[i])
	}
	if total != len(files) {
		t.Errorf("%d migrations applied in all, want each of the %d once: %v", total, len(files), applied)
	}
	check := sqlx.MustOpen("postgres", u.String())
	defer check.Close()
	var rows int
	check.Get(&rows, `SELECT count(*) FROM schema_migration`)
	if numbered, _ := filepath.Glob("../sql/*.sql"); rows != len(numbered) {
		t.Errorf("schema_migration has %d rows, want %d", rows, len(numbered))
	}
}

// migrationFiles returns every file migrate applies to an empty database:
// the numbered migrations in ../sql and the functions in ../sql/functions.
func migrationFiles(t testing.TB) []string {
	t.Helper()
	numbered, err := filepath.Glob("../sql/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	fns, err := filepath.Glob("../sql/functions/*.sql")
	if err != nil || len(numbered) == 0 || len(fns) == 0 {
		t.Fatalf("migrations in ../sql: %d numbered, %d functions (%v)", len(numbered), len(fns), err)
	}
	return append(numbered, fns...)
}

// Declaring twice changes nothing, and the queues carry the contract's
// arguments.
func TestTopologyDeclareIsIdempotent(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(3)
	e.declare(3)
	var q struct {
		Arguments map[string]any `json:"arguments"`
		Type      string         `json:"type"`
	}
	mgmt(t, http.MethodGet, "/api/queues/"+url.PathEscape(e.vhost)+"/transfers.2", nil, &q)
	if q.Type != "quorum" || q.Arguments["x-single-active-consumer"] != true ||
		q.Arguments["x-dead-letter-strategy"] != "at-least-once" || q.Arguments["x-overflow"] != "reject-publish" ||
		q.Arguments["x-dead-letter-exchange"] != "transfers.dlx" || q.Arguments["x-delivery-limit"] != float64(5) ||
		q.Arguments["x-queue-leader-locator"] != "balanced" {
		t.Errorf("transfers.2 is %s with %v", q.Type, q.Arguments)
	}
	var bindings []struct {
		Source     string `json:"source"`
		RoutingKey string `json:"routing_key"`
	}
	mgmt(t, http.MethodGet, "/api/queues/"+url.PathEscape(e.vhost)+"/transfers.2/bindings", nil, &bindings)
	found := false
	for _, b := range bindings {
		found = found || (b.Source == "transfers" && b.RoutingKey == "1")
	}
	if !found {
		t.Errorf("transfers.2 lacks its weight-1 binding to transfers: %+v", bindings)
	}
	var d struct {
		Arguments map[string]any `json:"arguments"`
		Type      string         `json:"type"`
	}
	mgmt(t, http.MethodGet, "/api/queues/"+url.PathEscape(e.vhost)+"/transfers.dlq", nil, &d)
	// No limit that could drop a letter someone only looked at: on 3.x no
	// argument (-1 would drop it at its first return there), on 4.x -1
	// (the default there is 20). adr/0002.
	limit, limited := d.Arguments["x-delivery-limit"]
	if brokerMajor(t, shared) >= 4 {
		if d.Type != "quorum" || limit != float64(-1) {
			t.Errorf("transfers.dlq is %s with %v, want quorum with x-delivery-limit -1 on 4.x", d.Type, d.Arguments)
		}
	} else if d.Type != "quorum" || limited {
		t.Errorf("transfers.dlq is %s with %v, want quorum without a delivery limit on 3.x", d.Type, d.Arguments)
	}
}

// A partition queue declared before the leader locator was one of its
// arguments is used as it is: redeclaring it does not stop the service.
func TestQueueDeclaredWithoutTheLeaderLocatorIsAccepted(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	args := e.topology(2).QueueArgs()
	delete(args, "x-queue-leader-locator")
	if _, err := ch.QueueDeclare("transfers.0", true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	e.declare(2)
	e.declare(2)
	svc := e.start(2, nil)
	tr := newTransfer("acc_ll_"+e.name, "acc_lm_"+e.name, 9)
	e.publish(tr)
	waitFor(t, 20*time.Second, "the event applied", func() bool { return len(svc.rec.of(tr.EventID)) == 1 })
	var q struct {
		Arguments map[string]any `json:"arguments"`
	}
	mgmt(t, http.MethodGet, "/api/queues/"+url.PathEscape(e.vhost)+"/transfers.0", nil, &q)
	if _, has := q.Arguments["x-queue-leader-locator"]; has {
		t.Errorf("transfers.0 changed: %v", q.Arguments)
	}
}

// A queue that exists with other arguments stops the service with an error
// that names the queue and the argument, instead of a reconnect loop.
func TestServiceStopsOnQueueWithOtherArguments(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	args := e.topology(2).QueueArgs()
	args["x-delivery-limit"] = 9 // someone declared it by hand with another limit
	if _, err := ch.QueueDeclare("transfers.1", true, false, false, false, args); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = consumer.New(consumer.Config{
		URLs: []string{e.amqpURL}, Topology: e.topology(2), Declare: true, Instance: e.name,
		ShutdownTimeout: time.Second, ApplyTimeout: time.Second,
		Retry:     retry.Backoff{Min: time.Millisecond, Max: time.Millisecond},
		Reconnect: retry.Backoff{Min: time.Millisecond, Max: time.Millisecond},
	}, db.NewInbox(e.db)).Run(ctx)

	var te *topology.Error
	if !errors.As(err, &te) {
		t.Fatalf("Run = %v, want a *topology.Error", err)
	}
	for _, want := range []string{"queue transfers.1", "x-delivery-limit"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not name %q", err, want)
		}
	}
}
