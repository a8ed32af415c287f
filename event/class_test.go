package event

import (
	"context"
	"errors"
	"testing"
)

func TestClassOf(t *testing.T) {
	live := context.Background()
	stopping, cancel := context.WithCancelCause(context.Background())
	cancel(ErrShutdown)
	plain := errors.New("x")
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want Class
	}{
		{"nil", live, nil, ""},
		{"plain", live, plain, ClassUnknown},
		{"poison", live, Poison(plain), ClassPoison},
		{"wrapped transient", live, errors.Join(errors.New("ctx"), Transient(plain)), ClassTransient},
		{"poison while stopping stays poison", stopping, Poison(plain), ClassPoison},
		{"conflict while stopping stays conflict", stopping, Conflict(plain), ClassConflict},
		{"transition while stopping stays transition", stopping, Transition(plain), ClassTransition},
		{"rejected while stopping stays rejected", stopping, Rejected(plain), ClassRejected},
		{"transient while stopping", stopping, Transient(plain), ClassShutdown},
		{"unknown while stopping", stopping, plain, ClassShutdown},
	}
	for _, tt := range tests {
		if got := ClassOf(tt.ctx, tt.err); got != tt.want {
			t.Errorf("%s: ClassOf = %q, want %q", tt.name, got, tt.want)
		}
	}
}
