package dlq

import (
	"errors"
	"fmt"
	"regexp"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrChannelClosed is a publish whose channel closed before the broker
// confirmed it. The broker closes a channel that publishes to an exchange
// its user may not write to (403); the library then nacks what was
// unconfirmed and closes the channel's returns, so without the broker's
// reason the refusal would read as a nack, or as an unroutable message.
var ErrChannelClosed = errors.New("the channel closed before the broker confirmed the message")

// Refused is a publish the broker refused: its user may not write to the
// exchange.
type Refused struct {
	Exchange string
	Err      *amqp.Error // the broker's channel.close
}

func (e *Refused) Error() string {
	return fmt.Sprintf("access refused: the broker user may not publish to exchange %s: grant it the write permission on it "+
		"(a write regex matching %s, such as ^%s$): %v", e.Exchange, e.Exchange, regexp.QuoteMeta(e.Exchange), e.Err)
}

func (e *Refused) Unwrap() error { return e.Err }

// Explain returns err, a failed PublishConfirmed to exchange, with the
// broker's reason when the channel closed under it: closes is the
// channel's NotifyClose, registered when it opened. A refusal (403) is a
// *Refused that names the permission to grant. Any other err comes back
// as it is.
func Explain(err error, closes <-chan *amqp.Error, exchange string) error {
	if !errors.Is(err, ErrChannelClosed) || closes == nil {
		return err
	}
	select {
	case e, ok := <-closes:
		switch {
		case !ok || e == nil:
		case e.Code == amqp.AccessRefused:
			return &Refused{Exchange: exchange, Err: e}
		default:
			return fmt.Errorf("%w: %w", err, e)
		}
	default:
	}
	return err
}
