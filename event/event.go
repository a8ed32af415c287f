// Package event is what the consumer and the database side share: the
// transfer event as decoded from a message (Decode), what applying it did
// (Result, Outcome), what a dead letter of it keeps (Message, OutboxLetter,
// HeadersJSON), the failure classes every error is put in (class.go), and
// the ports whose types the database must name to implement them (Lane,
// MarkedLane, JournalSpill: lane.go). It imports no package of the
// project; the consumer's other ports that the database implements
// (Applier, Lanes, Outbox, Parker, Prober) stay in the consumer, and what
// each class does to a delivery is the consumer's decision.
package event

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// The event types of a transfer's life. Any other eventType is poison.
const (
	TransferCreated   = "TransferCreated"   // moves the amount
	TransferCompleted = "TransferCompleted" // created → completed
	TransferFailed    = "TransferFailed"    // created → failed, reversing the amount
)

func knownType(t string) bool {
	return t == TransferCreated || t == TransferCompleted || t == TransferFailed
}

// Event is a decoded, validated transfer event. Every field has been checked
// against the contract, so the database side trusts it as it is.
type Event struct {
	ID         string // eventId, canonical lower-case UUID
	Type       string // eventType
	OccurredAt time.Time
	Transfer   Transfer
	// Fingerprint is a SHA-256 of the event's canonical content. The inbox
	// keeps it so that the same eventId with other content (a producer bug)
	// can be told apart from an honest redelivery.
	Fingerprint []byte
	// Message is the delivery the event came in, set by the consumer; a
	// transition that waits for its creation keeps it for a dead letter.
	Message Message
}

// Transfer is the data of a transfer event. Every type carries all of it:
// the accounts keep the routing key (fromAccount) the same for the whole
// life of a transfer, and the amount lets a consumer check a later event
// against the transfer it names.
type Transfer struct {
	ID          string // transferId, canonical lower-case UUID
	FromAccount string
	ToAccount   string
	AmountMinor int64
	Currency    string
}

type wireEvent struct {
	EventID    string    `json:"eventId"`
	EventType  string    `json:"eventType"`
	OccurredAt string    `json:"occurredAt"`
	Data       *wireData `json:"data"`
}

type wireData struct {
	TransferID  string          `json:"transferId"`
	FromAccount string          `json:"fromAccount"`
	ToAccount   string          `json:"toAccount"`
	AmountMinor json.RawMessage `json:"amountMinor"`
	Currency    string          `json:"currency"`
}

// IsUUID reports whether s is a UUID in its 8-4-4-4-12 hexadecimal form,
// in either case. It is exported for db, which stores a dead letter's
// event id in a uuid column only when it is one.
func IsUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// isCurrency reports whether s is three upper-case ASCII letters.
func isCurrency(s string) bool {
	return len(s) == 3 && 'A' <= s[0] && s[0] <= 'Z' && 'A' <= s[1] && s[1] <= 'Z' && 'A' <= s[2] && s[2] <= 'Z'
}

// Decode parses and validates a message body. messageID and msgType are the
// AMQP properties; when the producer sets them they must agree with the body,
// which is authoritative. Every error it returns is Poison: a body that is not
// a valid event will never become one by retrying. With the error it returns
// what could be read of the event (its ID and type, when they are valid), so
// that the dead letter's log line can name it; the values quoted in the error
// are cut at maxQuoted bytes.
func Decode(body []byte, messageID, msgType string) (Event, error) {
	ev, err := decode(body, messageID, msgType)
	if err != nil {
		return ev, Poison(err)
	}
	return ev, nil
}

// maxQuoted bounds each value an error quotes: a 1 MiB field must not make
// a 1 MiB reason, formatted again at every step and logged at error level.
const maxQuoted = 80

// Quote returns s quoted, cut at maxQuoted bytes with its full length said:
// the way an error's reason names a value a message brought.
func Quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(strings.ToValidUTF8(s[:maxQuoted], "")), len(s))
}

func decode(body []byte, messageID, msgType string) (Event, error) {
	if !utf8.Valid(body) {
		return Event{}, fmt.Errorf("body is not UTF-8")
	}
	var w wireEvent
	if err := json.Unmarshal(body, &w); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return Event{}, fmt.Errorf("body is not a JSON event: %s must be a %s, got a %s", typeErr.Field, typeErr.Type, typeErr.Value)
		}
		return Event{}, fmt.Errorf("body is not a JSON event: %w", err)
	}
	if !IsUUID(w.EventID) {
		return Event{}, fmt.Errorf("eventId %s is not a UUID", Quote(w.EventID))
	}
	ev := Event{ID: lower(w.EventID)}
	if knownType(w.EventType) {
		ev.Type = w.EventType
	}
	if messageID != "" && !strings.EqualFold(messageID, w.EventID) {
		return ev, fmt.Errorf("message_id %s does not match eventId %s", Quote(messageID), Quote(w.EventID))
	}
	if !knownType(w.EventType) {
		return ev, fmt.Errorf("unknown eventType %s", Quote(w.EventType))
	}
	if msgType != "" && msgType != w.EventType {
		return ev, fmt.Errorf("type property %s does not match eventType %s", Quote(msgType), Quote(w.EventType))
	}
	at, err := time.Parse(time.RFC3339Nano, w.OccurredAt)
	if err != nil {
		return ev, fmt.Errorf("occurredAt %s is not an RFC 3339 time", Quote(w.OccurredAt))
	}
	ev.OccurredAt = at.UTC()
	if w.Data == nil {
		return ev, fmt.Errorf("data is missing")
	}
	t, err := decodeTransfer(w.Data)
	if err != nil {
		return ev, err
	}
	ev.Transfer = t
	ev.Fingerprint = fingerprint(ev)
	return ev, nil
}

func decodeTransfer(d *wireData) (Transfer, error) {
	if !IsUUID(d.TransferID) {
		return Transfer{}, fmt.Errorf("data.transferId %s is not a UUID", Quote(d.TransferID))
	}
	if err := checkAccount("data.fromAccount", d.FromAccount); err != nil {
		return Transfer{}, err
	}
	if err := checkAccount("data.toAccount", d.ToAccount); err != nil {
		return Transfer{}, err
	}
	if d.FromAccount == d.ToAccount {
		return Transfer{}, fmt.Errorf("data.fromAccount and data.toAccount are both %s", Quote(d.FromAccount))
	}
	amount, err := parseAmount(d.AmountMinor)
	if err != nil {
		return Transfer{}, err
	}
	if !isCurrency(d.Currency) {
		return Transfer{}, fmt.Errorf("data.currency %s is not three upper-case letters", Quote(d.Currency))
	}
	return Transfer{
		ID:          lower(d.TransferID),
		FromAccount: d.FromAccount,
		ToAccount:   d.ToAccount,
		AmountMinor: amount,
		Currency:    d.Currency,
	}, nil
}

// parseAmount accepts only a JSON integer literal: a string, a fraction or an
// exponent is a producer error, not something to round.
func parseAmount(raw json.RawMessage) (int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, fmt.Errorf("data.amountMinor is missing")
	}
	if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0, fmt.Errorf("data.amountMinor %s is not an integer", Quote(string(raw)))
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("data.amountMinor %s is not an integer number of minor units", Quote(string(raw)))
	}
	if n <= 0 {
		return 0, fmt.Errorf("data.amountMinor %d is not positive", n)
	}
	return n, nil
}

func checkAccount(field, s string) error {
	n := utf8.RuneCountInString(s)
	if n < 1 || n > 64 {
		return fmt.Errorf("%s %s must be 1 to 64 characters", field, Quote(s))
	}
	for _, r := range s {
		if ' ' <= r && r <= '~' {
			continue // printable ASCII, the usual case, without the table lookup
		}
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%s %s has a non-printable character", field, Quote(s))
		}
	}
	return nil
}

// fingerprint hashes the fields that define the event, each followed by a
// NUL byte (which no valid field contains), so that spacing, key order or
// unknown fields in the body do not matter. The inbox keeps it, so these
// bytes must never change: TestFingerprintIsStable pins them.
func fingerprint(ev Event) []byte {
	t := ev.Transfer
	var buf [512]byte // an event's fields fit; a longer one grows the slice
	b := append(buf[:0], ev.Type...)
	b = append(b, 0)
	b = ev.OccurredAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, 0)
	for _, f := range [...]string{t.ID, t.FromAccount, t.ToAccount} {
		b = append(append(b, f...), 0)
	}
	b = strconv.AppendInt(b, t.AmountMinor, 10)
	b = append(b, 0)
	b = append(append(b, t.Currency...), 0)
	sum := sha256.Sum256(b)
	return sum[:]
}

// lower returns s in lower case, without a copy when it already is (as
// producers usually send UUIDs).
func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}
