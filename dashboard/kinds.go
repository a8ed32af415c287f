package dashboard

import (
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	sdk "github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// The three kinds of panel the dashboard uses: lines over time, figures
// now, and a table of what holds now.

// query is one PromQL query of a panel and its legend.
type query struct{ expr, legend string }

// targets returns qs as the panel's queries, A, B, …: over the time range,
// or instant ones for a figure, or a table's.
func targets(qs []query, instant, table bool) []*prometheus.DataqueryBuilder {
	out := make([]*prometheus.DataqueryBuilder, 0, len(qs))
	for i, q := range qs {
		b := prometheus.NewDataqueryBuilder().
			RefId(string(rune('A' + i))).
			Datasource(datasource).
			Expr(q.expr).
			LegendFormat(q.legend)
		if instant {
			b = b.Instant()
		}
		if table {
			b = b.Format(prometheus.PromQueryFormatTable)
		}
		out = append(out, b)
	}
	return out
}

// lines is a time series panel.
type lines struct {
	title, description, unit string
	queries                  []query
	bars                     bool // counts per interval rather than rates
}

func (p lines) id(id uint32) cog.Builder[sdk.Panel] {
	b := timeseries.NewPanelBuilder().
		Id(id).
		Title(p.title).
		Description(p.description).
		Datasource(datasource).
		Unit(p.unit).
		Min(0).
		Height(8).
		Span(12).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).
			Placement(common.LegendPlacementBottom)).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)).
		FillOpacity(10).
		ShowPoints(common.VisibilityModeNever)
	if p.bars {
		b = b.DrawStyle(common.GraphDrawStyleBars).FillOpacity(60)
	}
	for _, t := range targets(p.queries, false, false) {
		b = b.WithTarget(t)
	}
	return b
}

// figure is a stat panel: each query's latest value, with texts for the
// values that mean a state (mappings) and a colour from red when a value
// reaches red (nil: none is bad).
type figure struct {
	title, description, unit string
	queries                  []query
	mappings                 map[string]string // value → text
	red                      *float64
}

func (p figure) id(id uint32) cog.Builder[sdk.Panel] {
	steps := []sdk.Threshold{{Value: nil, Color: "green"}}
	if p.red != nil {
		steps = append(steps, sdk.Threshold{Value: p.red, Color: "red"})
	}
	b := stat.NewPanelBuilder().
		Id(id).
		Title(p.title).
		Description(p.description).
		Datasource(datasource).
		Unit(p.unit).
		Height(8).
		Span(12).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false)).
		ColorMode(common.BigValueColorModeBackground).
		GraphMode(common.BigValueGraphModeNone).
		TextMode(common.BigValueTextModeValueAndName).
		Orientation(common.VizOrientationAuto).
		Thresholds(sdk.NewThresholdsConfigBuilder().Mode(sdk.ThresholdsModeAbsolute).Steps(steps))
	if len(p.mappings) > 0 {
		options := map[string]sdk.ValueMappingResult{}
		for v, text := range p.mappings {
			options[v] = sdk.ValueMappingResult{Text: ptr(text)}
		}
		b = b.Mappings([]sdk.ValueMapping{{ValueMap: &sdk.ValueMap{Type: sdk.MappingTypeValueToText, Options: options}}})
	}
	for _, t := range targets(p.queries, true, false) {
		b = b.WithTarget(t)
	}
	return b
}

// rows is a table of what the queries return now, one row per series,
// their labels as columns and their value under value.
type rows struct {
	title, description, unit, value string
	queries                         []query
}

func (p rows) id(id uint32) cog.Builder[sdk.Panel] {
	b := table.NewPanelBuilder().
		Id(id).
		Title(p.title).
		Description(p.description).
		Datasource(datasource).
		Unit(p.unit).
		Height(8).
		Span(12).
		NoValue("none").
		Footer(common.NewTableFooterOptionsBuilder().Show(false).Reducer([]string{"sum"})).
		WithTransformation(sdk.DataTransformerConfig{Id: "merge", Options: map[string]any{}}).
		WithTransformation(sdk.DataTransformerConfig{Id: "organize", Options: map[string]any{
			"excludeByName": map[string]any{"Time": true, "__name__": true, "job": true},
			"renameByName":  map[string]any{"Value": p.value},
		}})
	for _, t := range targets(p.queries, true, true) {
		b = b.WithTarget(t)
	}
	return b
}
