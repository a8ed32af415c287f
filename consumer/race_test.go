//go:build race

package consumer

// defaultSchedules is how many schedules the model test runs unless
// MODEL_SCHEDULES says: fewer under the race detector, which checks the
// hand-over between the schedule and the workers' goroutines, not the
// schedules' variety (.ci/mutants and the test without -race run 3,000).
const defaultSchedules = 500
