package integration

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
)

// Only the broker users in PRODUCERS move money (adr/0008), on every broker
// version CI runs: the service runs as a process with PRODUCERS and
// REPLAYERS set, and each producer is a broker user of its own with the
// README's grants for one, publishing with its user_id.

// producerRow is the README's row of grants for a producer.
const producerRow = "a producer (a user in `PRODUCERS`)"

// unauthorizedSeries are the labels of the counters of unauthorized dead
// letters (one per queue), as /metrics writes them.
var unauthorizedSeries = []string{`class="unauthorized"`, `outcome="dead_lettered"`}

// publisher is a broker user of the test's vhost that publishes events.
type publisher struct {
	t       *testing.T
	user    string
	ch      *amqp.Channel
	returns chan amqp.Return
}

// publisher creates the broker user role with grants g and opens a
// confirm-mode channel as that user.
func (e *env) publisher(role string, g grants) *publisher {
	e.t.Helper()
	u := e.brokerUser(role, g, "")
	conn, err := amqp.DialConfig(u, amqp.Config{Properties: amqp.Table{"connection_name": e.name + "-" + role}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	return &publisher{t: e.t, user: e.name + "_" + role, ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1))}
}

// publish sends tr to the hash exchange as a producer does, with user_id
// set to userID (the README's "Producers") and headers, and waits for the
// confirm; it returns the broker's refusal, if any.
func (p *publisher) publish(tr transfer, userID string, headers amqp.Table) error {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return dlq.PublishConfirmed(ctx, p.ch, p.returns, prefix, tr.Data.FromAccount, amqp.Publishing{
		DeliveryMode: amqp.Persistent, ContentType: "application/json",
		MessageId: tr.EventID, Type: tr.EventType, UserId: userID, Headers: headers, Body: tr.body(),
	})
}

func (p *publisher) mustPublish(tr transfer, headers amqp.Table) {
	p.t.Helper()
	if err := p.publish(tr, p.user, headers); err != nil {
		p.t.Fatalf("publish as %s: %v", p.user, err)
	}
}

// producerGrants returns the README's grants for a producer.
func producerGrants(t *testing.T) grants {
	t.Helper()
	g, ok := readmeGrants(t)[producerRow]
	if !ok || g.write == "" {
		t.Fatalf("README's table of permissions has no row %q", producerRow)
	}
	return g
}

// letterByID returns the DLQ's letters by message_id.
func (e *env) lettersByID() map[string]dlqMessage {
	e.t.Helper()
	out := map[string]dlqMessage{}
	for _, m := range e.peekDLQ() {
		id, _ := m.Properties["message_id"].(string)
		out[id] = m
	}
	return out
}

// appliedNever fails the test if tr moved money or reached the inbox.
func (e *env) appliedNever(tr transfer) {
	e.t.Helper()
	var n int
	if err := e.db.Get(&n, `SELECT count(*) FROM balance_projection WHERE account IN ($1, $2) AND balance_minor <> 0`,
		tr.Data.FromAccount, tr.Data.ToAccount); err != nil {
		e.t.Fatal(err)
	}
	if n != 0 || e.inboxRows(tr.EventID) != 0 {
		e.t.Errorf("event %s was applied (%d balances moved, %d inbox rows)", tr.EventID, n, e.inboxRows(tr.EventID))
	}
}

// checkUnauthorized fails the test unless m is an unauthorized letter whose
// reason says want and whose x-original-user-id is producer ("" for none).
func checkUnauthorized(t *testing.T, id string, m dlqMessage, want, producer string) {
	t.Helper()
	reason, _ := m.header(dlq.HeaderReason).(string)
	if m.header(dlq.HeaderClass) != "unauthorized" || !strings.Contains(reason, want) {
		t.Errorf("letter %s: class %v, reason %q; want unauthorized, saying %q", id, m.header(dlq.HeaderClass), reason, want)
	}
	if got, _ := m.header(dlq.HeaderOriginalUser).(string); got != producer {
		t.Errorf("letter %s names producer %q, want %q", id, got, producer)
	}
}

// The broker's check that the design rests on: a user_id that is not the
// publishing connection's user is refused, so a user_id that is set names
// its publisher.
func TestProducersBrokerRefusesAnotherUsersUserID(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	g := producerGrants(t)
	listed, other := e.publisher("payments", g), e.publisher("rogue", g)
	closes := other.ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := other.publish(newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 1), listed.user, nil); err == nil {
		t.Fatalf("a publish as %s claiming user_id %s was confirmed", other.user, listed.user)
	}
	select {
	case cause := <-closes:
		if cause == nil || cause.Code != amqp.PreconditionFailed || !strings.Contains(cause.Reason, "user_id") {
			t.Fatalf("the channel closed with %v, want 406 PRECONDITION_FAILED about user_id", cause)
		}
		t.Logf("RabbitMQ %s: %s", brokerVersion(t, shared), cause.Reason)
	case <-time.After(10 * time.Second):
		t.Fatal("the refused publish did not close the channel")
	}
	if err := listed.publish(newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 1), listed.user, nil); err != nil {
		t.Fatalf("a publish with its own user_id: %v", err)
	}
}

// A listed producer's events are applied; an unlisted one's, one claiming a
// listed producer in the header, and one without user_id are dead-lettered
// unauthorized, never applied, each reason naming the user or its absence,
// and counted.
func TestProducersOnlyListedApply(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	g := producerGrants(t)
	listed, other := e.publisher("payments", g), e.publisher("rogue", g)
	proc := startProcess(t, e.serviceEnv(2, "PRODUCERS=ledger-import,"+listed.user, "REPLAYERS="+e.name+"_replay",
		"INSTANCE_NAME="+e.name+"-svc"))
	proc.waitConsuming(1)
	base := proc.httpAddr()
	if n := proc.count("msg", "events are applied only from the producers listed"); n != 1 {
		t.Errorf("the start-up log named the producers %d times, want once", n)
	}

	from := "acc_p_" + e.name
	good := []transfer{newTransfer(from, "acc_q_"+e.name, 100), newTransfer(from, "acc_q_"+e.name, 250)}
	for _, tr := range good {
		listed.mustPublish(tr, nil)
	}
	rogue := newTransfer("acc_r1_"+e.name, "acc_s1_"+e.name, 5000)
	forged := newTransfer("acc_r2_"+e.name, "acc_s2_"+e.name, 6000)
	anon := newTransfer("acc_r3_"+e.name, "acc_s3_"+e.name, 7000)
	other.mustPublish(rogue, nil)
	other.mustPublish(forged, amqp.Table{dlq.HeaderOriginalUser: listed.user})
	e.publish(anon) // as the administrator, without user_id

	waitFor(t, 30*time.Second, "the listed events applied and the others dead-lettered", func() bool {
		return e.inboxRows(good[0].EventID) == 1 && e.inboxRows(good[1].EventID) == 1 && len(e.peekDLQ()) == 3
	})
	if b := e.balance("acc_q_" + e.name); b != 350 {
		t.Errorf("the listed producer's events moved %d, want 350", b)
	}
	letters := e.lettersByID()
	checkUnauthorized(t, "rogue", letters[rogue.EventID], `user_id "`+other.user+`" is not in PRODUCERS`, other.user)
	checkUnauthorized(t, "forged", letters[forged.EventID], `user_id "`+other.user+`" is not in PRODUCERS`, other.user)
	checkUnauthorized(t, "anon", letters[anon.EventID], "no user_id property", "")
	for _, tr := range []transfer{rogue, forged, anon} {
		e.appliedNever(tr)
	}
	waitFor(t, 10*time.Second, "three unauthorized letters counted", func() bool {
		return metricSum(getText(t, base+"/metrics"), "transferconsumer_events_total", unauthorizedSeries...) == 3
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// Without PRODUCERS every publisher is accepted, as before, and the start-up
// log says so once.
func TestProducersUnsetAcceptsAnyAndSaysSo(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	proc := startProcess(t, e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-svc"))
	proc.waitConsuming(1)
	tr := newTransfer("acc_u_"+e.name, "acc_v_"+e.name, 42)
	e.publish(tr) // no user_id
	waitFor(t, 30*time.Second, "the event applied", func() bool { return e.inboxRows(tr.EventID) == 1 })
	if n := proc.count("msg", "PRODUCERS is empty: events from any publisher are applied (adr/0008)"); n != 1 {
		t.Errorf("the start-up log said %d times that any publisher is accepted, want once", n)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// A replayed letter is judged by its first producer, whichever way it came
// to the DLQ: the service's own unauthorized copy (its producer listed
// since), or the broker's dead letter of a rejected message (its user_id
// kept). A listed producer's letter applies; an unlisted one's, even one
// whose header claims a listed producer, goes back to the DLQ as
// unauthorized, naming the replaying user, and a second replay launders it
// no more than the first.
func TestProducersReplayJudgedByFirstProducer(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	g := producerGrants(t)
	listed, other := e.publisher("payments", g), e.publisher("rogue", g)
	replayURL := e.brokerUser("replay", readmeGrants(t)["`transferconsumer dlq replay`"], "")
	replayUser := e.name + "_replay"

	// The service's copies: PRODUCERS does not list the producer yet.
	proc := startProcess(t, e.serviceEnv(2, "PRODUCERS="+e.name+"_someone", "REPLAYERS="+replayUser,
		"INSTANCE_NAME="+e.name+"-svc1"))
	proc.waitConsuming(1)
	copyListed := newTransfer("acc_c1_"+e.name, "acc_d1_"+e.name, 100)
	copyOther := newTransfer("acc_c2_"+e.name, "acc_d2_"+e.name, 200)
	listed.mustPublish(copyListed, nil)
	other.mustPublish(copyOther, nil)
	waitFor(t, 30*time.Second, "both dead-lettered by the service", func() bool { return len(e.peekDLQ()) == 2 })
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}

	// The broker's own dead letters: rejected without requeue while no
	// service runs, the header forged on one of them.
	brokerListed := newTransfer("acc_b1_"+e.name, "acc_e1_"+e.name, 300)
	brokerOther := newTransfer("acc_b2_"+e.name, "acc_e2_"+e.name, 400)
	listed.mustPublish(brokerListed, nil)
	other.mustPublish(brokerOther, amqp.Table{dlq.HeaderOriginalUser: listed.user})
	e.rejectAll(2, 2)
	// The DLQ's count can say four a moment before a read through the
	// management API returns the two new letters (seen once on 4.0.5).
	var letters map[string]dlqMessage
	waitFor(t, 30*time.Second, "the broker's two letters readable in the DLQ", func() bool {
		letters = e.lettersByID()
		_, l := letters[brokerListed.EventID]
		_, o := letters[brokerOther.EventID]
		return l && o
	})
	for _, tr := range []transfer{brokerListed, brokerOther} {
		m := letters[tr.EventID]
		if m.header("x-death") == nil || m.header(dlq.HeaderClass) != nil {
			t.Fatalf("letter %s is not the broker's own: %v", tr.EventID, m.Properties)
		}
	}
	if u := letters[brokerListed.EventID].Properties["user_id"]; u != listed.user {
		t.Errorf("the broker's dead letter kept user_id %v, want %s", u, listed.user)
	}

	proc = startProcess(t, e.serviceEnv(2, "PRODUCERS="+listed.user, "REPLAYERS="+replayUser,
		"INSTANCE_NAME="+e.name+"-svc2"))
	proc.waitConsuming(1)
	replay := func(class string) {
		t.Helper()
		out, err := runCommand(t, e.commandEnv(2, "AMQP_URL="+replayURL, "REPLAYERS="+replayUser), "dlq", "replay", "--class", class)
		if err != nil || !strings.Contains(out, "replayed 2") {
			t.Fatalf("dlq replay --class %s: %v\n%s", class, err, out)
		}
	}
	replay("unauthorized")
	replay("rejected")
	waitFor(t, 30*time.Second, "the listed producer's letters applied, the others back", func() bool {
		ls := e.lettersByID()
		return e.inboxRows(copyListed.EventID) == 1 && e.inboxRows(brokerListed.EventID) == 1 && len(ls) == 2 &&
			ls[copyOther.EventID].header(dlq.HeaderReplayRun) != nil && ls[brokerOther.EventID].header(dlq.HeaderReplayRun) != nil
	})
	want := `first published by "` + other.user + `" (replayed by "` + replayUser + `")`
	letters = e.lettersByID()
	checkUnauthorized(t, "service copy", letters[copyOther.EventID], want, other.user)
	checkUnauthorized(t, "broker letter", letters[brokerOther.EventID], want, other.user)

	// Again, with the class named: back once more, never applied.
	replay("unauthorized")
	waitFor(t, 30*time.Second, "both back in the DLQ again", func() bool {
		ls := e.lettersByID()
		return len(ls) == 2 && ls[copyOther.EventID].header(dlq.HeaderReplayRun) != letters[copyOther.EventID].header(dlq.HeaderReplayRun) &&
			ls[brokerOther.EventID].header(dlq.HeaderReplayRun) != letters[brokerOther.EventID].header(dlq.HeaderReplayRun)
	})
	for _, tr := range []transfer{copyOther, brokerOther} {
		e.appliedNever(tr)
	}
	if b := e.balance("acc_d1_"+e.name) + e.balance("acc_e1_"+e.name); b != 400 {
		t.Errorf("the listed producer's replayed events moved %d, want 400", b)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// rejectAll gets n messages from the partition queues of a topology of
// queues and rejects each without requeue, so that the broker dead-letters
// them itself, then waits until the DLQ holds them.
func (e *env) rejectAll(queues, n int) {
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
	before := e.ready(dlq.Queue(prefix))
	// A consumer on each queue: basic.get is refused on a quorum queue
	// with single active consumer.
	deliveries := make(chan amqp.Delivery, n)
	for i := 0; i < queues; i++ {
		ds, err := ch.Consume(e.topology(queues).Queue(i), "", false, false, false, false, nil)
		if err != nil {
			e.t.Fatal(err)
		}
		go func() {
			for d := range ds {
				deliveries <- d
			}
		}()
	}
	for got := 0; got < n; got++ {
		select {
		case d := <-deliveries:
			if err := d.Reject(false); err != nil {
				e.t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			e.t.Fatalf("got %d of the %d messages to reject", got, n)
		}
	}
	waitFor(e.t, 30*time.Second, "the broker to dead-letter them", func() bool { return e.ready(dlq.Queue(prefix)) == before+n })
}
