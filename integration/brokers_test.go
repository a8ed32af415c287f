package integration

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Besides the shared broker, some tests need RabbitMQ 4.x (whose single
// active consumer honours consumer priorities) or a three-node cluster.
// .ci/rabbitmq4 brings both up on this kind of machine and `.ci/rabbitmq4
// env` prints the variables these read. Without them such a test skips,
// except with CI=true, where that is a failure.

// broker4 returns a RabbitMQ 4.x backend: the shared broker when it is one,
// else TEST4_AMQP_URL and TEST4_MANAGEMENT_URL (rabbitmqctl through
// TEST_RABBITMQ4_CTL, node rabbit4).
func broker4(t *testing.T) backend {
	t.Helper()
	if unavailable != "" {
		t.Skip(unavailable)
	}
	if brokerMajor(t, shared) >= 4 {
		b := shared
		b.ctl = rabbitmqctl(t)
		return b
	}
	b := backend{
		amqpURL:       os.Getenv("TEST4_AMQP_URL"),
		managementURL: os.Getenv("TEST4_MANAGEMENT_URL"),
		databaseURL:   shared.databaseURL,
	}
	if b.amqpURL == "" || b.managementURL == "" {
		missing(t, "RabbitMQ 4.x (TEST4_AMQP_URL, TEST4_MANAGEMENT_URL: .ci/rabbitmq4 up, then eval \"$(.ci/rabbitmq4 env)\")")
	}
	if ctl := os.Getenv("TEST_RABBITMQ4_CTL"); ctl != "" {
		b.ctl = brokerCtl{ctl, "ctl", "rabbit4"}
	}
	return b
}

// cluster returns the three-node RabbitMQ 4.x cluster: TEST_CLUSTER_AMQP_URLS
// and TEST_CLUSTER_MANAGEMENT_URLS (comma-separated, one per node, in the
// same order) and TEST_RABBITMQ4_CTL.
func cluster(t *testing.T) (backend, clusterCtl) {
	t.Helper()
	if unavailable != "" {
		t.Skip(unavailable)
	}
	nodes := splitList(os.Getenv("TEST_CLUSTER_AMQP_URLS"))
	mgmts := splitList(os.Getenv("TEST_CLUSTER_MANAGEMENT_URLS"))
	script := os.Getenv("TEST_RABBITMQ4_CTL")
	if len(nodes) < 3 || len(mgmts) != len(nodes) || script == "" {
		missing(t, "a three-node cluster (TEST_CLUSTER_AMQP_URLS, TEST_CLUSTER_MANAGEMENT_URLS, TEST_RABBITMQ4_CTL: .ci/rabbitmq4 up)")
	}
	return backend{
		amqpURL: nodes[0], managementURL: mgmts[0], managementURLs: mgmts[1:],
		databaseURL: shared.databaseURL, nodes: nodes,
	}, clusterCtl(script)
}

// clusterCtl is .ci/rabbitmq4: it runs rabbitmqctl on a node and starts a
// stopped one.
type clusterCtl string

func (c clusterCtl) node(name string) brokerCtl { return brokerCtl{string(c), "ctl", name} }
func (c clusterCtl) start(t *testing.T, name string) {
	t.Helper()
	brokerCtl{string(c)}.run(t, "start", name)
}

func missing(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true but this test's broker is not here: %s", what)
	}
	t.Skip("needs " + what)
}

// brokerVersion returns the RabbitMQ version of b's broker.
func brokerVersion(t *testing.T, b backend) string {
	t.Helper()
	var o struct {
		Version string `json:"rabbitmq_version"`
	}
	b.mgmt(t, http.MethodGet, "/api/overview", nil, &o)
	return o.Version
}

// brokerMajor returns the major version of b's broker.
func brokerMajor(t *testing.T, b backend) int {
	t.Helper()
	major, _ := strconv.Atoi(strings.SplitN(brokerVersion(t, b), ".", 2)[0])
	return major
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
