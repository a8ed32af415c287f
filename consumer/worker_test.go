package consumer

import (
	"slices"
	"testing"

	"transferconsumer/dlq"
	"transferconsumer/event"
)

func TestDecide(t *testing.T) {
	tests := []struct {
		class event.Class
		want  Action
	}{
		{"", ActionAck},
		{event.ClassPoison, ActionDeadLetter},
		{event.ClassConflict, ActionDeadLetter},
		{event.ClassTransition, ActionDeadLetter},
		{event.ClassRejected, ActionDeadLetter},
		{event.ClassUnauthorized, ActionDeadLetter},
		{event.ClassTransient, ActionRetry},
		{event.ClassUnknown, ActionRetry},
		{event.ClassPanic, ActionRetry},
		{event.ClassShutdown, ActionRequeue},
	}
	for _, tt := range tests {
		if got := decide(tt.class); got != tt.want {
			t.Errorf("decide(%q) = %s, want %s", tt.class, got, tt.want)
		}
		if tt.want == ActionDeadLetter && !slices.Contains(dlq.Classes(), string(tt.class)) {
			t.Errorf("dlq.Classes() lacks %q: dlq replay --class would refuse its letters", tt.class)
		}
	}
}
