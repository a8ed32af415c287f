package dlq

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Record is a dropped dead letter as Lines writes it: one JSON object per
// line, enough to see why it failed and to publish it again by hand.
type Record struct {
	DroppedAt time.Time `json:"droppedAt"`
	Queue     string    `json:"queue"` // the DLQ it was dropped from
	EventID   string    `json:"eventId,omitempty"`
	Class     string    `json:"class"`
	Reason    string    `json:"reason,omitempty"`

	// The message's properties as the DLQ delivered it: the exchange is
	// the dead-letter exchange, the routing key the original one.
	Exchange        string     `json:"exchange"`
	RoutingKey      string     `json:"routingKey"`
	MessageID       string     `json:"messageId,omitempty"`
	ContentType     string     `json:"contentType,omitempty"`
	ContentEncoding string     `json:"contentEncoding,omitempty"`
	Timestamp       *time.Time `json:"timestamp,omitempty"`
	// TimestampSeconds holds the timestamp instead, in seconds since 1970,
	// when its year is outside 0 to 9999, which RFC 3339 cannot write.
	TimestampSeconds *int64     `json:"timestampSeconds,omitempty"`
	CorrelationID    string     `json:"correlationId,omitempty"`
	ReplyTo          string     `json:"replyTo,omitempty"`
	Type             string     `json:"type,omitempty"`
	AppID            string     `json:"appId,omitempty"`
	UserID           string     `json:"userId,omitempty"`
	Expiration       string     `json:"expiration,omitempty"`
	DeliveryMode     uint8      `json:"deliveryMode,omitempty"`
	Priority         uint8      `json:"priority,omitempty"`
	Headers          amqp.Table `json:"headers"`

	// Body is the body's exact bytes (base64 in JSON); BodyText the same
	// body as text, for reading, when it is UTF-8.
	Body     []byte `json:"body"`
	BodyText string `json:"bodyText,omitempty"`
}

// NewRecord returns d, a letter of queue described as l, as a Record. Any
// letter the broker can deliver makes a record JSON can write: a header
// float that is NaN or infinite is written as the string "NaN", "+Inf" or
// "-Inf", and a header time outside the years 0 to 9999 as its RFC 3339
// text, which no JSON time takes. A property or header string that is not
// UTF-8 is written with U+FFFD in place of its bad bytes (JSON's rule); the
// body is kept byte for byte.
func NewRecord(d amqp.Delivery, l Letter, queue string, at time.Time) Record {
	r := Record{
		DroppedAt: at.UTC(), Queue: queue, EventID: l.EventID, Class: l.Class, Reason: l.Reason,
		Exchange: d.Exchange, RoutingKey: d.RoutingKey, MessageID: d.MessageId,
		ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		CorrelationID: d.CorrelationId, ReplyTo: d.ReplyTo, Type: d.Type, AppID: d.AppId,
		UserID: d.UserId, Expiration: d.Expiration, DeliveryMode: d.DeliveryMode, Priority: d.Priority,
		Headers: writable(d.Headers).(amqp.Table), Body: d.Body,
	}
	if r.Body == nil {
		r.Body = []byte{}
	}
	if !d.Timestamp.IsZero() {
		ts := d.Timestamp.UTC()
		if y := ts.Year(); 0 <= y && y <= 9999 {
			r.Timestamp = &ts
		} else {
			s := ts.Unix()
			r.TimestampSeconds = &s
		}
	}
	if utf8.Valid(d.Body) {
		r.BodyText = string(d.Body)
	}
	return r
}

// writable returns header value v with what JSON cannot write made text
// (see NewRecord); a table for a nil table.
func writable(v interface{}) interface{} {
	switch v := v.(type) {
	case amqp.Table:
		t := make(amqp.Table, len(v))
		for k, x := range v {
			t[k] = writable(x)
		}
		return t
	case []interface{}:
		out := make([]interface{}, len(v))
		for i, x := range v {
			out[i] = writable(x)
		}
		return out
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return strconv.FormatFloat(v, 'g', -1, 64)
		}
	case float32:
		if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
			return strconv.FormatFloat(f, 'g', -1, 32)
		}
	case time.Time:
		if y := v.UTC().Year(); y < 0 || y > 9999 {
			return v.UTC().Format(time.RFC3339Nano)
		}
	}
	return v
}

// Lines is a Recorder that writes each letter as one line of JSON to W,
// in one write. When W is a regular file it is synced before Record
// returns, so a letter is on disk before it is removed; a failed write or
// sync is cut off again, so the file never keeps half a line.
type Lines struct {
	W     io.Writer
	Queue string           // the DLQ, named in each record
	Now   func() time.Time // time.Now when nil
}

// Record writes d as a Record. It returns an error, and the letter must
// stay, when the record could not be encoded or written whole.
func (w Lines) Record(d amqp.Delivery, l Letter) error {
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	line, err := json.Marshal(NewRecord(d, l, w.Queue, now()))
	if err != nil {
		return fmt.Errorf("encode the record: %w", err)
	}
	return appendLine(w.W, append(line, '\n'))
}

// ReadRecords reads back the records Lines wrote to r, one JSON object a
// line (blank lines are skipped, and the last line may lack its newline).
// JSON keeps no AMQP field types, so a header number comes back as an int64
// when it is whole and a float64 else, a nested table as an amqp.Table, and
// a time or a byte array as the string Lines wrote; the rest of a record
// comes back as it was written. It returns the records before the first line
// that is not one, with an error naming that line.
func ReadRecords(r io.Reader) ([]Record, error) {
	var out []Record
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return out, fmt.Errorf("read record line %d: %w", n, err)
		}
		if len(bytes.TrimSpace(line)) > 0 {
			rec, perr := parseRecord(line)
			if perr != nil {
				return out, fmt.Errorf("record line %d: %w", n, perr)
			}
			out = append(out, rec)
		}
		if err != nil {
			return out, nil
		}
	}
}

func parseRecord(line []byte) (Record, error) {
	var rec Record
	if t := bytes.TrimSpace(line); t[0] != '{' {
		return Record{}, fmt.Errorf("not a record: not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&rec); err != nil {
		return Record{}, fmt.Errorf("not a record: %w", err)
	}
	if dec.More() {
		return Record{}, fmt.Errorf("more than one JSON value")
	}
	headers, err := fromJSON(map[string]interface{}(rec.Headers))
	if err != nil {
		return Record{}, fmt.Errorf("headers: %w", err)
	}
	rec.Headers = headers.(amqp.Table)
	if rec.Body == nil {
		rec.Body = []byte{}
	}
	return rec, nil
}

// fromJSON turns a header value decoded with UseNumber into the type an
// AMQP table holds.
func fromJSON(v interface{}) (interface{}, error) {
	switch v := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return i, nil
		}
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return nil, fmt.Errorf("number %s out of range", v)
		}
		return f, nil
	case map[string]interface{}:
		t := make(amqp.Table, len(v))
		for k, x := range v {
			y, err := fromJSON(x)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			t[k] = y
		}
		return t, nil
	case amqp.Table:
		return fromJSON(map[string]interface{}(v))
	case []interface{}:
		out := make([]interface{}, len(v))
		for i, x := range v {
			y, err := fromJSON(x)
			if err != nil {
				return nil, err
			}
			out[i] = y
		}
		return out, nil
	case nil:
		return nil, nil
	}
	return v, nil // string, bool
}

// Delivery returns the dead letter r recorded as the DLQ delivered it, so
// that Describe reads it as it did before it was dropped (but for the
// header types JSON does not keep: see ReadRecords).
func (r Record) Delivery() amqp.Delivery {
	d := amqp.Delivery{
		Exchange: r.Exchange, RoutingKey: r.RoutingKey, MessageId: r.MessageID,
		ContentType: r.ContentType, ContentEncoding: r.ContentEncoding,
		CorrelationId: r.CorrelationID, ReplyTo: r.ReplyTo, Type: r.Type, AppId: r.AppID,
		UserId: r.UserID, Expiration: r.Expiration, DeliveryMode: r.DeliveryMode, Priority: r.Priority,
		Headers: r.Headers, Body: r.Body,
	}
	if r.Timestamp != nil {
		d.Timestamp = *r.Timestamp
	} else if r.TimestampSeconds != nil {
		d.Timestamp = time.Unix(*r.TimestampSeconds, 0)
	}
	return d
}
