package dlq

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
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
	CorrelationID   string     `json:"correlationId,omitempty"`
	ReplyTo         string     `json:"replyTo,omitempty"`
	Type            string     `json:"type,omitempty"`
	AppID           string     `json:"appId,omitempty"`
	UserID          string     `json:"userId,omitempty"`
	Expiration      string     `json:"expiration,omitempty"`
	DeliveryMode    uint8      `json:"deliveryMode,omitempty"`
	Priority        uint8      `json:"priority,omitempty"`
	Headers         amqp.Table `json:"headers"`

	// Body is the body's exact bytes (base64 in JSON); BodyText the same
	// body as text, for reading, when it is UTF-8.
	Body     []byte `json:"body"`
	BodyText string `json:"bodyText,omitempty"`
}

// NewRecord returns d, a letter of queue described as l, as a Record.
func NewRecord(d amqp.Delivery, l Letter, queue string, at time.Time) Record {
	r := Record{
		DroppedAt: at.UTC(), Queue: queue, EventID: l.EventID, Class: l.Class, Reason: l.Reason,
		Exchange: d.Exchange, RoutingKey: d.RoutingKey, MessageID: d.MessageId,
		ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		CorrelationID: d.CorrelationId, ReplyTo: d.ReplyTo, Type: d.Type, AppID: d.AppId,
		UserID: d.UserId, Expiration: d.Expiration, DeliveryMode: d.DeliveryMode, Priority: d.Priority,
		Headers: d.Headers, Body: d.Body,
	}
	if r.Headers == nil {
		r.Headers = amqp.Table{}
	}
	if r.Body == nil {
		r.Body = []byte{}
	}
	if !d.Timestamp.IsZero() {
		ts := d.Timestamp.UTC()
		r.Timestamp = &ts
	}
	if utf8.Valid(d.Body) {
		r.BodyText = string(d.Body)
	}
	return r
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
	line = append(line, '\n')
	f, ok := w.W.(*os.File)
	if ok {
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			ok = false // a pipe or a terminal: nothing to sync or cut
		}
	}
	if !ok {
		if _, err := w.W.Write(line); err != nil {
			return fmt.Errorf("write the record: %w", err)
		}
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("write the record to %s: %w", f.Name(), err)
	}
	if _, err = f.Write(line); err == nil {
		err = f.Sync()
	}
	if err != nil {
		_ = f.Truncate(fi.Size()) // appended: what was there before stays whole
		return fmt.Errorf("write the record to %s: %w", f.Name(), err)
	}
	return nil
}
