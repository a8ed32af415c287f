package dlq

import (
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A publish to an exchange the user may not write to closes the channel
// (403): the library nacks the message and closes the returns, and Explain
// makes of it a refusal that names the permission to grant.
func TestExplainNamesTheRefusedPermission(t *testing.T) {
	closed := func(e *amqp.Error) <-chan *amqp.Error {
		c := make(chan *amqp.Error, 1)
		if e != nil {
			c <- e
		}
		close(c)
		return c
	}
	refused := &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED - write access to exchange 'transfers.dlx' in vhost '/' refused for user 'svc'"}
	other := errors.New("broker nacked the message")
	tests := []struct {
		name    string
		err     error
		closes  <-chan *amqp.Error
		refused bool
		says    []string
	}{
		{"refused", ErrChannelClosed, closed(refused), true, []string{"access refused", "transfers.dlx", "write permission", `^transfers\.dlx$`, "403"}},
		{"closed for another reason", ErrChannelClosed, closed(&amqp.Error{Code: amqp.InternalError, Reason: "INTERNAL_ERROR"}), false, []string{"closed", "INTERNAL_ERROR"}},
		{"closed without a reason", ErrChannelClosed, closed(nil), false, []string{"closed before the broker confirmed"}},
		{"not a close", other, closed(refused), false, []string{"broker nacked"}},
		{"no close registered", ErrChannelClosed, nil, false, []string{"closed before"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Explain(tt.err, tt.closes, "transfers.dlx")
			var r *Refused
			if errors.As(err, &r) != tt.refused {
				t.Errorf("Refused = %v, want %v: %v", !tt.refused, tt.refused, err)
			}
			for _, s := range tt.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not say %q", err, s)
				}
			}
		})
	}
}
