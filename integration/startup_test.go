package integration

import (
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Health answers from the first instant: while the database is unreachable
// at start-up, /healthz says 200 and /readyz 503 with the reason for the
// database and for the broker; once the database comes, the service is
// ready.
func TestHealthAnswersWhileTheDatabaseIsAwayAtStart(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	u, _ := url.Parse(e.dbURL)
	p := newProxy(t, u.Host)
	p.down()
	u.Host = p.addr
	proc := startProcess(t, e.serviceEnv(2, "DATABASE_URL="+u.String()))
	base := proc.httpAddr()
	if s := getText(t, base+"/healthz"); !strings.Contains(s, "ok") {
		t.Errorf("/healthz = %q", s)
	}
	var body map[string]any
	waitFor(t, 20*time.Second, "/readyz 503 naming the database", func() bool {
		return getJSON(t, base+"/readyz", &body) == 503 && strings.Contains(fmt.Sprint(body["database"]), "refused")
	})
	if !strings.Contains(fmt.Sprint(body["broker"]), "not started") {
		t.Errorf("/readyz broker = %v, want it not started yet", body["broker"])
	}
	p.up()
	waitFor(t, 30*time.Second, "ready once the database is back", func() bool { return getJSON(t, base+"/readyz", &body) == 200 })
	if body["database"] != "ok" || body["broker"] != "ok" {
		t.Errorf("/readyz = %v", body)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// Partition queues that exist beyond QUEUE_COUNT strand their messages: the
// service warns at start, counts them in a metric, and /readyz names them.
func TestQueuesBeyondQueueCountAreReported(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(4)
	proc := startProcess(t, e.serviceEnv(2))
	base := proc.httpAddr()
	var body map[string]any
	waitFor(t, 30*time.Second, "/readyz 503 naming the unconsumed queues", func() bool {
		return getJSON(t, base+"/readyz", &body) == 503 && fmt.Sprint(body["unconsumed_queues"]) == "[transfers.2 transfers.3]"
	})
	if metricValue(getText(t, base+"/metrics"), "transferconsumer_unconsumed_queues") != 2 {
		t.Error("transferconsumer_unconsumed_queues is not 2")
	}
	waitFor(t, 10*time.Second, "the warning", func() bool {
		return proc.field("partition queues exist beyond QUEUE_COUNT: their messages are not consumed by this instance", "level") == "WARN"
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// A broker that refuses access (a wrong password, a vhost that does not
// exist) is retried, since someone may fix it, but said at error level with
// a hint, and /readyz names it.
func TestBrokerAccessRefusedIsSaid(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	for _, tt := range []struct{ name, amqpURL string }{
		{"wrong password", strings.Replace(e.amqpURL, "guest:guest@", "guest:wrong@", 1)},
		{"unknown vhost", strings.Replace(e.amqpURL, e.vhost, "no_such_vhost_"+randomSuffix(), 1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			proc := startProcess(t, e.serviceEnv(2, "AMQP_URL="+tt.amqpURL, "RECONNECT_MAX=200ms"))
			base := proc.httpAddr()
			var body map[string]any
			waitFor(t, 30*time.Second, "/readyz 503 naming the refusal", func() bool {
				return getJSON(t, base+"/readyz", &body) == 503 && strings.Contains(fmt.Sprint(body["broker"]), "check the user name, password and vhost")
			})
			if strings.Contains(fmt.Sprint(body), "wrong") {
				t.Errorf("/readyz shows the password: %v", body)
			}
			waitFor(t, 10*time.Second, "the error line", func() bool {
				return proc.field("the broker refused access, retrying", "level") == "ERROR"
			})
			if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
				t.Errorf("exit after SIGTERM: %v", err)
			}
		})
	}
}

// PPROF=true serves /debug/pprof on PPROF_ADDR alone, never on HTTP_ADDR.
func TestPprofIsServedOnItsOwnAddress(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	proc := startProcess(t, e.serviceEnv(2, "PPROF=true", "PPROF_ADDR=127.0.0.1:0"))
	base := proc.httpAddr()
	var addr string
	waitFor(t, 20*time.Second, "the pprof server", func() bool { addr = proc.field("serving pprof", "addr"); return addr != "" })
	if s := getText(t, "http://"+addr+"/debug/pprof/"); !strings.Contains(s, "heap") {
		t.Errorf("PPROF_ADDR does not serve pprof: %.100s", s)
	}
	if s := getText(t, base+"/debug/pprof/"); strings.Contains(s, "heap") {
		t.Error("HTTP_ADDR serves pprof")
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}
