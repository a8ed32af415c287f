// Package dashboard builds the service's Grafana dashboard from typed Go
// code (Grafana's foundation SDK), so that it is reviewed like the code
// and cannot drift from the metrics: prometheus/dashboard.json is what
// JSON returns, written by `go generate ./dashboard`, and a test fails
// when the committed file is not (dashboard_test.go). The service's
// series are those of observe/metrics.go; RabbitMQ's queue depths and
// consumers come from its rabbitmq_prometheus plugin's per-queue
// endpoint (/metrics/detailed, families queue_coarse_metrics and
// queue_consumer_count), which says them better than the service can.
//
// The binary does not import this package: it only makes a file.
package dashboard

//go:generate go run gen.go

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	sdk "github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// UID is the dashboard's uid: an import over an earlier one replaces it.
const UID = "transferconsumer"

// File is where the dashboard's JSON is committed, from the repository's
// root: beside the alert rules.
const File = "prometheus/dashboard.json"

// Label filters the panels' queries share: the service's series by the
// instance and queue variables, RabbitMQ's by the vhost and queue ones.
const (
	onInstance = `instance=~"$instance"`
	onQueue    = `instance=~"$instance", queue=~"$queue"`
	onBroker   = `vhost=~"$vhost", queue=~"$queue"`
)

// datasource is the Prometheus the dashboard reads: the one chosen in its
// datasource variable.
var datasource = common.DataSourceRef{Type: ptr("prometheus"), Uid: ptr("${datasource}")}

// Build returns the dashboard.
func Build() (sdk.Dashboard, error) {
	b := sdk.NewDashboardBuilder("transferconsumer").
		Uid(UID).
		Description("RabbitMQ to PostgreSQL transfer consumer: what it applies, what waits and why, its dead letters, journal, database and consumers. "+
			"Needs Prometheus scraping the service's /metrics, and RabbitMQ's rabbitmq_prometheus plugin at /metrics/detailed "+
			"(families queue_coarse_metrics and queue_consumer_count) for the broker's panels: see the README, \"A dashboard\".").
		Tags([]string{"transferconsumer", "rabbitmq", "postgresql"}).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(sdk.DashboardCursorSyncCrosshair).
		WithVariable(sdk.NewDatasourceVariableBuilder("datasource").Label("Prometheus").Type("prometheus")).
		WithVariable(variable("instance", "Instance", "transferconsumer_queue_count", "instance",
			"The service's instances (the scrape target's instance label).")).
		WithVariable(variable("queue", "Queue", `transferconsumer_queue_blocked_since_seconds{instance=~"$instance"}`, "queue",
			"The partition queues (TOPOLOGY_PREFIX.0 … QUEUE_COUNT-1).")).
		WithVariable(variable("vhost", "RabbitMQ vhost", "rabbitmq_detailed_queue_messages", "vhost",
			"The broker's vhost, for the rabbitmq_prometheus plugin's series: each vhost has its own queues of these names."))
	id := uint32(0)
	for _, g := range groups() {
		id++
		b = b.WithRow(sdk.NewRowBuilder(g.title).Id(id))
		for _, p := range g.panels {
			id++
			b = b.WithPanel(p.id(id))
		}
	}
	return b.Build()
}

// JSON returns the dashboard as Grafana imports it, indented, with a
// final newline.
func JSON() ([]byte, error) {
	d, err := Build()
	if err != nil {
		return nil, fmt.Errorf("build the dashboard: %w", err)
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode the dashboard: %w", err)
	}
	return append(out, '\n'), nil
}

// variable is a multi-value variable over the values of label in the
// series of selector, "All" meaning any value.
func variable(name, label, selector, of, description string) *sdk.QueryVariableBuilder {
	q := fmt.Sprintf("label_values(%s, %s)", selector, of)
	return sdk.NewQueryVariableBuilder(name).
		Label(label).
		Description(description).
		Datasource(datasource).
		Query(sdk.StringOrMap{String: &q}).
		Definition(q).
		Multi(true).
		IncludeAll(true).
		AllValue(".*").
		Current(sdk.VariableOption{Text: sdk.StringOrArrayOfString{String: ptr("All")},
			Value: sdk.StringOrArrayOfString{String: ptr("$__all")}}).
		Refresh(sdk.VariableRefreshOnTimeRangeChanged).
		Sort(sdk.VariableSortAlphabeticalAsc)
}

// panel is a panel's builder that takes its id.
type panel interface {
	id(uint32) cog.Builder[sdk.Panel]
}

// group is a row of the dashboard and its panels.
type group struct {
	title  string
	panels []panel
}

func ptr[T any](v T) *T { return &v }
