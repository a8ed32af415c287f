package dlq

import (
	"errors"
	"fmt"
	"sort"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// fakeQueue is a quorum queue as basic.get sees it: the ready messages in
// order, those got and neither acked nor nacked held aside, and those
// another reader returned whose return the queue has not applied yet: a
// passive declare does not count them, and the next get applies them first.
type fakeQueue struct {
	ready     []amqp.Delivery
	returning []amqp.Delivery
	held      map[uint64]amqp.Delivery
	tag       uint64 // also the number of messages handed out
	gets      int
}

func newFakeQueue(n int) *fakeQueue {
	q := &fakeQueue{held: map[uint64]amqp.Delivery{}}
	for i := 0; i < n; i++ {
		q.ready = append(q.ready, amqp.Delivery{MessageId: fmt.Sprintf("m%d", i)})
	}
	return q
}

func (q *fakeQueue) QueueDeclarePassive(name string, _, _, _, _ bool, _ amqp.Table) (amqp.Queue, error) {
	return amqp.Queue{Name: name, Messages: len(q.ready)}, nil
}

func (q *fakeQueue) Get(string, bool) (amqp.Delivery, bool, error) {
	if q.gets++; q.gets > 100 {
		return amqp.Delivery{}, false, errors.New("scan does not stop")
	}
	q.ready = append(append([]amqp.Delivery(nil), q.returning...), q.ready...)
	q.returning = nil
	if len(q.ready) == 0 {
		return amqp.Delivery{}, false, nil
	}
	d := q.ready[0]
	q.ready = q.ready[1:]
	q.tag++
	d.DeliveryTag = q.tag
	q.held[q.tag] = d
	return d, true, nil
}

// Nack returns the held messages up to tag to the tail, in order.
func (q *fakeQueue) Nack(tag uint64, multiple, requeue bool) error {
	if !multiple || !requeue {
		return errors.New("scan returns what it holds with one multiple nack")
	}
	var tags []uint64
	for t := range q.held {
		if t <= tag {
			tags = append(tags, t)
		}
	}
	sort.Slice(tags, func(i, j int) bool { return tags[i] < tags[j] })
	for _, t := range tags {
		q.ready = append(q.ready, q.held[t])
		delete(q.held, t)
	}
	return nil
}

// A scan gets no more messages than the queue held when it started, even
// when each message it visits comes back to the tail (a replayed letter that
// fails again at once) or new dead letters keep arriving.
func TestScanStopsAtTheDepthSeenAtTheStart(t *testing.T) {
	tests := []struct {
		name      string
		start     int
		returning int // of start: returned by another reader a moment before
		visit     func(q *fakeQueue, d amqp.Delivery) (more, acked bool)
		stealAt   int // after this many gets, another client takes every ready message
		wantGot   int
		wantReady int // afterwards, with nothing held
	}{
		{name: "each replayed letter fails again and returns", start: 3, wantGot: 3, wantReady: 3,
			visit: func(q *fakeQueue, d amqp.Delivery) (bool, bool) {
				delete(q.held, d.DeliveryTag) // acked
				d.Headers = amqp.Table{HeaderReplayRun: "run"}
				q.ready = append(q.ready, d)
				return true, true
			}},
		{name: "new letters arrive while listing", start: 3, wantGot: 3, wantReady: 6,
			visit: func(q *fakeQueue, d amqp.Delivery) (bool, bool) {
				q.ready = append(q.ready, amqp.Delivery{MessageId: "new"})
				return true, false
			}},
		{name: "visit says it is done", start: 3, wantGot: 1, wantReady: 3,
			visit: func(*fakeQueue, amqp.Delivery) (bool, bool) { return false, false }},
		{name: "others took messages meanwhile", start: 5, stealAt: 2, wantGot: 2, wantReady: 2,
			visit: func(*fakeQueue, amqp.Delivery) (bool, bool) { return true, false }},
		{name: "a reader returned letters just before", start: 5, returning: 3, wantGot: 5, wantReady: 5,
			visit: func(*fakeQueue, amqp.Delivery) (bool, bool) { return true, false }},
		{name: "empty queue", start: 0, wantGot: 0, wantReady: 0,
			visit: func(*fakeQueue, amqp.Delivery) (bool, bool) { return true, false }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newFakeQueue(tt.start)
			q.returning, q.ready = q.ready[:tt.returning], q.ready[tt.returning:]
			got, depth, err := scan(q, "transfers.dlq", func(d amqp.Delivery, _ Letter) (bool, bool, error) {
				more, acked := tt.visit(q, d)
				if tt.stealAt > 0 && int(q.tag) == tt.stealAt {
					q.ready = nil
				}
				return more, acked, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if depth != tt.start || got != tt.wantGot || int(q.tag) != tt.wantGot {
				t.Errorf("scanned %d (got %d) of depth %d; want %d of %d", got, q.tag, depth, tt.wantGot, tt.start)
			}
			if len(q.held) != 0 || len(q.ready) != tt.wantReady {
				t.Errorf("afterwards %d held and %d ready; want 0 and %d", len(q.held), len(q.ready), tt.wantReady)
			}
		})
	}
}

// A run never replays a letter it put back itself; a later run may.
func TestReplayableSkipsTheRunsOwnLetters(t *testing.T) {
	l := Letter{EventID: "e1", Class: "data-rejected"}
	tests := []struct {
		name    string
		headers amqp.Table
		f       Filter
		want    bool
	}{
		{"never replayed", nil, Filter{}, true},
		{"put back by another run", amqp.Table{HeaderReplayRun: "earlier"}, Filter{}, true},
		{"put back by this run", amqp.Table{HeaderReplayRun: "this"}, Filter{}, false},
		{"put back by this run, matching the filter", amqp.Table{HeaderReplayRun: "this"}, Filter{Class: "data-rejected"}, false},
		{"not matching the filter", nil, Filter{Class: "poison"}, false},
		{"a header of another type", amqp.Table{HeaderReplayRun: int64(1)}, Filter{}, true},
	}
	for _, tt := range tests {
		if got := replayable(amqp.Delivery{Headers: tt.headers}, l, tt.f, "this"); got != tt.want {
			t.Errorf("%s: replayable = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A paced replay's progress says what is left of the depth as it goes: the
// depth is told before the first visit.
func TestScanToldTheDepthBeforeTheFirstVisit(t *testing.T) {
	q := newFakeQueue(4)
	told := 0
	_, depth, err := scanTold(q, "transfers.dlq", func(n int) { told = n }, func(amqp.Delivery, Letter) (bool, bool, error) {
		if told != 4 {
			t.Errorf("visited with the depth told %d, want 4", told)
		}
		return true, false, nil
	})
	if err != nil || depth != 4 {
		t.Fatalf("scan: depth %d, %v", depth, err)
	}
}
