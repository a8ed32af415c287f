package integration

import (
	"context"
	"sync"
	"testing"

	"transferconsumer/db"
	"transferconsumer/event"
)

// Transfers in both directions between the same accounts, applied from many
// goroutines at once, must never deadlock: both balance rows are locked in
// account order whatever the direction. A deadlock would surface here as a
// transient 40P01 error from Apply.
func TestOppositeTransfersNeverDeadlock(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	inbox := db.NewInbox(e.db)
	accounts := []string{"acc_x_" + e.name, "acc_y_" + e.name, "acc_z_" + e.name}

	const workers, perWorker = 8, 60
	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker)
	want := map[string]int64{}
	var mu sync.Mutex
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				from, to := accounts[(w+i)%3], accounts[(w+i+1+i%2)%3]
				tr := newTransfer(from, to, int64(1+i))
				ev, err := event.Decode(tr.body(), "", "")
				if err != nil {
					errs <- err
					return
				}
				if _, err := inbox.Apply(context.Background(), ev); err != nil {
					errs <- err
					continue
				}
				mu.Lock()
				want[from] -= tr.Data.AmountMinor
				want[to] += tr.Data.AmountMinor
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("apply failed: %v", err)
	}
	var sum int64
	for _, a := range accounts {
		if got := e.balance(a); got != want[a] {
			t.Errorf("%s = %d, want %d", a, got, want[a])
		}
		sum += e.balance(a)
	}
	if sum != 0 {
		t.Errorf("balances sum to %d, want 0", sum)
	}
}
