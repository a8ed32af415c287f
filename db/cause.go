package db

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/lib/pq"

	"transferconsumer/event"
)

// The causes Cause names: a small, fixed vocabulary, so that a metric
// labelled with one stays a handful of series (the words of the error
// are in the log and in /readyz).
const (
	CauseStatementTimeout = "statement-timeout" // 57014: APPLY_TIMEOUT (or the role's statement_timeout) ended the attempt
	CauseLockTimeout      = "lock-timeout"      // 55P03
	CauseSerialization    = "serialization"     // 40001, 40P01: a serialization failure or a deadlock
	CauseReadOnly         = "read-only"         // 25006, 0A000: a standby, or a primary demoted by a failover
	CauseUnavailable      = "unavailable"       // unreachable, refused, cut, shutting down, closed for maintenance
	CauseLogin            = "login"             // 28000, 28P01, 3D000: refused login, or no such database
	CausePermission       = "permission"        // 42501: a grant revoked
	CauseSchema           = "schema"            // 42P01, 42883: a table or function missing (a migration not run)
	CauseNoSyncStandby    = "no-sync-standby"   // REQUIRE_SYNC_STANDBY and no synchronous standby named
	CauseJournalGap       = "journal-gap"       // the database lost commits the journal restores (adr/0014)
	CauseTimeout          = "timeout"           // the attempt's own deadline, on the client
	CauseOther            = "other"             // anything else: the log and /readyz have its words
)

// Cause names what an environment failure of the database is, in the
// vocabulary above, for the metrics: it decides nothing (translate does,
// adr/0002). A nil error has no cause ("").
func Cause(err error) string {
	if err == nil {
		return ""
	}
	switch {
	case errors.Is(err, ErrNoSyncStandby):
		return CauseNoSyncStandby
	case errors.Is(err, event.ErrJournalGap):
		return CauseJournalGap
	}
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		switch code := pqErr.Code; {
		case code == "57014":
			return CauseStatementTimeout
		case code == "55P03":
			return CauseLockTimeout
		case code == "40001", code == "40P01":
			return CauseSerialization
		case code == "25006", code == "0A000":
			return CauseReadOnly
		case code == "28000", code == "28P01", code == "3D000":
			return CauseLogin
		case code == "42501":
			return CausePermission
		case code == "42P01", code == "42883":
			return CauseSchema
		case code == "55000", code.Class() == "08", code.Class() == "57", code.Class() == "53":
			return CauseUnavailable
		}
		return CauseOther
	}
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return CauseTimeout
	case errors.As(err, &netErr), errors.Is(err, driver.ErrBadConn), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		return CauseUnavailable
	}
	return CauseOther
}
