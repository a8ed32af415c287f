package dlq

import (
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Header names a person reads in the management UI ("Get messages") to see
// why a message is in the dead-letter queue. The routing key of the copy stays
// the original one, so "Move messages" or Replay can put it back.
const (
	HeaderClass            = "x-failure-class"
	HeaderReason           = "x-failure-reason"
	HeaderFailedAt         = "x-failed-at"
	HeaderFailedBy         = "x-failed-by"
	HeaderOriginalQueue    = "x-original-queue"
	HeaderOriginalExchange = "x-original-exchange"
	HeaderOriginalKey      = "x-original-routing-key"
	HeaderDeliveryCount    = "x-original-delivery-count"
	// HeaderReplayedAt marks a message that Replay put back.
	HeaderReplayedAt = "x-replayed-at"
	// HeaderReplayRun names the Replay run that put a message back. The
	// consumer's dead-letter copy and the broker's dead-lettering both keep
	// it, so a run recognises a letter it replayed that failed again.
	HeaderReplayRun = "x-replay-run"
	// HeaderReplayCount says how often Replay put a message back, each
	// run adding one; like x-replayed-at (the last time) it survives the
	// message's next dead-lettering, the consumer's copy keeping every
	// header of the delivery and the broker's too.
	HeaderReplayCount = "x-replay-count"
)

// maxReason bounds the reason text: headers travel in one frame, and a long
// error must not make the dead letter itself unpublishable.
const maxReason = 2048

// Failure is why a message is dead-lettered, and where it failed.
type Failure struct {
	Class    string // the failure class, e.g. "poison"
	Reason   string // the error text
	Queue    string // the queue it was consumed from
	Instance string // the service instance that decided
	At       time.Time
}

// Copy returns the publishing that dead-letters d: its body, properties and
// routing key unchanged, its headers plus the failure headers, its group
// (HeaderGroup) among them, fingerprinted from the reason as written. The broker's
// own x-delivery-count is kept as x-original-delivery-count, since the DLQ
// counts its own deliveries under the original name. The user_id property
// is dropped (the broker would refuse it from the service's user): the
// producer lives on in x-original-user-id, which Copy keeps like any header
// of d, so d's must be the one the service judged (consumer.Producers.Admit
// sets it on every delivery), never one a publisher set (adr/0008).
func Copy(d amqp.Delivery, f Failure) amqp.Publishing {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	delete(headers, "x-delivery-count")
	reason := f.Reason
	if len(reason) > maxReason {
		reason = strings.ToValidUTF8(reason[:maxReason], "") + "…"
	}
	headers[HeaderClass] = f.Class
	headers[HeaderReason] = reason
	headers[HeaderGroup] = Fingerprint(f.Class, reason)
	headers[HeaderFailedAt] = f.At.UTC().Format(time.RFC3339Nano)
	headers[HeaderFailedBy] = f.Instance
	headers[HeaderOriginalQueue] = f.Queue
	headers[HeaderOriginalExchange] = d.Exchange
	headers[HeaderOriginalKey] = d.RoutingKey
	headers[HeaderDeliveryCount] = DeliveryCount(d.Headers)
	return publishing(d, headers)
}

// publishing returns d as a persistent publishing with the given headers,
// properties otherwise unchanged. The user_id property is dropped: the broker
// refuses a publish whose user_id is not the publisher's.
func publishing(d amqp.Delivery, headers amqp.Table) amqp.Publishing {
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// ReplayCount returns the x-replay-count in headers, 0 without one.
func ReplayCount(headers amqp.Table) int64 { return headerInt(headers, HeaderReplayCount) }

// DeliveryCount returns a quorum queue delivery's x-delivery-count: 0 on the
// first delivery, when the broker leaves the header out.
func DeliveryCount(headers amqp.Table) int64 { return headerInt(headers, "x-delivery-count") }

// headerInt returns the integer in headers[key], 0 without one. The broker
// sends it as whatever width it chose; a parked letter's headers went
// through JSON (the outbox), so a number may come back as a float64.
func headerInt(headers amqp.Table, key string) int64 {
	switch c := headers[key].(type) {
	case int64:
		return c
	case int32:
		return int64(c)
	case int:
		return int64(c)
	case float64:
		return int64(c)
	}
	return 0
}
