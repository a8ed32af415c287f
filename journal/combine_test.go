package journal

import (
	"errors"
	"slices"
	"testing"
	"time"

	"transferconsumer/event"
)

// What several lanes write at once goes in one stream message, and a read
// hands each queue its own entries back from it, as from a message of one
// queue; one lane's write alone keeps the one-queue form. An entry that no
// longer decodes comes back alone, with its letter, in its queue's part; a
// message that no longer parses names, for each queue, the entries it held.
func TestSeveralLanesWritesGoInOneMessageAndComeBackApart(t *testing.T) {
	ev := func(seq int64) Entry {
		id := "ev-" + string(rune('a'+seq))
		return Entry{Seq: seq, Event: event.Event{ID: id, Type: "TransferCreated",
			Message: event.Message{MessageID: id, Body: []byte(`{}`)}}}
	}
	encoded := func(seqs ...int64) []event.Spilled {
		var es []Entry
		for _, s := range seqs {
			es = append(es, ev(s))
		}
		msgs, err := encode(es)
		if err != nil {
			t.Fatal(err)
		}
		return msgs
	}
	round := []*writeReq{{queue: "q.0", msgs: encoded(3, 4)}, {queue: "q.1", msgs: encoded(7)}, {queue: "q.0", msgs: encoded(5)}}
	pubs, err := combine(round, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(pubs) != 1 || pubs[0].Headers[hQueues] == nil {
		t.Fatalf("%d messages, headers %v; want one of several queues", len(pubs), pubs[0].Headers)
	}
	if r := pubs[0].Headers[hQueues]; r != `{"q.0":[3,5],"q.1":[7,7]}` {
		t.Errorf("ranges %v, want q.0's 3 to 5 and q.1's 7", r)
	}
	// A body of {} is no event: each entry comes back alone, as one that
	// no longer decodes, with its letter, in its own queue's part.
	noop := func(Found) error { return nil }
	reads := map[string]*queueRead{"q.0": {after: 3, page: noop}, "q.1": {page: noop}}
	ended, err := takeDelivery(reads, pubs[0].Headers, pubs[0].Body)
	if err != nil || ended != 0 {
		t.Fatalf("ended %d, %v; want each queue's part read", ended, err)
	}
	for q, want := range map[string][]int64{"q.0": {4, 5}, "q.1": {7}} {
		es := reads[q].found.Entries
		if got := seqsOf(es); !slices.Equal(got, want) {
			t.Fatalf("%s got %v, want %v", q, got, want)
		}
		for _, e := range es {
			if e.Undecodable == nil || !e.Dead || e.Letter == nil || e.Letter.Queue != q || string(e.Letter.Body) != "{}" {
				t.Errorf("%s's entry %d: %+v; want it dead, with its letter and why", q, e.Seq, e)
			}
		}
	}
	// A body that does not parse: each queue's part is reported with its
	// range.
	reads = map[string]*queueRead{"q.0": {after: 3, page: noop}, "q.1": {page: noop}}
	ended, err = takeDelivery(reads, pubs[0].Headers, pubs[0].Body[:len(pubs[0].Body)-1])
	var u *unreadable
	if err != nil || ended != 2 || !errors.As(reads["q.0"].err, &u) || u.first != 3 || u.last != 5 {
		t.Fatalf("ended %d, %v, q.0: %v; want both queues' parts named, q.0's 3 to 5", ended, err, reads["q.0"].err)
	}

	// With events that decode, each queue gets its own entries, in order.
	body := []byte(`{"eventId":"6f1c3c9e-9d1e-4c53-9a55-7b1f2c3d4e5f","eventType":"TransferCreated","occurredAt":"2026-07-10T12:00:00Z",` +
		`"data":{"transferId":"0b7d8c2e-1a3f-4e5d-8c9b-2a1f3e4d5c6b","fromAccount":"a","toAccount":"b","amountMinor":5,"currency":"EUR"}}`)
	real, err := event.Decode(body, "", "")
	if err != nil {
		t.Fatal(err)
	}
	real.Message = event.Message{Body: body}
	enc := func(seqs ...int64) []event.Spilled {
		var es []Entry
		for _, s := range seqs {
			es = append(es, Entry{Seq: s, Event: real})
		}
		msgs, _ := encode(es)
		return msgs
	}
	pubs, err = combine([]*writeReq{{queue: "q.0", msgs: enc(3, 4)}, {queue: "q.1", msgs: enc(7)}, {queue: "q.0", msgs: enc(5)}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	reads = map[string]*queueRead{"q.0": {after: 3, page: noop}, "q.1": {page: noop}}
	for _, qr := range reads {
		qr.found.Highest = qr.after
	}
	if ended, err := takeDelivery(reads, pubs[0].Headers, pubs[0].Body); ended != 0 || err != nil {
		t.Fatalf("ended %d, %v", ended, err)
	}
	if got := seqsOf(reads["q.0"].found.Entries); !slices.Equal(got, []int64{4, 5}) || reads["q.0"].found.First != 3 {
		t.Errorf("q.0 got %v (first %d), want 4 5 (first 3)", got, reads["q.0"].found.First)
	}
	if got := seqsOf(reads["q.1"].found.Entries); !slices.Equal(got, []int64{7}) {
		t.Errorf("q.1 got %v, want 7", got)
	}

	one, err := combine([]*writeReq{{queue: "q.1", msgs: enc(8)}}, time.Now())
	if err != nil || len(one) != 1 || one[0].Headers[hQueue] != "q.1" || one[0].Headers[hQueues] != nil {
		t.Fatalf("one lane's write: %v %v, want the one-queue form", one, err)
	}
}
