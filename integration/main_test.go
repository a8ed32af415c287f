// Package integration runs the service against a real RabbitMQ and a real
// PostgreSQL. Connection URLs come from TEST_AMQP_URL, TEST_MANAGEMENT_URL
// and TEST_DATABASE_URL, defaulting to the local services; when those are
// unreachable and a Docker engine exists, the tests start their own with
// dockertest. With CI=true a missing broker or database fails the run.
package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"
	"github.com/ory/dockertest/v3"
	amqp "github.com/rabbitmq/amqp091-go"
)

// backend is where the tests find their broker and database. Each test
// makes its own vhost and database on it.
type backend struct {
	amqpURL       string // admin URL, default vhost
	managementURL string // http://user:pass@host:port
	databaseURL   string // admin URL to a maintenance database
	// A cluster's other ways in: every node's AMQP URL (amqpURL is the
	// first) and the other nodes' management APIs, asked when the first
	// does not answer.
	nodes          []string
	managementURLs []string
	ctl            brokerCtl // rabbitmqctl for it, when known; nodes take -n
}

var (
	shared      backend
	unavailable string // why the tests cannot run, when they cannot
)

func TestMain(m *testing.M) {
	shared = backend{
		amqpURL:       getenv("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		managementURL: getenv("TEST_MANAGEMENT_URL", "http://guest:guest@127.0.0.1:15672"),
		databaseURL:   getenv("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
	}
	cleanup := func() {}
	if err := shared.check(); err != nil {
		fallback, purge, derr := startWithDocker()
		switch {
		case derr == nil:
			shared, cleanup = fallback, purge
		case os.Getenv("CI") == "true":
			fmt.Fprintf(os.Stderr, "integration: no broker and database (CI=true, so this fails): local: %v; docker: %v\n", err, derr)
			os.Exit(1)
		default:
			unavailable = fmt.Sprintf("local services unreachable (%v) and no Docker (%v)", err, derr)
		}
	}
	code := m.Run()
	cleanup()
	if binary != "" {
		_ = os.RemoveAll(filepath.Dir(binary))
	}
	os.Exit(code)
}

func getenv(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

// check reports whether the broker (with the consistent-hash exchange type),
// its management API and the database all answer.
func (b backend) check() error {
	conn, err := amqp.DialConfig(b.amqpURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("broker channel: %w", err)
	}
	// A passive-free probe of the plugin: declare and delete a scratch exchange.
	name := "integration-probe-" + randomSuffix()
	if err := ch.ExchangeDeclare(name, "x-consistent-hash", false, true, false, false, nil); err != nil {
		return fmt.Errorf("broker lacks rabbitmq_consistent_hash_exchange: %w", err)
	}
	_ = ch.ExchangeDelete(name, false, false)

	req, _ := http.NewRequest(http.MethodGet, b.managementURL+"/api/overview", nil)
	if err := doJSON(req, nil); err != nil {
		return fmt.Errorf("management API: %w", err)
	}

	db, err := sqlx.Open("postgres", b.databaseURL)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	return nil
}

// startWithDocker starts RabbitMQ (management image, consistent-hash and
// shovel plugins enabled) and PostgreSQL in containers, for people who have
// Docker but not the services.
func startWithDocker() (backend, func(), error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return backend{}, nil, err
	}
	if err := pool.Client.Ping(); err != nil {
		return backend{}, nil, err
	}
	pool.MaxWait = 2 * time.Minute
	rabbit, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: "rabbitmq",
		Tag:        "4.0-management",
		Entrypoint: []string{"sh", "-c", "rabbitmq-plugins enable --offline rabbitmq_consistent_hash_exchange rabbitmq_shovel rabbitmq_shovel_management && exec docker-entrypoint.sh rabbitmq-server"},
	})
	if err != nil {
		return backend{}, nil, fmt.Errorf("start rabbitmq: %w", err)
	}
	pg, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: "postgres",
		Tag:        "15",
		Env:        []string{"POSTGRES_HOST_AUTH_METHOD=trust"},
	})
	if err != nil {
		_ = pool.Purge(rabbit)
		return backend{}, nil, fmt.Errorf("start postgres: %w", err)
	}
	purge := func() { _ = pool.Purge(rabbit); _ = pool.Purge(pg) }
	b := backend{
		amqpURL:       "amqp://guest:guest@" + rabbit.GetHostPort("5672/tcp") + "/",
		managementURL: "http://guest:guest@" + rabbit.GetHostPort("15672/tcp"),
		databaseURL:   "postgres://postgres@" + pg.GetHostPort("5432/tcp") + "/postgres?sslmode=disable",
	}
	if err := pool.Retry(b.check); err != nil {
		purge()
		return backend{}, nil, fmt.Errorf("containers never became ready: %w", err)
	}
	return b, purge, nil
}
