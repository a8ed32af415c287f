package dlq

import (
	"fmt"
	"slices"
	"sort"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Group counts the dead letters of one failure: one fingerprint
// (Letter.Group, see Fingerprint), which is one class.
type Group struct {
	Fingerprint string
	Class       string
	Reason      string // a sample: the first letter's
	Count       int
	// First and Last are the earliest and latest failure (FailedAt) of
	// its letters; zero when none shows one.
	First, Last time.Time
	Queues      []string // where its letters failed, sorted
	Replayed    int      // letters replayed before (Replays > 0)
}

// Summary is what List found in the dead-letter queue.
type Summary struct {
	Total   int      // letters read, whatever the filter
	Matched int      // of those, the ones the filter selects
	Groups  []Group  // of the matched letters, largest first
	Letters []Letter // the first matched ones, in queue order
}

// List reads the dead letters of the topology with prefix without removing
// any: as many as the DLQ held when it started (letters that arrive while it
// reads wait for the next look), holding them unacknowledged while it reads
// and then returning them all. The DLQ has no delivery limit, so returning
// them never drops one (on 3.x they go back to the tail, so the order
// rotates). It keeps the first `first` letters in the summary.
func List(conn *amqp.Connection, prefix string, first int) (Summary, error) {
	return ListMatching(conn, prefix, first, Filter{})
}

// ListMatching is List, with the groups and letters of the summary only
// those f selects (its FailedAfter included); Total still counts every
// letter read.
func ListMatching(conn *amqp.Connection, prefix string, first int, f Filter) (Summary, error) {
	var s Summary
	ch, err := conn.Channel()
	if err != nil {
		return s, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close() // returns anything still held, should scan fail
	var g grouper
	_, _, err = scan(ch, Queue(prefix), func(_ amqp.Delivery, l Letter) (bool, bool, error) {
		s.Total++
		if !f.Match(l) {
			return true, false, nil
		}
		s.Matched++
		g.add(l)
		if len(s.Letters) < first {
			s.Letters = append(s.Letters, l)
		}
		return true, false, nil
	})
	s.Groups = g.groups()
	return s, err
}

// grouper gathers letters into their groups.
type grouper struct {
	byPrint map[string]*Group
}

func (g *grouper) add(l Letter) {
	if g.byPrint == nil {
		g.byPrint = map[string]*Group{}
	}
	gr, ok := g.byPrint[l.Group]
	if !ok {
		gr = &Group{Fingerprint: l.Group, Class: l.Class, Reason: l.Reason}
		g.byPrint[l.Group] = gr
	}
	gr.Count++
	if at := l.FailedAt; !at.IsZero() {
		if gr.First.IsZero() || at.Before(gr.First) {
			gr.First = at
		}
		if at.After(gr.Last) {
			gr.Last = at
		}
	}
	if l.Queue != "" && !slices.Contains(gr.Queues, l.Queue) {
		gr.Queues = append(gr.Queues, l.Queue)
		sort.Strings(gr.Queues)
	}
	if l.Replays > 0 {
		gr.Replayed++
	}
}

// groups returns the groups, largest first, then by fingerprint.
func (g *grouper) groups() []Group {
	out := make([]Group, 0, len(g.byPrint))
	for _, gr := range g.byPrint {
		out = append(out, *gr)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Fingerprint < out[j].Fingerprint
	})
	return out
}
