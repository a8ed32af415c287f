package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// prometheusPath returns the Prometheus server the dashboard's test runs:
// TEST_PROMETHEUS, else Debian's prometheus package's. Without one the
// test skips, except with CI=true, where it fails like a missing broker.
func prometheusPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath(getenv("TEST_PROMETHEUS", "prometheus"))
	if err != nil {
		msg := fmt.Sprintf("no Prometheus server (%v): install Debian's prometheus package, or set TEST_PROMETHEUS", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + " (CI=true, so this fails)")
		}
		t.Skip(msg)
	}
	return p
}

// rabbitPrometheus returns the address (host:port) of the broker's
// rabbitmq_prometheus plugin: TEST_RABBITMQ_PROMETHEUS, else port 15692 on
// the management API's host. A plugin that does not answer, or that is
// another node's than the management API's, skips the test, except with
// CI=true.
func rabbitPrometheus(t *testing.T) string {
	t.Helper()
	addr := os.Getenv("TEST_RABBITMQ_PROMETHEUS")
	if addr == "" {
		u, err := url.Parse(shared.managementURL)
		if err != nil {
			t.Fatal(err)
		}
		addr = net.JoinHostPort(u.Hostname(), "15692")
	}
	err := func() error {
		resp, err := httpClient.Get("http://" + addr + "/metrics/detailed?family=queue_coarse_metrics&vhost=none")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		text, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		var overview struct {
			Node string `json:"node"`
		}
		if err := shared.mgmtErr(http.MethodGet, "/api/overview", nil, &overview); err != nil {
			return err
		}
		if !strings.Contains(string(text), `rabbitmq_node="`+overview.Node+`"`) {
			return fmt.Errorf("it is not node %s's, whose management API the tests use", overview.Node)
		}
		return nil
	}()
	if err != nil {
		msg := fmt.Sprintf("RabbitMQ's rabbitmq_prometheus plugin does not serve the tests' broker at %s (%v): "+
			"rabbitmq-plugins enable rabbitmq_prometheus (.ci/run does), or set TEST_RABBITMQ_PROMETHEUS", addr, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + " (CI=true, so this fails)")
		}
		t.Skip(msg)
	}
	return addr
}

// promServer is a Prometheus server the test started.
type promServer struct {
	t    *testing.T
	base string // http://127.0.0.1:port
}

// startPrometheus runs bin with the repository's prometheus/prometheus.yml,
// scraping service (host:port) and the broker's plugin at rabbit (its
// per-queue series for vhost, and its node's alarms) every second, and
// evaluating the alert rules as often; it waits until the server is
// ready, and kills it when the test ends. With rabbit empty it scrapes the
// service alone, for rules that read only the service's series.
func startPrometheus(t *testing.T, bin, service, rabbit, vhost string) *promServer {
	t.Helper()
	raw, err := os.ReadFile("../prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["global"] = map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"}
	rules, err := filepath.Abs("../prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	cfg["rule_files"] = []any{rules}
	var jobs []any
	for _, sc := range cfg["scrape_configs"].([]any) {
		job := sc.(map[string]any)
		target := service
		if job["job_name"] != "transferconsumer" {
			if rabbit == "" {
				continue
			}
			target = rabbit
			if params, ok := job["params"].(map[string]any); ok && params["vhost"] != nil {
				params["vhost"] = []any{vhost}
			}
		}
		job["static_configs"] = []any{map[string]any{"targets": []any{target}}}
		jobs = append(jobs, job)
	}
	cfg["scrape_configs"] = jobs
	dir := t.TempDir()
	file := filepath.Join(dir, "prometheus.json") // JSON is YAML
	out, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, out, 0o644); err != nil {
		t.Fatal(err)
	}
	// A free port, found by listening on one: another process may take
	// it before Prometheus does, so a start that exits is tried again.
	for try := 1; ; try++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		var logs bytes.Buffer
		cmd := exec.Command(bin, "--config.file="+file, "--storage.tsdb.path="+filepath.Join(dir, fmt.Sprint("data", try)),
			"--web.listen-address="+addr, "--log.level=warn")
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		p := &promServer{t: t, base: "http://" + addr}
		if p.waitReady(exited) {
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
			})
			return p
		}
		_ = cmd.Process.Kill()
		<-exited
		if try == 3 {
			t.Fatalf("Prometheus did not start on three free ports; its log:\n%s", logs.String())
		}
	}
}

// waitReady waits until the server answers /-/ready, for 30 s at most;
// false when it exited first, or never answered.
func (p *promServer) waitReady(exited <-chan error) bool {
	deadline := time.Now().Add(30 * time.Second)
	var wait poll
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		if resp, err := httpClient.Get(p.base + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		wait.pause()
	}
	return false
}

// sample is one series of an instant query's answer.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// value is the sample's value as a number (NaN when it is not one).
func (s sample) value() float64 {
	v, err := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// query evaluates expr now, through the HTTP API; an error says why
// Prometheus refused it (a parse error is one).
func (p *promServer) query(expr string) ([]sample, error) {
	var answer struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/query?query="+url.QueryEscape(expr), &answer); err != nil {
		return nil, err
	}
	if answer.Status != "success" {
		return nil, fmt.Errorf("%s", answer.Error)
	}
	var out []sample
	switch answer.Data.ResultType {
	case "vector":
		if err := json.Unmarshal(answer.Data.Result, &out); err != nil {
			return nil, err
		}
	case "scalar":
		var s sample
		if err := json.Unmarshal(answer.Data.Result, &s.Value); err != nil {
			return nil, err
		}
		out = []sample{s}
	default:
		return nil, fmt.Errorf("a %s, not an instant vector", answer.Data.ResultType)
	}
	return out, nil
}

// get reads path of the HTTP API into out; Prometheus answers a refused
// query with a status of 400 or 422 and a JSON body that says why.
func (p *promServer) get(path string, out any) error {
	resp, err := httpClient.Get(p.base + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("GET %s: %s: %w", path, resp.Status, err)
	}
	return nil
}

// names returns the names of every series Prometheus has scraped.
func (p *promServer) names() map[string]bool {
	p.t.Helper()
	var answer struct {
		Data []string `json:"data"`
	}
	if err := p.get("/api/v1/label/__name__/values", &answer); err != nil {
		p.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, n := range answer.Data {
		out[n] = true
	}
	return out
}

// substitute puts values in place of a query's Grafana variables.
func substitute(expr string, values map[string]string) string {
	pairs := make([]string, 0, 2*len(values))
	for k, v := range values {
		pairs = append(pairs, "$"+k, v)
	}
	return strings.NewReplacer(pairs...).Replace(expr)
}
