package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/lib/pq"

	"transferconsumer/event"
)

// Only what the message caused leaves the queue: a contradicting
// transition, and data our own statement refuses (SQLSTATE classes 22 and
// 23). Every other failure, listed or not, is the environment's and is
// retried in place (adr/0002).
func TestTranslateByCause(t *testing.T) {
	pgErr := func(code string) error {
		return fmt.Errorf("apply: %w", &pq.Error{Code: pq.ErrorCode(code), Message: "m"})
	}
	tests := []struct {
		name string
		err  error
		want event.Class
	}{
		{"contradicting transition", pgErr("TC001"), event.ClassTransition},
		{"balance would overflow", pgErr("22003"), event.ClassRejected},
		{"invalid text for a type", pgErr("22P02"), event.ClassRejected},
		{"not-null violation", pgErr("23502"), event.ClassRejected},
		{"check violation", pgErr("23514"), event.ClassRejected},
		{"closed for maintenance", pgErr("55000"), event.ClassTransient},
		{"read-only transaction on a standby", pgErr("25006"), event.ClassTransient},
		{"read-write begin on a standby", pgErr("0A000"), event.ClassTransient},
		{"rotated password", pgErr("28P01"), event.ClassTransient},
		{"role not permitted to log in", pgErr("28000"), event.ClassTransient},
		{"database renamed", pgErr("3D000"), event.ClassTransient},
		{"privilege revoked", pgErr("42501"), event.ClassTransient},
		{"function missing", pgErr("42883"), event.ClassTransient},
		{"table missing", pgErr("42P01"), event.ClassTransient},
		{"lock timeout", pgErr("55P03"), event.ClassTransient},
		{"statement timeout", pgErr("57014"), event.ClassTransient},
		{"admin shutdown", pgErr("57P01"), event.ClassTransient},
		{"I/O error", pgErr("58030"), event.ClassTransient},
		{"internal error", pgErr("XX000"), event.ClassTransient},
		{"serialization failure", pgErr("40001"), event.ClassTransient},
		{"deadlock", pgErr("40P01"), event.ClassTransient},
		{"isolation refused by apply_event", pgErr("TC002"), event.ClassTransient},
		{"a code nobody listed", pgErr("ZZ999"), event.ClassTransient},
		{"connection refused", syscall.ECONNREFUSED, event.ClassTransient},
		{"connection cut", io.ErrUnexpectedEOF, event.ClassTransient},
		{"attempt timed out", context.DeadlineExceeded, event.ClassTransient},
		{"not the server's at all", errors.New("something new"), event.ClassTransient},
	}
	for _, tt := range tests {
		if got := event.ClassOf(context.Background(), translate(tt.err)); got != tt.want {
			t.Errorf("%s: class %q, want %q", tt.name, got, tt.want)
		}
	}
	if translate(nil) != nil {
		t.Error("translate(nil) is not nil")
	}
}
