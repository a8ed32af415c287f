package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/lib/pq"

	"transferconsumer/event"
)

// Each environment failure is named by what it is, through the wrapping
// translate and the lanes add; the vocabulary stays closed (a code nobody
// listed is "other").
func TestCauseNamesTheFailure(t *testing.T) {
	pgErr := func(code string) error {
		return event.Transient(fmt.Errorf("apply: %w", &pq.Error{Code: pq.ErrorCode(code), Message: "m"}))
	}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"no error", nil, ""},
		{"APPLY_TIMEOUT", pgErr("57014"), CauseStatementTimeout},
		{"lock timeout", pgErr("55P03"), CauseLockTimeout},
		{"serialization failure", pgErr("40001"), CauseSerialization},
		{"deadlock", pgErr("40P01"), CauseSerialization},
		{"read-only transaction on a standby", pgErr("25006"), CauseReadOnly},
		{"read-write begin on a standby", pgErr("0A000"), CauseReadOnly},
		{"rotated password", pgErr("28P01"), CauseLogin},
		{"database renamed", pgErr("3D000"), CauseLogin},
		{"privilege revoked", pgErr("42501"), CausePermission},
		{"function missing", pgErr("42883"), CauseSchema},
		{"table missing", pgErr("42P01"), CauseSchema},
		{"closed for maintenance", pgErr("55000"), CauseUnavailable},
		{"admin shutdown", pgErr("57P01"), CauseUnavailable},
		{"too many connections", pgErr("53300"), CauseUnavailable},
		{"connection failure", pgErr("08006"), CauseUnavailable},
		{"a code nobody listed", pgErr("ZZ999"), CauseOther},
		{"no synchronous standby", event.Transient(fmt.Errorf("begin: %w", ErrNoSyncStandby)), CauseNoSyncStandby},
		{"journal gap", event.Transient(fmt.Errorf("%w: mark 7", event.ErrJournalGap)), CauseJournalGap},
		{"connection refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, CauseUnavailable},
		{"connection cut", io.ErrUnexpectedEOF, CauseUnavailable},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), CauseUnavailable},
		{"attempt timed out", event.Transient(context.DeadlineExceeded), CauseTimeout},
		{"not the server's at all", errors.New("something new"), CauseOther},
	}
	for _, tt := range tests {
		if got := Cause(tt.err); got != tt.want {
			t.Errorf("%s: Cause = %q, want %q", tt.name, got, tt.want)
		}
	}
}
