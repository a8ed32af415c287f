package db

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// A transition whose message carries a NUL in a header is a valid event:
// it is applied, waiting for its creation or not, alone or in a batch, and
// when it waits and then contradicts its creation, its dead letter carries
// the header as it came.
func TestTransitionWithANULInAHeaderIsApplied(t *testing.T) {
	for _, batch := range []bool{false, true} {
		name := "event"
		if batch {
			name = "batch"
		}
		t.Run(name, func(t *testing.T) {
			database := testDB(t, 4)
			in := NewInbox(database)
			l := in.Lane(10 * time.Second).(*lane)
			defer l.Close()
			ctx := context.Background()
			apply := func(ev event.Event) (event.Result, error) {
				if !batch {
					return l.Apply(ctx, ev)
				}
				outs, err := l.ApplyBatch(ctx, []event.Event{ev})
				if err != nil {
					return event.Result{}, err
				}
				return outs[0].Result, outs[0].Err
			}
			headers := amqp.Table{
				"x-note":      "before\x00after",
				"k\x00":       "a NUL in a key",
				"x-nested":    amqp.Table{"deep": "\x00"},
				"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			}

			// Waiting for its creation, which then contradicts it.
			transfer := newID()
			done := newEvent(t, newID(), event.TransferCompleted, transfer, "acc_a", "acc_b", 100)
			done.Message.Headers = headers
			done.Message.ContentType = "application/\x00json"
			if _, err := apply(done); err != nil {
				t.Fatalf("the waiting transition with a NUL in a header: %v (class %s), want it applied",
					err, event.ClassOf(ctx, err))
			}
			var waiting int
			if err := database.Get(&waiting, `SELECT count(*) FROM pending_transition WHERE transfer_id = $1`, transfer); err != nil || waiting != 1 {
				t.Fatalf("%d transitions waiting (%v), want 1", waiting, err)
			}
			res, err := apply(newEvent(t, newID(), event.TransferCreated, transfer, "acc_a", "acc_b", 200))
			if err != nil || !res.Outbox {
				t.Fatalf("the contradicted creation: %+v, %v; want applied with a dead letter in the outbox", res, err)
			}
			var letters []event.OutboxLetter
			if _, err := in.DrainOutbox(ctx, func(l event.OutboxLetter) error {
				letters = append(letters, l)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if len(letters) != 1 {
				t.Fatalf("%d dead letters, want the waiting transition's", len(letters))
			}
			if want := event.HeadersJSON(headers); !bytes.Equal(letters[0].Headers, want) {
				t.Errorf("the dead letter's headers are %s, want %s as they came", letters[0].Headers, want)
			}
			var back map[string]any
			if err := json.Unmarshal(letters[0].Headers, &back); err != nil || back["x-note"] != "before\x00after" {
				t.Errorf("x-note came back as %q (%v)", back["x-note"], err)
			}
			if letters[0].ContentType != "application/json" {
				t.Errorf("content type %q, want the NUL left out", letters[0].ContentType)
			}

			// After its creation.
			transfer = newID()
			if _, err := apply(newEvent(t, newID(), event.TransferCreated, transfer, "acc_c", "acc_d", 50)); err != nil {
				t.Fatal(err)
			}
			failed := newEvent(t, newID(), event.TransferFailed, transfer, "acc_c", "acc_d", 50)
			failed.Message.Headers = headers
			if _, err := apply(failed); err != nil {
				t.Fatalf("a transition with a NUL in a header after its creation: %v, want it applied", err)
			}
			var state string
			if err := database.Get(&state, `SELECT state FROM transfer WHERE transfer_id = $1`, transfer); err != nil || state != "failed" {
				t.Errorf("transfer is %q (%v), want failed", state, err)
			}
		})
	}
}
