package topology

import (
	"fmt"
	"regexp"
)

// Grants are a broker user's permissions on a vhost: three regular
// expressions over the names of the exchanges and queues it may configure
// (declare, delete), write (publish to an exchange, bind a queue) and read
// (consume, get, be the source of a binding). RabbitMQ 4.2.6 and later
// also want some permission on a queue for a passive declare of it.
type Grants struct {
	Configure, Write, Read string
}

// String says g as `rabbitmqctl set_permissions` takes it, in single
// quotes for a shell.
func (g Grants) String() string {
	return fmt.Sprintf("configure '%s', write '%s', read '%s'", g.Configure, g.Write, g.Read)
}

// LeastGrants returns the least permissions the service needs on its vhost
// with topology prefix (README, "In a locked-down estate"): with declare,
// to declare its topology (as `transferconsumer topology` and
// `repartition` do) and consume it; without, to consume a topology made by
// others, publish dead letters to PREFIX.dlx, and read the DLQ's depth
// and look for partition queues beyond QUEUE_COUNT by passive declares.
func LeastGrants(prefix string, declare bool) Grants {
	p := regexp.QuoteMeta(prefix)
	if !declare {
		return Grants{Configure: "^$", Write: `^` + p + `\.dl[xq]$`, Read: `^` + p + `\.[0-9]+$`}
	}
	return Grants{
		Configure: `^` + p + `(\.dlx|\.dlq|\.[0-9]+)?$`,
		Write:     `^` + p + `\.(dlx|dlq|[0-9]+)$`,
		Read:      `^` + p + `(\.dlx|\.[0-9]+)?$`,
	}
}
