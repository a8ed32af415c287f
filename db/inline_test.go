package db

import (
	"context"
	"database/sql"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"net"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// Each kind of argument an attempt sends comes back from the server as it
// left, whatever its bytes, with standard_conforming_strings on and off:
// text with quotes, backslashes, dollar quotes and statement ends in it,
// bytes of every value, integers at their bounds, NULLs, and arrays of each.
func TestInlineLiteralsReachTheServerUnchanged(t *testing.T) {
	database := testDB(t, 2)
	ctx := context.Background()
	texts := []string{"", "'", "''", `\`, `\\'`, `\x41`, `E'\\'`, "$$", "$x$", "'); DROP TABLE balance_projection; --",
		"a'b\\c\"d", "{", "}", `{"a","b"}`, "NULL", "null", "é漢字🙂", "line\nbreak\ttab\r", "\u00a0 \u2028"}
	rng := rand.New(rand.NewPCG(7, 11))
	for range 200 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = byte(1 + rng.IntN(127)) // no NUL: text cannot hold one
		}
		texts = append(texts, string(b))
	}
	blobs := [][]byte{{}, {0}, {'\''}, {'\\'}, []byte(`\x00'`)}
	for range 50 {
		b := make([]byte, rng.IntN(64))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		blobs = append(blobs, b)
	}
	ints := []int64{0, -1, 1, math.MaxInt64, math.MinInt64}

	for _, scs := range []string{"on", "off"} {
		conn, err := database.Connx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "SET standard_conforming_strings = "+scs); err != nil {
			t.Fatal(err)
		}
		lit := func(v any) string {
			var b strings.Builder
			if err := writeLiteral(&b, v); err != nil {
				t.Fatal(err)
			}
			return b.String()
		}
		for _, s := range texts {
			if !utf8.ValidString(s) {
				continue
			}
			var got sql.NullString
			if err := conn.QueryRowxContext(ctx, "SELECT ("+lit(s)+")::text").Scan(&got); err != nil || !got.Valid || got.String != s {
				t.Errorf("scs=%s: %q came back as %q (%v)", scs, s, got.String, err)
			}
		}
		for _, b := range blobs {
			var got []byte
			if err := conn.QueryRowxContext(ctx, "SELECT ("+lit(b)+")::bytea").Scan(&got); err != nil || string(got) != string(b) {
				t.Errorf("scs=%s: bytes %x came back as %x (%v)", scs, b, got, err)
			}
		}
		for _, n := range ints {
			var got int64
			if err := conn.QueryRowxContext(ctx, "SELECT ("+lit(n)+")::bigint").Scan(&got); err != nil || got != n {
				t.Errorf("scs=%s: %d came back as %d (%v)", scs, n, got, err)
			}
		}
		var texts2 pq.StringArray
		if err := conn.QueryRowxContext(ctx, "SELECT ("+lit(pq.Array(texts))+")::text[]").Scan(&texts2); err != nil || strings.Join(texts2, "\x00") != strings.Join(texts, "\x00") {
			t.Errorf("scs=%s: an array of %d texts came back as %d (%v)", scs, len(texts), len(texts2), err)
		}
		var blobs2 pq.ByteaArray
		if err := conn.QueryRowxContext(ctx, "SELECT ("+lit(pq.ByteaArray(blobs))+")::bytea[]").Scan(&blobs2); err != nil || len(blobs2) != len(blobs) {
			t.Errorf("scs=%s: an array of %d byte strings came back as %d (%v)", scs, len(blobs), len(blobs2), err)
		} else {
			for i := range blobs {
				if string(blobs2[i]) != string(blobs[i]) {
					t.Errorf("scs=%s: array element %d %x came back as %x", scs, i, blobs[i], blobs2[i])
				}
			}
		}
		var ints2 pq.Int64Array
		if err := conn.QueryRowxContext(ctx, "SELECT ("+lit(pq.Array(ints))+")::bigint[]").Scan(&ints2); err != nil || len(ints2) != len(ints) || ints2[3] != math.MaxInt64 || ints2[4] != math.MinInt64 {
			t.Errorf("scs=%s: %v came back as %v (%v)", scs, ints, ints2, err)
		}
		var isNull [4]bool
		if err := conn.QueryRowxContext(ctx, "SELECT "+lit(nil)+"::text IS NULL, "+lit((*string)(nil))+"::text IS NULL, "+
			lit([]byte(nil))+"::bytea IS NULL, "+lit(sql.NullString{})+"::text IS NULL").Scan(&isNull[0], &isNull[1], &isNull[2], &isNull[3]); err != nil || isNull != [4]bool{true, true, true, true} {
			t.Errorf("scs=%s: NULLs came back as %v (%v)", scs, isNull, err)
		}
	}
	var b strings.Builder
	if err := writeLiteral(&b, 1.5); err == nil {
		t.Errorf("a float64 was written as %s, want it refused", b.String())
	}
}

// goroutinesCreated is how many goroutines the process has started.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// countingDialer counts the writes its connections make: with lib/pq, one
// per message batch the client sends before it waits for an answer. It
// also counts the connections opened to send a CancelRequest, lib/pq's way
// to cancel a statement that runs on another connection.
// openCounted opens the database at url, at most maxConns connections,
// through a countingDialer that counts what they write; the database
// closes when the test ends.
func openCounted(t *testing.T, url string, maxConns int) (*sqlx.DB, *countingDialer) {
	t.Helper()
	d := &countingDialer{}
	database, err := OpenFrom(context.Background(), func() (string, error) { return url, nil }, maxConns,
		func(c *connector) { c.dial = d })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { database.Close() })
	return database, d
}

type countingDialer struct{ writes, cancels atomic.Int64 }

func (d *countingDialer) Dial(network, address string) (net.Conn, error) {
	return d.DialTimeout(network, address, 0)
}

func (d *countingDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, d: d}, nil
}

type countingConn struct {
	net.Conn
	d      *countingDialer
	opened bool // the connection wrote its first message
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.d.writes.Add(1)
	if !c.opened {
		c.opened = true
		if isCancelRequest(b) {
			c.d.cancels.Add(1)
		}
	}
	return c.Conn.Write(b)
}

// isCancelRequest reports whether b, the first message of a connection, is
// a CancelRequest: its length, the code 80877102, then the process id and
// secret key of the session whose statement is to be cancelled. lib/pq
// writes it whole, in one write, and in the clear with sslmode=disable.
func isCancelRequest(b []byte) bool {
	return len(b) >= 8 && binary.BigEndian.Uint32(b[4:8]) == 80877102
}

// An event is one round trip to PostgreSQL, and so is a batch: the lane
// writes once per attempt, then reads the answer. Each kind of event is
// counted, a transition with all its message's fields included.
func TestAnAttemptIsOneRoundTrip(t *testing.T) {
	url := testDBURL(t)
	database, d := openCounted(t, url, 4)
	// A worker's context, which can end: under it, lib/pq and database/sql
	// would start a goroutine per statement to watch it, if the lane gave
	// it to them.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := NewInbox(database).Lane(10 * time.Second)
	defer l.Close()
	warm := newEvent(t, newID(), event.TransferCreated, newID(), "acc_g", "acc_h", 1)
	if _, err := l.Apply(ctx, warm); err != nil { // the lane takes its connection
		t.Fatal(err)
	}
	// The process's first collection starts the GC's mark workers, one
	// goroutine per P, which are not the attempts' doing: run alone, the
	// test may reach the attempts below without having collected yet, and
	// a first collection among them would be counted. Later ones start none.
	runtime.GC()

	var evs []event.Event
	for range 5 {
		transfer := newID()
		evs = append(evs,
			newEvent(t, newID(), event.TransferCreated, transfer, "acc_g", "acc_h", 10),
			newEvent(t, newID(), event.TransferCompleted, transfer, "acc_g", "acc_h", 10))
	}
	evs = append(evs, evs[0]) // and a duplicate
	before, goroutines := d.writes.Load(), goroutinesCreated()
	for _, ev := range evs {
		if _, err := l.Apply(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if n := d.writes.Load() - before; n != int64(len(evs)) {
		t.Errorf("%d events took %d writes, want one each", len(evs), n)
	}
	// Nor does an attempt start a goroutine to watch its statement.
	if n := goroutinesCreated() - goroutines; n != 0 {
		t.Errorf("%d events started %d goroutines, want none", len(evs), n)
	}

	var batch []event.Event
	for range 20 {
		transfer := newID()
		batch = append(batch, newEvent(t, newID(), event.TransferCreated, transfer, "acc_i", "acc_j", 1),
			newEvent(t, newID(), event.TransferFailed, transfer, "acc_i", "acc_j", 1))
	}
	before, goroutines = d.writes.Load(), goroutinesCreated()
	outs, err := l.(*lane).ApplyBatch(ctx, batch)
	if err != nil || len(outs) != len(batch) {
		t.Fatalf("a batch of %d: %d outcomes, %v", len(batch), len(outs), err)
	}
	if n := d.writes.Load() - before; n != 1 {
		t.Errorf("a batch of %d events took %d writes, want one", len(batch), n)
	}
	if n := goroutinesCreated() - goroutines; n != 0 {
		t.Errorf("a batch started %d goroutines, want none", n)
	}
}

// A lane's connection is closed when the context of its attempts ends, and
// the lane, given another context, goes on with a new connection.
func TestLaneGivenANewContextAfterItsLastEnded(t *testing.T) {
	database := testDB(t, 4)
	l := NewInbox(database).Lane(10 * time.Second).(*lane)
	defer l.Close()
	first, cancel := context.WithCancel(context.Background())
	if _, err := l.Apply(first, newEvent(t, newID(), event.TransferCreated, newID(), "acc_k", "acc_l", 1)); err != nil {
		t.Fatal(err)
	}
	cancel()
	waitFor(t, 5*time.Second, "the ended context to close the connection", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.aborted
	})
	if _, err := l.Apply(first, newEvent(t, newID(), event.TransferCreated, newID(), "acc_k", "acc_l", 1)); err == nil {
		t.Fatal("applied under a context that had ended")
	}
	ev := newEvent(t, newID(), event.TransferCreated, newID(), "acc_k", "acc_l", 2)
	if res, err := l.Apply(context.Background(), ev); err != nil || res.Duplicate {
		t.Fatalf("under a new context: %+v, %v; want applied", res, err)
	}
}

// An attempt's statement_timeout is the lane's timeout or the session's
// own (a role's or a database's setting), whichever is shorter.
func TestLaneKeepsAStricterStatementTimeout(t *testing.T) {
	for _, tt := range []struct {
		lane      time.Duration
		sessionMS int64
		want      string
	}{
		{2 * time.Second, 0, "SET LOCAL statement_timeout = 2000; "},
		{2 * time.Second, 200, "SET LOCAL statement_timeout = 200; "},
		{2 * time.Second, 5000, "SET LOCAL statement_timeout = 2000; "},
		{0, 200, "SET LOCAL statement_timeout = 200; "},
		{0, 0, ""},
		{time.Microsecond, 0, "SET LOCAL statement_timeout = 1; "},
	} {
		l := &lane{timeout: tt.lane}
		got := strings.TrimPrefix(l.prologue(tt.sessionMS), "SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE; ")
		if got != tt.want {
			t.Errorf("lane %s, session %d ms: %q, want %q", tt.lane, tt.sessionMS, got, tt.want)
		}
	}

	url := testDBURL(t)
	database, err := Open(context.Background(), url, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer database.Close()
	database.MustExec(`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET statement_timeout = %L', current_database(), '150ms'); END $$`)
	fresh, err := Open(context.Background(), url, 2) // sessions that take the setting
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	l := NewInbox(fresh).Lane(10 * time.Second).(*lane)
	defer l.Close()
	if _, err := l.Apply(context.Background(), newEvent(t, newID(), event.TransferCreated, newID(), "acc_m", "acc_n", 1)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(l.head, "statement_timeout = 150;") {
		t.Errorf("with the database's statement_timeout at 150ms, a lane of 10s sends %q", l.head)
	}
}

// A lane that gives its connection back after each event (the pool has no
// other to spare) still makes one round trip per event: the session's
// statement_timeout is read once per physical connection, not per pin.
func TestALaneThatReturnsItsConnectionAsksOnce(t *testing.T) {
	url := testDBURL(t)
	database, d := openCounted(t, url, 1)
	l := NewInbox(database).Lane(10 * time.Second).(*lane)
	defer l.Close()
	ctx := context.Background()
	if _, err := l.Apply(ctx, newEvent(t, newID(), event.TransferCreated, newID(), "acc_o", "acc_p", 1)); err != nil {
		t.Fatal(err)
	}
	if l.conn != nil {
		t.Fatal("the lane kept the pool's only connection")
	}
	before := d.writes.Load()
	for range 5 {
		if _, err := l.Apply(ctx, newEvent(t, newID(), event.TransferCreated, newID(), "acc_o", "acc_p", 1)); err != nil {
			t.Fatal(err)
		}
	}
	if n := d.writes.Load() - before; n != 5 {
		t.Errorf("5 events took %d writes, want 5", n)
	}
}

// Lanes keep their connections between events only while one is left for
// everyone else: with a pool of three and three lanes, two keep theirs and
// the third gives its back after each event; when a lane closes, another
// may keep its own again.
func TestLanesLeaveOneConnectionFree(t *testing.T) {
	database := testDB(t, 3)
	in := NewInbox(database)
	ctx := context.Background()
	var lanes []*lane
	for range 3 {
		l := in.Lane(10 * time.Second).(*lane)
		defer l.Close()
		lanes = append(lanes, l)
	}
	apply := func(l *lane) {
		t.Helper()
		if _, err := l.Apply(ctx, newEvent(t, newID(), event.TransferCreated, newID(), "acc_q", "acc_r", 1)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		for _, l := range lanes {
			apply(l)
		}
	}
	if lanes[0].conn == nil || lanes[1].conn == nil || lanes[2].conn != nil {
		t.Errorf("lanes holding a connection: %v %v %v, want the first two", lanes[0].conn != nil, lanes[1].conn != nil, lanes[2].conn != nil)
	}
	if st := database.Stats(); st.InUse != 2 || in.pinned.Load() != 2 {
		t.Errorf("%d connections in use, %d counted as the lanes', want 2 and 2", st.InUse, in.pinned.Load())
	}
	lanes[0].Close()
	apply(lanes[2])
	if lanes[2].conn == nil || in.pinned.Load() != 2 {
		t.Errorf("after a lane closed, the third kept its connection: %v; %d counted, want 2", lanes[2].conn != nil, in.pinned.Load())
	}
}

// writeText quotes text exactly as pq.QuoteLiteral does, without its
// copies: over strings made mostly of quotes, backslashes and the bytes
// around them.
func TestTextIsQuotedAsPqQuotesIt(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	alphabet := []byte{'\'', '\\', 'a', 'E', ' ', 0x80, 0xff, '"', '$'}
	texts := []string{"", "'", `\`, `''`, `\\`, `'\`, `\'`, "a", "é'漢"}
	for range 5000 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		texts = append(texts, string(b))
	}
	for _, s := range texts {
		var b strings.Builder
		writeText(&b, s)
		if want := pq.QuoteLiteral(s); b.String() != want {
			t.Fatalf("%q written as %q, pq.QuoteLiteral writes %q", s, b.String(), want)
		}
	}
}

// An event's call, written field by field, is the call of apply_event with
// its thirteen parameters in their order, as the generic writer writes
// them: for an event that keeps its message and for one that does not.
func TestEventCallIsApplyEventsParameters(t *testing.T) {
	completed := newEvent(t, newID(), event.TransferCompleted, newID(), "acc_s", "acc_t", 7)
	completed.Message = event.Message{RoutingKey: "acc_'s", Body: []byte(`{"a":"\\"}`), Headers: amqp.Table{"k": "v"},
		MessageID: "m-1", ContentType: "application/json"}
	created := newEvent(t, newID(), event.TransferCreated, newID(), "acc_s", "acc_t", 7)
	for _, ev := range []event.Event{completed, created} {
		t.Run(ev.Type, func(t *testing.T) {
			tr, m := ev.Transfer, messageOf(ev)
			var want, got strings.Builder
			if err := inlineCall(&want, "apply_event", []any{ev.ID, ev.Type, ev.Fingerprint, tr.ID, tr.FromAccount,
				tr.ToAccount, tr.AmountMinor, tr.Currency, m.key, m.body, jsonb(m.headers), m.id, m.contentType}); err != nil {
				t.Fatal(err)
			}
			writeEventCall(&got, ev)
			if got.String() != want.String() {
				t.Errorf("wrote\n%s\nwant\n%s", got.String(), want.String())
			}
			if ev.Type == event.TransferCompleted && strings.Count(got.String(), "NULL") != 0 {
				t.Errorf("a completed transfer's message was not written: %s", got.String())
			}
		})
	}
}
