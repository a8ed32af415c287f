package db

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"transferconsumer/event"
)

// BenchmarkLaneApply applies one creation per iteration through a lane with
// APPLY_TIMEOUT's default, as a worker does with BATCH_MAX=1, and reports
// the CPU this process spent per event (user and system, from getrusage),
// which is what a lane's own machinery costs; the wall time per event is
// mostly the server's commit. Compare two builds in one sitting:
//
//	go test -run '^$' -bench LaneApply -benchtime 5000x -count 6 ./db
func BenchmarkLaneApply(b *testing.B) {
	database := testDB(b, 4)
	in := NewInbox(database)
	evs := make([]event.Event, b.N)
	for i := range evs {
		evs[i] = newEvent(b, newID(), event.TransferCreated, newID(),
			fmt.Sprintf("acc_bench_%d_a", i), fmt.Sprintf("acc_bench_%d_b", i), 100)
	}
	l := in.Lane(15 * time.Second)
	defer l.Close()
	ctx := context.Background()
	b.ReportAllocs()
	before := cpuTime()
	b.ResetTimer()
	for _, ev := range evs {
		if _, err := l.Apply(ctx, ev); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/op")
}

// cpuTime is the CPU this process has spent so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
