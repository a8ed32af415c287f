package journal

// What a read makes of a journal message whose entries do not all decode:
// each entry decodes alone; only a message that does not parse holds its
// queue. The models are models_test.go's.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"transferconsumer/event"
)

// eventID is the id of the n-th event of the messages below.
func eventID(n int64) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

// transferBody is the body of a TransferCreated event, the n-th, as it
// was delivered, occurred at occurredAt.
func transferBody(n int64, occurredAt string) string {
	return fmt.Sprintf(`{"eventId":%q,"eventType":"TransferCreated","occurredAt":%q,"data":{"transferId":"10000000-0000-4000-8000-%012d",`+
		`"fromAccount":"acc_a","toAccount":"acc_b","amountMinor":5,"currency":"EUR"}}`, eventID(n), occurredAt, n)
}

// wireJSON is an entry as the writer writes it: the n-th event, with
// sequence n, its body and headers as given.
func wireJSON(n int64, body, headers string) string {
	return fmt.Sprintf(`{"seq":%d,"type":"TransferCreated","messageId":%q,"contentType":"application/json","routingKey":"acc_a",`+
		`"headers":%s,"body":%s}`, n, eventID(n), headers, body)
}

const producerHeaders = `{"x-producer":"payments"}`

// goodEntry is entry n, whose event decodes; badEntry one whose body no
// longer validates (its occurredAt is not a time).
func goodEntry(n int64) string {
	return wireJSON(n, transferBody(n, "2026-07-10T12:00:00Z"), producerHeaders)
}
func badEntry(n int64) string { return wireJSON(n, transferBody(n, "yesterday"), producerHeaders) }

// journalBody is a journal message's body holding entries.
func journalBody(entries ...string) []byte { return []byte("[" + strings.Join(entries, ",") + "]") }

// An entry that the journal holds and that no longer decodes (a later
// release that validates more, a body that no longer validates; or its
// headers) takes no neighbour with it: the other entries of its message
// are applied, it ends as a dead letter with its class and a reason that
// says it was applied and acked once, carrying its message as journaled,
// the mark moves past all, and the queue goes on without an operator.
// Before, the whole message was unreadable, its four entries (up to
// BATCH_MAX acked events) left to recover --accept-loss, with no letter.
func TestAnEntryThatNoLongerDecodesIsDeadLetteredAndItsNeighboursApplied(t *testing.T) {
	db, s := &database{}, &stream{}
	badHeaders := wireJSON(4, transferBody(4, "2026-07-10T12:00:00Z"), `["not","a","table"]`)
	s.put("q.0", 1, 4, journalBody(goodEntry(1), badEntry(2), goodEntry(3), badHeaders))
	s.put("q.0", 5, 6, journalBody(goodEntry(5), goodEntry(6)))
	var log bytes.Buffer
	l := makeLane(s, Config{}, "q.0", modelLane{db}, slog.New(slog.NewTextHandler(&log, nil)))
	n, err := l.Recover(t.Context())
	if err != nil {
		t.Fatalf("a message with entries that no longer decode: %v; want their neighbours applied, and no loss to accept", err)
	}
	if want := []string{eventID(1), eventID(3), eventID(5), eventID(6)}; !slices.Equal(db.applied, want) || n != 4 || db.mark != 6 {
		t.Fatalf("applied %v (%d), mark %d; want %v, the mark past all (6)", db.applied, n, db.mark, want)
	}
	if len(db.outbox) != 2 {
		t.Fatalf("letters %v, want entries 2 and 4", db.letters())
	}
	for i, tt := range []struct {
		seq     int64
		body    string
		headers string
		reason  string
	}{
		{2, transferBody(2, "yesterday"), producerHeaders, `occurredAt "yesterday" is not an RFC 3339 time`},
		{4, transferBody(4, "2026-07-10T12:00:00Z"), `["not","a","table"]`, "its headers are not a table"},
	} {
		lt := db.outbox[i]
		if lt.EventID != eventID(tt.seq) || lt.EventType != "TransferCreated" || lt.Class != string(event.ClassPoison) || lt.Queue != "q.0" ||
			!strings.Contains(lt.Reason, fmt.Sprintf("applied and acked once, then no longer decodes when applied again from the journal (entry %d of q.0)", tt.seq)) ||
			!strings.Contains(lt.Reason, tt.reason) {
			t.Errorf("entry %d's letter: %s, %s, %s, %q; want its event, poison, and a reason that says it was applied and acked once and why",
				tt.seq, lt.EventID, lt.Class, lt.Queue, lt.Reason)
		}
		if string(lt.Body) != tt.body || string(lt.Headers) != tt.headers || lt.MessageID != eventID(tt.seq) ||
			lt.RoutingKey != "acc_a" || lt.ContentType != "application/json" {
			t.Errorf("entry %d's letter carries %q, headers %s, message id %s, routing key %s, content type %s; want its message as journaled",
				tt.seq, lt.Body, lt.Headers, lt.MessageID, lt.RoutingKey, lt.ContentType)
		}
	}
	if !strings.Contains(log.String(), "no longer decodes") || !strings.Contains(log.String(), "seq=2") {
		t.Errorf("the log does not name the entry that no longer decodes:\n%s", log.String())
	}
	if _, err := applyBatch(t, l, events(1)); err != nil || db.mark != 7 {
		t.Fatalf("the queue's next event: %v, mark %d; want it applied, 7", err, db.mark)
	}
}

// An entry dead-lettered in its own transaction (a producer conflict) is
// never applied again, so an event of it that no longer decodes is
// nothing to dead-letter again: the mark passes over it, no letter.
func TestADeadEntryThatNoLongerDecodesIsPassedOver(t *testing.T) {
	db, s := &database{}, &stream{}
	dead := strings.Replace(badEntry(2), `{"seq":2,`, `{"seq":2,"deadLettered":true,`, 1)
	s.put("q.0", 1, 3, journalBody(goodEntry(1), dead, goodEntry(3)))
	l := makeLane(s, Config{}, "q.0", modelLane{db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if n, err := l.Recover(t.Context()); err != nil || n != 2 || db.mark != 3 || len(db.outbox) != 0 {
		t.Fatalf("%d applied (%v), mark %d, letters %v; want 2, the mark 3, no letter", n, err, db.mark, db.letters())
	}
	if want := []string{eventID(1), eventID(3)}; !slices.Equal(db.applied, want) {
		t.Errorf("applied %v, want %v", db.applied, want)
	}
}

// A message that does not parse at all holds its queue: the entries before
// it are applied, then the queue waits, its event in hand, until an
// operator accepts the loss; the report, and AcceptLoss's log, name
// exactly what the mark moves past (the message's entries above the mark),
// the message's offset and why. Here the database kept the commits of two
// of the message's four entries (it holds a write of several
// transactions): before, that message was reported as one past the mark
// ('holds entries 3 to 6 ... but the database holds up to entry 4'), which
// recover --accept-loss could not accept, and the queue waited for good.
func TestAMessageThatDoesNotParseNamesExactlyWhatItsLossSkips(t *testing.T) {
	db, s := &database{}, &stream{}
	s.put("q.0", 1, 2, journalBody(goodEntry(1), goodEntry(2)))
	s.put("q.0", 3, 6, []byte(`[{"seq":3,"body":{"eventId":`)) // cut short
	s.put("q.0", 7, 8, journalBody(goodEntry(7), goodEntry(8)))
	db.mark = 4
	var log bytes.Buffer
	l := makeLane(s, Config{}, "q.0", modelLane{db}, slog.New(slog.NewTextHandler(&log, nil)))
	_, err := l.Recover(t.Context())
	var short *ShortError
	if !errors.As(err, &short) || short.Unreadable == nil || short.Mark != 4 || short.First != 7 || short.Offset != int64(1) ||
		short.Holds != [2]int64{3, 6} {
		t.Fatalf("%v; want the queue waiting, the loss of entries 5 to 6 named, in the message at offset 1 that holds 3 to 6", err)
	}
	for _, want := range []string{"holds up to entry 4", "offset 1, which holds entries 3 to 6", "unexpected end of JSON input",
		"so entries 5 to 6 (2 events) cannot be applied again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the report %q does not say %q", err, want)
		}
	}
	if _, err := applyBatch(t, l, events(1)); !errors.As(err, &short) || len(db.applied) != 0 || db.mark != 4 {
		t.Fatalf("the queue's next event: %v, applied %v, mark %d; want it to wait, nothing applied", err, db.applied, db.mark)
	}
	log.Reset()
	if err := l.AcceptLoss(t.Context(), short); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"from_seq=5 to_seq=6 offset=1", "unexpected end of JSON input"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("accepting the loss logged %q, which does not say %q", log.String(), want)
		}
	}
	if n, err := l.Recover(t.Context()); err != nil || n != 2 || db.mark != 8 {
		t.Fatalf("after the loss was accepted: %d applied (%v), mark %d; want 2, mark 8", n, err, db.mark)
	}
	if want := []string{eventID(7), eventID(8)}; !slices.Equal(db.applied, want) {
		t.Errorf("applied %v, want %v", db.applied, want)
	}
}

// A restore that another reader's restore overtook past a message that does not
// parse (that reader's loss accepted and the rest restored) goes on from
// where the other got to: the message's entries are below the mark now,
// and there is no loss left to report.
func TestARestoreOvertakenPastAMessageThatDoesNotParseGoesOn(t *testing.T) {
	db, s := &database{}, &stream{}
	s.put("q.0", 1, 2, journalBody(goodEntry(1), goodEntry(2)))
	s.put("q.0", 3, 3, journalBody(goodEntry(3)))
	s.put("q.0", 4, 6, []byte(`not JSON`))
	s.put("q.0", 7, 8, journalBody(goodEntry(7), goodEntry(8)))
	db.mark = 2
	a, b := newLane(db, s), newLane(db, s)
	db.before = func() { // at a's first commit: b restores, accepts the loss, restores the rest
		_, err := b.Recover(t.Context())
		var short *ShortError
		if !errors.As(err, &short) {
			t.Errorf("the other restore: %v, want the loss reported", err)
			return
		}
		if err := b.AcceptLoss(t.Context(), short); err != nil {
			t.Error(err)
		}
		if _, err := b.Recover(t.Context()); err != nil {
			t.Error(err)
		}
	}
	if _, err := a.Recover(t.Context()); err != nil || a.Mark() != 8 || db.mark != 8 {
		t.Fatalf("the restore the other overtook: %v, lane's mark %d, database's %d; want no error, 8", err, a.Mark(), db.mark)
	}
	if want := []string{eventID(3), eventID(7), eventID(8)}; !slices.Equal(db.applied, want) {
		t.Errorf("applied %v, want %v", db.applied, want)
	}
}
