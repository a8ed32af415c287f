package integration

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A locked-down broker: an administrator makes the topology, and the
// service and the dlq commands run as users with exactly the permissions
// the README names, on every broker version CI runs.

// The service as a user with the README's least permissions for
// DECLARE_TOPOLOGY=false, on a topology `transferconsumer topology` made as
// the administrator: it checks the topology through the management API with
// its own credentials (the management tag), applies events, dead-letters a
// poison message with its own headers, and reads the DLQ's depth; `dlq
// list` and `dlq replay` then work as users with the README's permissions
// for them.
func TestPermissionsLeastInTheREADMEAreEnough(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	grants := readmeGrants(t)
	if out, err := runCommand(t, e.commandEnv(2), "topology"); err != nil {
		t.Fatalf("topology as the administrator: %v\n%s", err, out)
	}
	svcURL := e.brokerUser("svc", grants["the service, `DECLARE_TOPOLOGY=false`"], "management")
	proc := startProcess(t, e.serviceEnv(2, "AMQP_URL="+svcURL, "DECLARE_TOPOLOGY=false",
		"MANAGEMENT_URL="+withoutUser(t, e.b.managementURL), "INSTANCE_NAME="+e.name+"-svc"))
	proc.waitConsuming(1)
	base := proc.httpAddr()
	if n := proc.count("msg", "the topology made by others has what the service needs"); n != 1 {
		t.Errorf("the topology check passed %d times, want once", n)
	}

	events := e.publishMany(6, 3)
	e.publishRaw(prefix, "acc_poison_"+e.name, []byte(`{"eventId": "not json`), "")
	waitFor(t, 30*time.Second, "every event decided", func() bool {
		return e.inboxCount() == len(events) && proc.count("outcome", "dead_lettered") == 1
	})
	letters := e.peekDLQ()
	if len(letters) != 1 || letters[0].header("x-failure-class") != "poison" {
		t.Errorf("DLQ holds %v, want the service's own copy of the poison message", letters)
	}
	var ready map[string]any
	waitFor(t, 30*time.Second, "ready, with the DLQ's depth read", func() bool {
		return getJSON(t, base+"/readyz", &ready) == 200 &&
			metricValue(getText(t, base+"/metrics"), "transferconsumer_dlq_messages") == 1
	})
	if ready["topology"] != "ok" {
		t.Errorf("/readyz's topology = %v, want ok", ready["topology"])
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	proc.checkNothingRefused()
	e.checkBalances(events)

	listURL := e.brokerUser("list", grants["`transferconsumer dlq list`, `dlq replay --dry-run`"], "")
	out, err := runCommand(t, e.commandEnv(2, "AMQP_URL="+listURL), "dlq", "list")
	if err != nil || !strings.Contains(out, "1 dead letter(s)") || !strings.Contains(out, "poison") {
		t.Errorf("dlq list: %v\n%s", err, out)
	}
	replayURL := e.brokerUser("replay", grants["`transferconsumer dlq replay`"], "")
	out, err = runCommand(t, e.commandEnv(2, "AMQP_URL="+replayURL), "dlq", "replay", "--class", "poison")
	if err != nil || !strings.Contains(out, "replayed 1") {
		t.Fatalf("dlq replay: %v\n%s", err, out)
	}
	if n := e.ready(e.topology(2).Queue(0)) + e.ready(e.topology(2).Queue(1)); n != 1 || e.ready("transfers.dlq") != 0 {
		t.Errorf("after the replay the partition queues hold %d, the DLQ %d; want 1 and 0", n, e.ready("transfers.dlq"))
	}
}

// On an empty vhost, `transferconsumer topology` and `repartition` as a
// user with the README's permissions for them declare everything, and the
// service declaring its own topology (the default) runs with its row's.
func TestPermissionsToDeclareInTheREADMEAreEnough(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	grants := readmeGrants(t)
	adminURL := e.brokerUser("admin", grants["`transferconsumer topology`, `transferconsumer repartition`"], "")
	if out, err := runCommand(t, e.commandEnv(2, "AMQP_URL="+adminURL), "topology"); err != nil {
		t.Fatalf("topology: %v\n%s", err, out)
	}
	if out, err := runCommand(t, e.commandEnv(2, "AMQP_URL="+adminURL), "repartition", "--to", "3"); err != nil ||
		!strings.Contains(out, "done: now run every replica with QUEUE_COUNT=3") {
		t.Fatalf("repartition: %v\n%s", err, out)
	}
	svcURL := e.brokerUser("svc", grants["the service, `DECLARE_TOPOLOGY=true` (the default)"], "")
	proc := startProcess(t, e.serviceEnv(3, "AMQP_URL="+svcURL, "INSTANCE_NAME="+e.name+"-svc"))
	proc.waitConsuming(1)
	base := proc.httpAddr()
	events := e.publishMany(6, 3)
	e.publishRaw(prefix, "acc_poison_"+e.name, []byte(`{"eventId": "not json`), "")
	waitFor(t, 30*time.Second, "every event decided", func() bool {
		return e.inboxCount() == len(events) && proc.count("outcome", "dead_lettered") == 1
	})
	var ready map[string]any
	waitFor(t, 30*time.Second, "ready, with the DLQ's depth read", func() bool {
		return getJSON(t, base+"/readyz", &ready) == 200 &&
			metricValue(getText(t, base+"/metrics"), "transferconsumer_dlq_messages") == 1
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	proc.checkNothingRefused()
	e.checkBalances(events)
}

// A user that may not write to the dead-letter exchange: the broker refuses
// the service's copy and closes its channel. The log says the copy was
// refused and names the permission to grant, not "nacked" nor
// "unroutable"; the message still reaches the DLQ by the queue's own
// dead-lettering.
func TestPermissionMissingOnTheDeadLetterExchangeIsSaidRefused(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	least := readmeGrants(t)["the service, `DECLARE_TOPOLOGY=false`"]
	least.write = `^transfers\.dlq$` // not the DLX
	svcURL := e.brokerUser("svc", least, "")
	proc := startProcess(t, e.serviceEnv(2, "AMQP_URL="+svcURL, "DECLARE_TOPOLOGY=false", "INSTANCE_NAME="+e.name+"-svc"))
	proc.waitConsuming(1)
	e.publishRaw(prefix, "acc_poison_"+e.name, []byte(`{"eventId": "not json`), "")
	const refused = "dead-letter copy refused by the broker (access refused)"
	waitFor(t, 30*time.Second, "the refused copy logged", func() bool { return proc.count("msg", refused) == 1 })
	waitFor(t, 30*time.Second, "the reject to the queue's own dead-lettering logged", func() bool {
		return proc.count("msg", "rejecting to the queue's own dead-lettering: the dead-letter copy was not confirmed") == 1
	})
	reason := proc.field(refused, "err")
	for _, want := range []string{"access refused", "may not publish to exchange transfers.dlx",
		"grant it the write permission", `^transfers\.dlx$`, "403"} {
		if !strings.Contains(reason, want) {
			t.Errorf("the log says %q, which does not say %q", reason, want)
		}
	}
	for _, wrong := range []string{"nacked", "unroutable"} {
		if strings.Contains(reason, wrong) {
			t.Errorf("the log says %q: a refusal taken for %s", reason, wrong)
		}
	}
	var letters []dlqMessage
	waitFor(t, 30*time.Second, "the letter in the DLQ by the queue's own dead-lettering", func() bool {
		letters = e.peekDLQ()
		return len(letters) == 1
	})
	if letters[0].header("x-death") == nil {
		t.Errorf("the DLQ holds %v, want the message dead-lettered by the broker (x-death)", letters[0])
	}
}

// A topology made by others in which one partition queue lacks single
// active consumer (and, on 4.x, the DLQ would drop letters): the service
// says so at start, in the log and in /readyz, and does not consume what
// would lose order or letters; once an administrator has fixed it with
// `transferconsumer topology`, it consumes without a restart. The
// management API's URL, with a user of its own, is read from a file.
func TestTopologyMadeByOthersWithAWrongArgumentIsSaid(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	args := e.topology(2).QueueArgs()
	delete(args, "x-single-active-consumer")
	e.redeclareQueue("transfers.1", args, "1", prefix)
	if typ, a := e.managedQueue("transfers.1"); typ != "quorum" || a["x-single-active-consumer"] != nil {
		t.Fatalf("transfers.1 is %s with %v", typ, a)
	}
	four := brokerMajor(t, e.b) >= 4
	if four {
		// The broker's default delivery limit, 20, would drop a letter
		// returned that often.
		e.redeclareQueue("transfers.dlq", amqp.Table{"x-queue-type": "quorum"}, "", "transfers.dlx")
	}
	svcURL := e.brokerUser("svc", readmeGrants(t)["the service, `DECLARE_TOPOLOGY=false`"], "management")
	proc := startProcess(t, e.serviceEnv(2, "AMQP_URL="+svcURL, "DECLARE_TOPOLOGY=false",
		"MANAGEMENT_URL_FILE="+writeSecretFile(t, e.b.managementURL), "INSTANCE_NAME="+e.name+"-svc"))
	proc.waitConsuming(1)
	base := proc.httpAddr()

	const refused = "the topology made by others would lose an account's order or dead letters: not consuming"
	waitFor(t, 10*time.Second, "the finding logged", func() bool { return proc.count("msg", refused) >= 1 })
	found := map[string]map[string]any{}
	proc.mu.Lock()
	for _, line := range proc.lines {
		if line["msg"] == refused {
			found[fmt.Sprint(line["object"], " ", line["argument"])] = line
		}
	}
	proc.mu.Unlock()
	sac := found["queue transfers.1 x-single-active-consumer"]
	if sac == nil || sac["found"] != "none" || sac["wanted"] != "true" || sac["level"] != "ERROR" ||
		!strings.Contains(fmt.Sprint(sac["fix"]), "transferconsumer topology") {
		t.Errorf("the log does not say plainly that transfers.1 lacks single active consumer: %v", found)
	}
	wantNotConsumed := []string{"transfers.1"}
	if four {
		limit := found["queue transfers.dlq x-delivery-limit"]
		if limit == nil || limit["wanted"] != "-1" || !strings.Contains(fmt.Sprint(limit["found"]), "20") {
			t.Errorf("the log does not say that the DLQ would drop letters: %v", found)
		}
		wantNotConsumed = []string{"transfers.0", "transfers.1"}
	}

	var ready map[string]any
	if code := getJSON(t, base+"/readyz", &ready); code != 503 ||
		fmt.Sprint(ready["not_consumed_queues"]) != fmt.Sprint(wantNotConsumed) ||
		!strings.Contains(fmt.Sprint(ready["topology_findings"]), "x-single-active-consumer") {
		t.Errorf("/readyz = %d %v, want 503 naming %v and the finding", code, ready, wantNotConsumed)
	}
	for i, q := range []string{"transfers.0", "transfers.1"} {
		held := false
		for _, n := range wantNotConsumed {
			held = held || n == q
		}
		if c, _ := e.inspect(q); (c.Consumers == 0) != held {
			t.Errorf("queue %d has %d consumers; held back: %v", i, c.Consumers, held)
		}
	}

	// The administrator puts it right; the service consumes, unrestarted.
	// transfers.1 is the last partition queue: declaring it again binds it
	// to the hash exchange and moves accounts to it, so topology refuses
	// and names repartition, which waits for transfers.0 to drain first.
	for _, q := range []string{"transfers.1", "transfers.dlq"} {
		if _, err := amqpDelete(e, q); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := runCommand(t, e.commandEnv(2), "topology"); err == nil || !strings.Contains(out, "repartition --to 2") {
		t.Fatalf("topology as the administrator, transfers.1 missing: %v, want a refusal naming repartition\n%s", err, out)
	}
	if out, err := runCommand(t, e.commandEnv(1), "repartition", "--to", "2"); err != nil {
		t.Fatalf("repartition as the administrator: %v\n%s", err, out)
	}
	waitFor(t, 60*time.Second, "ready, consuming both queues", func() bool {
		return getJSON(t, base+"/readyz", &ready) == 200
	})
	tr := newTransfer("acc_fixed_"+e.name, "acc_to_"+e.name, 5)
	e.publish(tr)
	waitFor(t, 30*time.Second, "the event applied", func() bool { return e.inboxRows(tr.EventID) == 1 })
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// amqpDelete deletes a queue as the administrator.
func amqpDelete(e *env, queue string) (int, error) {
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	return ch.QueueDelete(queue, false, false, false)
}

// readmeGrants returns the README's table of least permissions, by the
// first cell of each row.
func readmeGrants(t *testing.T) map[string]grants {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "**The broker's permissions.**")
	if !ok {
		t.Fatal("README has no section on the broker's permissions")
	}
	out := map[string]grants{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") {
			if len(out) > 0 {
				break // the table's end
			}
			continue
		}
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "\x00"), "|")
		if len(cells) != 6 || strings.HasPrefix(cells[2], "---") {
			continue
		}
		cell := func(i int) string {
			return strings.Trim(strings.ReplaceAll(strings.TrimSpace(cells[i]), "\x00", "|"), "`")
		}
		out[strings.TrimSpace(cells[1])] = grants{cell(2), cell(3), cell(4)}
	}
	// An empty regex would grant everything: each row must be there, whole.
	for _, row := range []string{"the service, `DECLARE_TOPOLOGY=false`", "the service, `DECLARE_TOPOLOGY=true` (the default)",
		"the service with the journal, `JOURNAL_STREAM=transfers.journal`",
		"`transferconsumer topology`, `transferconsumer repartition`",
		"`transferconsumer dlq list`, `dlq replay --dry-run`", "`transferconsumer dlq replay`"} {
		if g, ok := out[row]; !ok || g.configure == "" || g.write == "" || g.read == "" {
			t.Fatalf("README's table of permissions has no whole row %q: %v", row, out)
		}
	}
	return out
}

// grants are a user's three permission regexes on a vhost.
type grants struct{ configure, write, read string }

// brokerUser creates a user named after the test and role, with password,
// the tags and g on the test's vhost, removed at the end, and returns an
// AMQP URL to the vhost as that user.
func (e *env) brokerUser(role string, g grants, tags string) string {
	e.t.Helper()
	user, password := e.name+"_"+role, "pw-"+randomSuffix()
	e.b.mgmt(e.t, http.MethodPut, "/api/users/"+url.PathEscape(user), map[string]string{"password": password, "tags": tags}, nil)
	e.t.Cleanup(func() { e.b.mgmtQuiet(http.MethodDelete, "/api/users/"+url.PathEscape(user)) })
	e.b.mgmt(e.t, http.MethodPut, "/api/permissions/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(user),
		map[string]string{"configure": g.configure, "write": g.write, "read": g.read}, nil)
	u, _ := url.Parse(e.amqpURL)
	u.User = url.UserPassword(user, password)
	return u.String()
}

// commandEnv is the environment of a one-shot command on the test's vhost
// and database, as the administrator unless extra says otherwise.
func (e *env) commandEnv(queues int, extra ...string) []string {
	return append([]string{"AMQP_URL=" + e.amqpURL, "DATABASE_URL=" + e.dbURL, fmt.Sprintf("QUEUE_COUNT=%d", queues),
		fmt.Sprintf("DELIVERY_LIMIT=%d", e.limit), "LOG_LEVEL=warn"}, extra...)
}

// withoutUser returns a management URL without its credentials: the
// service then uses its broker user's.
func withoutUser(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.User = nil
	return u.String()
}

// checkNothingRefused fails the test if the broker refused the process
// anything: no 403 and no error line but the decisions about events.
func (p *process) checkNothingRefused() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, line := range p.lines {
		text := fmt.Sprint(line["msg"], " ", line["err"], " ", line["broker"])
		if (line["level"] == "ERROR" && line["msg"] != "event") || strings.Contains(text, "403") ||
			strings.Contains(text, "ACCESS_REFUSED") || strings.Contains(text, "could not be checked") {
			p.t.Errorf("refused: %v", line)
		}
	}
}

// managedQueue reads a queue's definition as the management API gives it.
func (e *env) managedQueue(name string) (typ string, args map[string]any) {
	e.t.Helper()
	var q struct {
		Type      string         `json:"type"`
		Arguments map[string]any `json:"arguments"`
	}
	e.b.mgmt(e.t, http.MethodGet, "/api/queues/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(name), nil, &q)
	return q.Type, q.Arguments
}

// redeclareQueue deletes a queue as the administrator and declares it again
// with args, bound to exchange with key, as someone making the topology by
// hand does.
func (e *env) redeclareQueue(name string, args amqp.Table, key, exchange string) {
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
	if _, err := ch.QueueDelete(name, false, false, false); err != nil {
		e.t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		e.t.Fatal(err)
	}
	if err := ch.QueueBind(name, key, exchange, false, nil); err != nil {
		e.t.Fatal(err)
	}
}

// The service with the journal runs as a user with the README's row for
// it: it declares the stream, journals every event it applies (the marks
// count them) and reads the journal back before consuming, with nothing
// refused.
func TestPermissionsForTheJournalInTheREADMEAreEnough(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	grants := readmeGrants(t)
	svcURL := e.brokerUser("svc", grants["the service with the journal, `JOURNAL_STREAM=transfers.journal`"], "")
	env := e.serviceEnv(2, "AMQP_URL="+svcURL, "INSTANCE_NAME="+e.name+"-svc", "JOURNAL_STREAM=transfers.journal")
	proc := startProcess(t, env)
	proc.waitConsuming(1)
	events := e.publishMany(6, 3)
	waitFor(t, 30*time.Second, "every event applied and journaled", func() bool {
		var marked int
		e.db.Get(&marked, `SELECT coalesce(sum(seq), 0) FROM journal_mark`)
		return e.inboxCount() == len(events) && proc.count("outcome", "applied") == len(events) && marked == len(events)
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	proc.checkNothingRefused()
	out, err := runCommand(t, append(env, "AMQP_URL="+svcURL), "recover")
	if err != nil || strings.Count(out, "0 entries applied again") != 2 {
		t.Errorf("recover as the service's user: %v\n%s", err, out)
	}
	e.checkBalances(events)
}
