package event

import (
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Message is what a delivery carried besides its decoded event: what a dead
// letter of it needs, should the database decide so after the delivery was
// acked (a transition that waited for its creation and then contradicts it).
type Message struct {
	RoutingKey  string
	Body        []byte
	Headers     amqp.Table
	MessageID   string
	ContentType string
}

// OutboxLetter is a dead letter a transaction left behind, or one the
// service parked during a broker alarm (the consumer's Parker).
type OutboxLetter struct {
	EventID, EventType, Class, Reason  string
	RoutingKey, MessageID, ContentType string
	Body                               []byte
	Headers                            []byte    // JSON, as HeadersJSON wrote it
	Queue                              string    // where it failed, when known
	At                                 time.Time // when it failed, when known
	Parked                             bool      // by a worker, which already logged its decision
	// Abandoned, when a worker parks a letter whose publish an alarm cut
	// short, brings that publish's answer (nil: confirmed): the parker
	// keeps the letter from the drain until it comes, and drops it when it
	// is a confirm, so that the DLQ does not hold the letter twice.
	Abandoned <-chan error
}

// HeadersJSON returns the headers of a message as a JSON object, for the
// database to keep: strings, numbers, booleans, times and nested tables as
// such, anything else as its text. The broker's own x-delivery-count is left
// out.
func HeadersJSON(headers amqp.Table) []byte {
	if len(headers) == 0 {
		return nil
	}
	b, err := json.Marshal(jsonable(headers))
	if err != nil {
		return nil
	}
	return b
}

func jsonable(v any) any {
	switch v := v.(type) {
	case amqp.Table:
		m := make(map[string]any, len(v))
		for k, x := range v {
			if k != "x-delivery-count" {
				m[k] = jsonable(x)
			}
		}
		return m
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = jsonable(x)
		}
		return out
	case string, bool, int, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, nil:
		return v
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case []byte:
		return string(v)
	}
	return fmt.Sprint(v)
}
