package journal

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// The journal's wire format: how a transaction's entries are written into
// the stream's messages (encode, publishing), and read back from them
// (decode).

// A journal message holds the entries of one transaction, of one queue:
// its headers name the queue and the first and last sequence, its body is
// the entries in JSON (wireEntry). One message per transaction, not per
// event, keeps the broker's work per batch, not per event. A fence, which
// a read appends to know where the stream ended, has only its header.
const (
	hQueue = "x-journal-queue"
	hFirst = "x-journal-first"
	hLast  = "x-journal-last"
	hFence = "x-journal-fence"
	// hQueues, on a message that holds several queues' entries (what
	// several lanes wrote at once, combine.go): by queue, a table of its
	// first and last sequence; the body is then [{"q": queue, "e":
	// entries}, …].
	hQueues = "x-journal-queues"
)

// maxMessage bounds a journal message's body: the entries of a larger
// transaction are split over several messages.
const maxMessage = 1 << 20

// wireEntry is an entry in a journal message's body: the event's delivery
// as it came, with its sequence. The body and the headers are JSON
// already (event.Decode accepted the one, event.HeadersJSON wrote the
// other), so they are written into the entry as they are.
type wireEntry struct {
	Seq         int64           `json:"seq"`
	Dead        bool            `json:"deadLettered,omitempty"`
	Letter      *wireLetter     `json:"letter,omitempty"`
	Type        string          `json:"type,omitempty"`
	MessageID   string          `json:"messageId,omitempty"`
	ContentType string          `json:"contentType,omitempty"`
	RoutingKey  string          `json:"routingKey"`
	Headers     json.RawMessage `json:"headers,omitempty"`
	Body        json.RawMessage `json:"body"`
}

// wireLetter is what a letter's entry keeps besides the message: the
// letter's own fields, and the body, which need not be JSON, in base64.
type wireLetter struct {
	EventID   string `json:"eventId,omitempty"`
	EventType string `json:"eventType,omitempty"`
	Class     string `json:"class"`
	Reason    string `json:"reason"`
	Body      []byte `json:"body"`
}

// appendEntry appends e's wire form to b: its other fields through
// encoding/json, then its headers and body as they are, without the
// copy and the check json.RawMessage would make of them.
func appendEntry(b []byte, e Entry) ([]byte, error) {
	if lt := e.Letter; lt != nil {
		w, err := json.Marshal(wireEntry{Seq: e.Seq, Dead: true, MessageID: lt.MessageID, ContentType: lt.ContentType,
			RoutingKey: lt.RoutingKey, Headers: json.RawMessage(lt.Headers), Body: json.RawMessage("null"),
			Letter: &wireLetter{EventID: lt.EventID, EventType: lt.EventType, Class: lt.Class, Reason: lt.Reason, Body: lt.Body}})
		return append(b, w...), err
	}
	m := e.Event.Message
	meta, err := json.Marshal(wireEntry{Seq: e.Seq, Dead: e.Dead, Type: e.Event.Type, MessageID: m.MessageID,
		ContentType: m.ContentType, RoutingKey: m.RoutingKey, Body: json.RawMessage("null")})
	if err != nil {
		return b, err
	}
	b = append(b, meta[:len(meta)-len(`"body":null}`)]...)
	if h := event.HeadersJSON(m.Headers); h != nil {
		b = append(append(append(b, `"headers":`...), h...), ',')
	}
	b = append(append(b, `"body":`...), m.Body...)
	return append(b, '}'), nil
}

// encode encodes entries, one queue's consecutive ones, as journal
// messages: each holds up to maxMessage bytes of body.
func encode(entries []Entry) ([]event.Spilled, error) {
	var out []event.Spilled
	var m *event.Spilled
	for _, e := range entries {
		if m != nil && len(m.Body) > maxMessage-len(e.Event.Message.Body)-1024 {
			m.Body = append(m.Body, ']')
			m = nil
		}
		if m == nil {
			out = append(out, event.Spilled{First: e.Seq, Body: make([]byte, 1, 64<<10)})
			m = &out[len(out)-1]
			m.Body[0] = '['
		} else {
			m.Body = append(m.Body, ',')
		}
		var err error
		if m.Body, err = appendEntry(m.Body, e); err != nil {
			return nil, fmt.Errorf("entry %d of %s: %w", e.Seq, e.Queue, err)
		}
		m.Last = e.Seq
		m.Entries++
	}
	if m != nil {
		m.Body = append(m.Body, ']')
	}
	return out, nil
}

// publishing is the message that carries m, of queue, to the stream.
func publishing(queue string, m event.Spilled, now time.Time) amqp.Publishing {
	return amqp.Publishing{
		Headers:     amqp.Table{hQueue: queue, hFirst: m.First, hLast: m.Last},
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Timestamp: now,
		Body: m.Body,
	}
}

// decode decodes a journal message's entries of queue, each event with
// the message it was first delivered in. It fails only when the body does
// not parse as a journal message's entries: an entry whose event (or
// headers) no longer decodes is handed over as such (entry), and its
// neighbours with it.
func decode(queue string, body []byte) ([]Entry, error) {
	var wire []wireEntry
	if err := json.Unmarshal(body, &wire); err != nil {
		return nil, err
	}
	out := make([]Entry, len(wire))
	for i, w := range wire {
		out[i] = w.entry(queue)
	}
	return out, nil
}

// entry is w, an entry of queue, as it was journaled. An entry whose event
// was applied and acked once, and no longer decodes (a later release that
// validates more, a body that no longer validates), or whose headers do
// not, comes back dead, with its letter (undecodable): a restore parks
// the letter with the move of the mark past it, and applies its
// neighbours. A dead entry without a letter is never applied again, so its
// event need not decode.
func (w wireEntry) entry(queue string) Entry {
	if lt := w.Letter; lt != nil {
		letter := &event.OutboxLetter{EventID: lt.EventID, EventType: lt.EventType, Class: lt.Class, Reason: lt.Reason,
			RoutingKey: w.RoutingKey, MessageID: w.MessageID, ContentType: w.ContentType, Body: lt.Body,
			Headers: w.Headers, Queue: queue}
		return Entry{Queue: queue, Seq: w.Seq, Dead: true, Letter: letter, Event: event.Event{ID: lt.EventID, Type: lt.EventType}}
	}
	ev, err := event.Decode(w.Body, w.MessageID, w.Type)
	var headers amqp.Table
	if err == nil && len(w.Headers) > 0 {
		if herr := json.Unmarshal(w.Headers, &headers); herr != nil {
			err = event.Poison(fmt.Errorf("its headers are not a table: %w", herr))
		}
	}
	switch {
	case err != nil && w.Dead:
		return Entry{Queue: queue, Seq: w.Seq, Event: ev, Dead: true}
	case err != nil:
		return w.undecodable(queue, ev, err)
	}
	ev.Message = event.Message{RoutingKey: w.RoutingKey, Body: w.Body, Headers: headers, MessageID: w.MessageID, ContentType: w.ContentType}
	return Entry{Queue: queue, Seq: w.Seq, Event: ev, Dead: w.Dead}
}

// undecodable is w, an entry of queue whose event, applied and acked
// once, no longer decodes (err; ev is what could be read of it), as a dead
// entry with its letter: the entry's message as journaled, its class
// err's, and a reason that says so.
func (w wireEntry) undecodable(queue string, ev event.Event, err error) Entry {
	id, typ := cmp.Or(ev.ID, w.MessageID), cmp.Or(ev.Type, w.Type)
	letter := &event.OutboxLetter{EventID: id, EventType: typ, Class: string(event.ClassOf(context.Background(), err)),
		Reason: fmt.Sprintf("applied and acked once, then no longer decodes when applied again from the journal (entry %d of %s): %v",
			w.Seq, queue, err),
		RoutingKey: w.RoutingKey, MessageID: w.MessageID, ContentType: w.ContentType, Body: w.Body, Headers: w.Headers,
		Queue: queue, At: time.Now()}
	return Entry{Queue: queue, Seq: w.Seq, Dead: true, Letter: letter, Undecodable: err, Event: event.Event{ID: id, Type: typ}}
}
