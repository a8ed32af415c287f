package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/lib/pq"

	"transferconsumer/consumer"
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
		want consumer.Class
	}{
		{"contradicting transition", pgErr("TC001"), consumer.ClassTransition},
		{"balance would overflow", pgErr("22003"), consumer.ClassRejected},
		{"invalid text for a type", pgErr("22P02"), consumer.ClassRejected},
		{"not-null violation", pgErr("23502"), consumer.ClassRejected},
		{"check violation", pgErr("23514"), consumer.ClassRejected},
		{"closed for maintenance", pgErr("55000"), consumer.ClassTransient},
		{"read-only transaction on a standby", pgErr("25006"), consumer.ClassTransient},
		{"read-write begin on a standby", pgErr("0A000"), consumer.ClassTransient},
		{"rotated password", pgErr("28P01"), consumer.ClassTransient},
		{"role not permitted to log in", pgErr("28000"), consumer.ClassTransient},
		{"database renamed", pgErr("3D000"), consumer.ClassTransient},
		{"privilege revoked", pgErr("42501"), consumer.ClassTransient},
		{"function missing", pgErr("42883"), consumer.ClassTransient},
		{"table missing", pgErr("42P01"), consumer.ClassTransient},
		{"lock timeout", pgErr("55P03"), consumer.ClassTransient},
		{"statement timeout", pgErr("57014"), consumer.ClassTransient},
		{"admin shutdown", pgErr("57P01"), consumer.ClassTransient},
		{"I/O error", pgErr("58030"), consumer.ClassTransient},
		{"internal error", pgErr("XX000"), consumer.ClassTransient},
		{"serialization failure", pgErr("40001"), consumer.ClassTransient},
		{"deadlock", pgErr("40P01"), consumer.ClassTransient},
		{"isolation refused by apply_event", pgErr("TC002"), consumer.ClassTransient},
		{"a code nobody listed", pgErr("ZZ999"), consumer.ClassTransient},
		{"connection refused", syscall.ECONNREFUSED, consumer.ClassTransient},
		{"connection cut", io.ErrUnexpectedEOF, consumer.ClassTransient},
		{"attempt timed out", context.DeadlineExceeded, consumer.ClassTransient},
		{"not the server's at all", errors.New("something new"), consumer.ClassTransient},
	}
	for _, tt := range tests {
		if got := consumer.ClassOf(context.Background(), translate(tt.err)); got != tt.want {
			t.Errorf("%s: class %q, want %q", tt.name, got, tt.want)
		}
	}
	if translate(nil) != nil {
		t.Error("translate(nil) is not nil")
	}
}
