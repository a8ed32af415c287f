package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/config"
	"transferconsumer/dlq"
)

// auditLog is the file each replay and drop appends its run to
// (--audit, else DLQ_AUDIT_LOG); nil when neither names one.
type auditLog struct {
	f       *os.File
	started time.Time
}

// openAudit opens the audit log for a run that changes the DLQ, before the
// run touches it: a log that cannot be opened refuses the run. A dry run
// records nothing. It says on w when there is no log to write to.
func openAudit(cfg config.Config, a dlqArgs, w io.Writer) (*auditLog, error) {
	name := a.audit
	if name == "" {
		name = cfg.DLQAudit
	}
	if a.dryRun {
		return nil, nil
	}
	if name == "" {
		fmt.Fprintf(w, "no audit record of this run: set DLQ_AUDIT_LOG or --audit FILE to keep one\n")
		return nil, nil
	}
	f, err := openRecord(name)
	if err != nil {
		return nil, fmt.Errorf("dlq %s: nothing done: the audit log: %w", a.cmd, err)
	}
	return &auditLog{f: f, started: time.Now()}, nil
}

// write appends run, with who ran it, where and when, and the run's error,
// and closes the log; runErr comes back joined with a failure to write.
func (l *auditLog) write(run dlq.Run, a dlqArgs, conn *amqp.Connection, runErr error) error {
	if l == nil {
		return runErr
	}
	defer l.f.Close()
	run.Started, run.Ended = l.started.UTC(), time.Now().UTC()
	if u, err := user.Current(); err == nil {
		run.User = u.Username
	}
	run.Host, _ = os.Hostname()
	run.BrokerUser = dlq.ConnUser(conn)
	run.Filter = dlq.NewRunFilter(a.filter, a.limit, float64(a.rate))
	if runErr != nil {
		run.Error = runErr.Error()
	}
	if err := dlq.AppendRun(l.f, run); err != nil {
		return errors.Join(runErr, fmt.Errorf("the audit log: %w", err))
	}
	return runErr
}
