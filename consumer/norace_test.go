//go:build !race

package consumer

// defaultSchedules is how many schedules the model test runs unless
// MODEL_SCHEDULES says.
const defaultSchedules = 3000
