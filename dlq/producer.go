package dlq

import (
	amqp "github.com/rabbitmq/amqp091-go"
)

// HeaderOriginalUser names the broker user that first published a message
// (adr/0008). The broker checks a message's user_id against the user of the
// connection that publishes it, so a dead letter put back by a replaying
// user cannot keep its first producer's user_id: it carries the first
// producer here instead. A header proves nothing by itself, since any
// publisher may set one; it is believed only from a replaying user, and in
// the service's own dead-letter copies, which the service writes after it
// judged the message.
const HeaderOriginalUser = "x-original-user-id"

// FirstProducer returns the broker user that first published a message that
// carries the user_id property userID and headers: userID itself, unless
// replayer(userID) says it is a replaying user, whose x-original-user-id
// header names the first producer; by is then that replaying user. It
// returns an empty producer when the message shows none: no user_id (a
// header alone proves nothing), or a replay without the header (the letter
// it put back had no producer either).
func FirstProducer(userID string, headers amqp.Table, replayer func(string) bool) (producer, by string) {
	if userID == "" {
		return "", ""
	}
	if replayer == nil || !replayer(userID) {
		return userID, ""
	}
	original, _ := headers[HeaderOriginalUser].(string)
	return original, userID
}

// LetterProducer returns the first producer of dead letter d, "" when it
// shows none. A letter the broker dead-lettered itself (it has x-death: the
// delivery limit, a reject) is the message as it was published, user_id
// included, and is judged as the service judges a delivery (FirstProducer,
// with replayer naming the replaying users). Any other letter is the
// service's own copy, published without user_id, whose x-original-user-id
// the service set to the producer it had judged; a letter from before that
// header existed shows no producer. Trusting the copy's header rests on the
// dead-letter exchange being written to by the service alone (README,
// "The broker's permissions").
//
// A service copy taken for a broker letter (its message carried a forged
// x-death) shows no producer, since the copy has no user_id: the mistake
// fails closed. A broker letter always has x-death, so it is never taken for
// a copy.
func LetterProducer(d amqp.Delivery, replayer func(string) bool) string {
	if deaths, ok := d.Headers["x-death"].([]interface{}); ok && len(deaths) > 0 {
		producer, _ := FirstProducer(d.UserId, d.Headers, replayer)
		return producer
	}
	producer, _ := d.Headers[HeaderOriginalUser].(string)
	return producer
}
