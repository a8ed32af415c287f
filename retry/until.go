package retry

import (
	"context"
	"time"
)

// Until calls try until it returns nil, waiting b's delay between
// attempts, and tells failed of each failure: the attempt (from 1), its
// error, the delay before the next, and whether a throttled log line of it
// is due (Throttle). It returns the number of attempts tried; when ctx
// ends first, ctx's cause with them. It is the one loop of the service's
// in-place retries that are not a queue's own (those the core drives).
func Until(ctx context.Context, b Backoff, try func() error, failed func(attempt int, err error, delay time.Duration, logDue bool)) (int, error) {
	var th Throttle
	for attempt := 1; ; attempt++ {
		err := try()
		if err == nil {
			return attempt, nil
		}
		if ctx.Err() != nil {
			return attempt, context.Cause(ctx)
		}
		delay := b.Delay(attempt - 1)
		due, _ := th.Due(attempt, err.Error())
		failed(attempt, err, delay, due)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return attempt, context.Cause(ctx)
		}
	}
}
