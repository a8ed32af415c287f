package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/config"
	"transferconsumer/dlq"
)

// Reading the DLQ returns each letter to it. On a quorum queue with a
// delivery limit, a return can count as a delivery, and a letter past the
// limit is dropped, with no dead-letter exchange behind the DLQ to catch
// it. The service declares its DLQ with no limit (dlq.QueueArgs); a DLQ an
// estate's administrators declared, or one declared on 3.x and kept
// through an upgrade to 4.x (whose default limit is 20), may have one.
// guardDLQ looks before any read.

// dropsLetters says why reading the DLQ in place would spend its letters'
// deliveries against a limit ("" when it would not); checked is false
// when that could not be told, and why then says why.
func dropsLetters(cfg config.Config, conn *amqp.Connection, version string) (why string, checked bool) {
	queue := dlq.Queue(cfg.Prefix)
	if m := cfg.Management(); m != nil {
		urls, _ := cfg.BrokerURLs()
		if len(urls) > 0 {
			obs, err := m.Observe(context.Background(), urls[0], cfg.Topology(), version)
			if err == nil {
				for _, f := range cfg.Topology().Verify(obs) {
					if f.Object == "queue "+queue && f.Argument == "x-delivery-limit" {
						return f.String(), true
					}
				}
				return "", true
			}
		}
	}
	// Without the management API: declaring the DLQ with the arguments the
	// service gives it succeeds only if the queue has the same; the
	// broker's refusal names the argument that differs.
	ch, err := conn.Channel()
	if err != nil {
		return "a channel: " + err.Error(), false
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		return "", true // no DLQ: the read says so
	}
	_, err = ch.QueueDeclare(queue, true, false, false, false, dlq.QueueArgs(version))
	var ae *amqp.Error
	switch {
	case err == nil:
		return "", true
	case errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed && strings.Contains(ae.Reason, "x-delivery-limit"):
		return fmt.Sprintf("queue %s: its delivery limit is not the service's (the broker said: %s)", queue, ae.Reason), true
	case errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed:
		return "", true // another argument differs, not the limit
	default:
		return fmt.Sprintf("its arguments could not be read (set MANAGEMENT_URL, or give this user configure permission on %s): %v", queue, err), false
	}
}

// returnsSpend reports whether a basic.nack with requeue, the way every
// reader here returns a letter, counts toward a quorum queue's delivery
// limit on the broker of version: on 3.x and 4.0–4.2 it does; from 4.3
// only basic.reject and a closed channel do.
func returnsSpend(version string) bool {
	major, minor := dlq.BrokerVersion(version)
	return major < 4 || (major == 4 && minor < 3)
}

// guardDLQ runs before a command reads the DLQ: where reading would spend
// the letters' deliveries against a limit that drops them, it refuses,
// unless spend (--spend-deliveries) says to read anyway, and then warns on
// w; where the limit is there but this command's returns do not count
// (4.3), or where it could not be checked, it warns on w.
func guardDLQ(cfg config.Config, conn *amqp.Connection, spend bool, w io.Writer) error {
	version, _ := conn.Properties["version"].(string)
	why, checked := dropsLetters(cfg, conn, version)
	queue := dlq.Queue(cfg.Prefix)
	switch {
	case !checked:
		fmt.Fprintf(w, "warning: whether reading %s spends its letters' deliveries against a limit was not checked: %s\n", queue, why)
	case why == "":
	case !returnsSpend(version):
		fmt.Fprintf(w, "warning: %s can drop letters: %s. This command returns letters with basic.nack, which RabbitMQ %s does not count; "+
			"a look in the management UI, or a reader whose channel closes while it holds letters, does\n", queue, why, version)
	case spend:
		fmt.Fprintf(w, "warning: reading spends one delivery of each letter it reads (--spend-deliveries): %s\n", why)
	default:
		return fmt.Errorf("reading %s would spend one delivery of each letter it reads on RabbitMQ %s, and a letter past its limit is dropped: %s. "+
			"Nothing was read; fix the queue as it says, or pass --spend-deliveries to read anyway", queue, version, why)
	}
	return nil
}
