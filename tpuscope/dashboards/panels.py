"""Shared factories: the panels, variables and dashboard frame every tpuscope dashboard is made of.

One place decides how a tpuscope panel looks (legend, units, thresholds, the
datasource variable, exemplars on the step panels), so the dashboards modules say
only *what* each panel shows and why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import bargauge, heatmap, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.builders.common import (
    GraphThresholdsStyleConfig,
    ReduceDataOptions,
    StackingConfig,
    TableSortByFieldState,
    VizLegendOptions,
)
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
    TextBoxVariable,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.heatmap import HeatmapColorOptions, YAxisConfig
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, dashboard
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from tpuscope import catalog
from tpuscope.dashboards import queries

DATASOURCE = dashboard.DataSourceRef(type_val="prometheus", uid="${datasource}")
ALL = ".*"
TAGS = ["tpuscope"]

# Threshold colours: Grafana's named palette.
GOOD, WARN, BAD = "green", "orange", "red"
NEUTRAL = "text"


# --- thresholds --------------------------------------------------------------------
def thresholds(*steps: tuple[float | None, str]) -> ThresholdsConfig:
    """Absolute steps, lowest first; the first step's value is None (everything below the next)."""
    return (
        ThresholdsConfig().mode(dashboard.ThresholdsMode.ABSOLUTE).steps([dashboard.Threshold(v, c) for v, c in steps])
    )


def high_is_bad(bad: float, warn: float | None = None) -> ThresholdsConfig:
    steps: list[tuple[float | None, str]] = [(None, GOOD)]
    if warn is not None:
        steps.append((warn, WARN))
    return thresholds(*steps, (bad, BAD))


def ratio_high_is_bad(bad: float) -> ThresholdsConfig:
    """For a ratio whose healthy value is 1 (a worker over its peers' median): red above ``bad``, orange halfway
    there."""
    return high_is_bad(bad, 1 + (bad - 1) / 2)


def low_is_bad(bad: float, warn: float | None = None) -> ThresholdsConfig:
    """Red below ``bad``, orange below ``warn``, green above."""
    steps: list[tuple[float | None, str]] = [(None, BAD)]
    if warn is not None:
        steps += [(bad, WARN), (warn, GOOD)]
    else:
        steps.append((bad, GOOD))
    return thresholds(*steps)


def informational() -> ThresholdsConfig:
    """For panels with no good or bad value (a rate, a size): one neutral step."""
    return thresholds((None, NEUTRAL))


# --- queries ---------------------------------------------------------------------------
def query(
    expr: str,
    legend: str = "",
    *,
    instant: bool = False,
    table: bool = False,
    exemplar: bool = False,
    buckets: bool = False,
) -> Dataquery:
    """A Prometheus target. ``instant`` for a stat over the whole range (one evaluation, not one per
    point), ``table`` for a table's rows, ``buckets`` for a heatmap of a histogram's ``le`` series."""
    q = Dataquery().expr(expr).legend_format(legend or "__auto")
    if instant or table:
        q = q.instant()
    if table:
        q = q.format(PromQueryFormat.TABLE)
    if buckets:
        q = q.format(PromQueryFormat.HEATMAP).legend_format("{{le}}")
    if exemplar:
        q = q.exemplar(True)
    return q


def quantile_queries(
    histogram: catalog.Metric,
    quantiles: Sequence[float],
    *,
    by: str = "workload",
    window: str = queries.RATE,
    instant: bool = False,
    rare: bool = False,
    targets: str = "",
) -> list[Dataquery]:
    """One target per quantile, legend ``p95 {{workload}}``; exemplars on the step histogram's highest
    quantile, where the slow steps are (on every line, each exemplar would be drawn once per line)."""
    legend = " ".join("{{" + label.strip() + "}}" for label in by.split(","))
    return [
        query(
            queries.quantile(quantile, histogram, by=by, window=window, rare=rare, targets=targets),
            f"p{quantile * 100:g} {legend}",
            instant=instant,
            exemplar=histogram is catalog.STEP_DURATION and quantile == max(quantiles),
        )
        for quantile in quantiles
    ]


def _with_targets(panel: Any, targets: Sequence[Dataquery]) -> Any:
    if len(targets) > len(REF_IDS):
        raise ValueError(f"at most {len(REF_IDS)} targets a panel")
    for ref, target in zip(REF_IDS, targets, strict=False):
        panel = panel.with_target(target.ref_id(ref))
    return panel


REF_IDS = "ABCDEFGHIJ"


def _common(
    panel: Any, title: str, description: str, unit: str, limits: ThresholdsConfig, span: int, height: int
) -> Any:
    return (
        panel.title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .thresholds(limits)
        .span(span)
        .height(height)
    )


# --- panels ------------------------------------------------------------------------------
def timeseries_panel(
    title: str,
    description: str,
    unit: str,
    *targets: Dataquery,
    limits: ThresholdsConfig | None = None,
    stacked: bool = False,
    min_value: float | None = 0,
    max_value: float | None = None,
    span: int = 12,
    height: int = 8,
    min_interval: str | None = None,
) -> timeseries.Panel:
    """A time series; its thresholds are drawn as dashed lines, so a reader sees where bad begins. ``min_interval``:
    the least step between points (a series recorded over an hour read once an hour: each point is its own hour)."""
    panel = _common(timeseries.Panel(), title, description, unit, limits or informational(), span, height)
    if min_interval is not None:
        panel = panel.interval(min_interval)
    panel = panel.legend(
        VizLegendOptions()
        .show_legend(True)
        .display_mode(common.LegendDisplayMode.TABLE if len(targets) > 1 or stacked else common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
        .calcs(["mean", "max", "lastNotNull"])
    )
    panel = panel.fill_opacity(10).line_width(1).show_points(common.VisibilityMode.NEVER)
    if limits is not None:
        panel = panel.thresholds_style(GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED))
    if stacked:
        panel = panel.stacking(StackingConfig().mode(common.StackingMode.NORMAL)).fill_opacity(60)
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    return _with_targets(panel, targets)  # type: ignore[no-any-return]


def stat_panel(
    title: str,
    description: str,
    unit: str,
    *targets: Dataquery,
    limits: ThresholdsConfig | None = None,
    reduce: str = "lastNotNull",
    span: int = 4,
    height: int = 4,
    units: Mapping[str, str] | None = None,
) -> stat.Panel:
    """One number per series, coloured by its thresholds. ``units``: a target's own unit, by its refId (A, B, ...),
    where the panel's numbers are of different kinds (steps, and seconds)."""
    panel = _common(stat.Panel(), title, description, unit, limits or informational(), span, height)
    panel = panel.reduce_options(ReduceDataOptions().calcs([reduce]).values(False))
    panel = panel.color_mode(common.BigValueColorMode.BACKGROUND if limits else common.BigValueColorMode.NONE)
    panel = panel.graph_mode(common.BigValueGraphMode.AREA)
    for ref, own in (units or {}).items():
        panel = panel.override_by_query(ref, [dashboard.DynamicConfigValue(id_val="unit", value=own)])
    return _with_targets(panel, targets)  # type: ignore[no-any-return]


def memory_available_panel(title: str, description: str, target: Dataquery, low: float) -> timeseries.Panel:
    """Host memory still available, as a share: red under ``low``, amber under three times it."""
    return timeseries_panel(
        title, description, "percentunit", target, limits=low_is_bad(low, 3 * low), max_value=1, span=8
    )


def bar_gauge_panel(
    title: str,
    description: str,
    unit: str,
    *targets: Dataquery,
    limits: ThresholdsConfig | None = None,
    min_value: float = 0,
    max_value: float | None = None,
    span: int = 12,
    height: int = 8,
) -> bargauge.Panel:
    """One bar per series (a workload, a device), for comparing many at a glance."""
    panel = _common(bargauge.Panel(), title, description, unit, limits or informational(), span, height)
    panel = panel.reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    panel = panel.display_mode(common.BarGaugeDisplayMode.GRADIENT).orientation(common.VizOrientation.HORIZONTAL)
    panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    return _with_targets(panel, targets)  # type: ignore[no-any-return]


def heatmap_panel(
    title: str, description: str, unit: str, target: Dataquery, span: int = 12, height: int = 8
) -> heatmap.Panel:
    """A histogram's buckets over time, as Prometheus stores them (no recalculation), exemplars on."""
    panel = (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(span)
        .height(height)
        .calculate(False)
        .y_axis(YAxisConfig().unit(unit))
        .color(
            HeatmapColorOptions()
            .mode(HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .fill("dark-orange")
            .exponent(0.5)
            .steps(64)
            .reverse(False)
        )
        .exemplars_color("rgba(255,0,255,0.7)")
        .thresholds(informational())
    )
    return _with_targets(panel, [target])  # type: ignore[no-any-return]


def table_panel(
    title: str,
    description: str,
    *targets: Dataquery,
    unit: str = "short",
    span: int = 12,
    height: int = 8,
    columns: Sequence[str] = (),
    sort_by: str = "",
) -> table.Panel:
    """Rows of an instant query's labels and value (firing alerts, a fleet's workloads). ``columns``: the value
    column of each target in turn, where several targets' rows are merged into one table on their labels (each
    row a series, each target a column); ``sort_by``: the column whose lowest value is the first row."""
    panel = _common(table.Panel(), title, description, unit, informational(), span, height)
    if columns:
        if len(columns) != len(targets) or len(targets) < 2:
            raise ValueError("columns: one name for each of two or more targets")
        # Grafana names each target's value column "Value #<refId>" (one target's: "Value"); merge joins the rows.
        named = {f"Value #{ref}": column for ref, column in zip(REF_IDS, columns, strict=False)}
        organize = {"excludeByName": {"Time": True}, "indexByName": {}, "renameByName": named}
        panel = panel.transformations(
            [
                dashboard.DataTransformerConfig(id_val="merge", options={}),
                dashboard.DataTransformerConfig(id_val="organize", options=organize),
            ]
        )
    if sort_by:
        panel = panel.sort_by([TableSortByFieldState().display_name(sort_by).desc(False)])
    return _with_targets(panel, targets)  # type: ignore[no-any-return]


def state_panel(
    title: str,
    description: str,
    *targets: Dataquery,
    mappings: Sequence[tuple[str, str, str]],
    span: int = 12,
    height: int = 8,
) -> statetimeline.Panel:
    """Up or down over time, one lane per series; ``mappings`` are (value, text, colour)."""
    panel = _common(statetimeline.Panel(), title, description, "short", informational(), span, height)
    value_map = dashboard.ValueMap(
        options={value: dashboard.ValueMappingResult(text=text, color=color) for value, text, color in mappings},
    )
    panel = panel.mappings([value_map])
    return _with_targets(panel, targets)  # type: ignore[no-any-return]


# --- variables -------------------------------------------------------------------------
def _label_values(
    name: str,
    source: str,
    description: str,
    *,
    label: str = "",
    title: str = "",
    all_value: str | None = ALL,
    single: bool = False,
    hidden: bool = False,
) -> QueryVariable:
    """A variable listing ``label_values(source, label)``, shown as ``title`` (the label, capitalised, by
    default), or not at all if ``hidden``; several values or All unless ``single``."""
    label = label or name
    variable = (
        QueryVariable(name)
        .label(title or label.capitalize())
        .description(description)
        .datasource(DATASOURCE)
        .query(f"label_values({source}, {label})")
        .definition(f"label_values({source}, {label})")
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard.VariableSort.ALPHABETICAL_ASC)
    )
    if hidden:
        variable = variable.hide(dashboard.VariableHide.HIDE_VARIABLE)
    if single:
        return variable.multi(False).include_all(False)
    variable = variable.multi(True).include_all(True)
    variable = variable.current(dashboard.VariableOption(selected=True, text="All", value="$__all"))
    # Without a custom all value, All expands to the values found (`up` is then not read for other exporters).
    return variable.all_value(all_value) if all_value else variable


def variables(
    workload_source: catalog.Metric, *, one_workload: bool = False, job: bool = False, price: bool = False
) -> list[Builder[Any]]:
    """datasource, workload, slice, worker, accelerator, TPU topology (and the scrape job, the chip-hour price).

    ``one_workload``: the panels compare workers of one workload, and would blend several. Such a board also has the
    workload's hosts, hidden (:data:`queries.WORKLOAD_HOSTS`), for the series of a host (its devices, its CPU), which
    have no workload label: without them a panel of one workload's hosts read every host's series before its join.
    """
    build = catalog.BUILD_INFO.name
    result: list[Builder[Any]] = [
        DatasourceVariable("datasource").label("Data source").type("prometheus"),
        _label_values(
            queries.WORKLOAD,
            workload_source.name,
            "The workload label each job reports with (Monitor(workload=...)).",
            single=one_workload,
        ),
        _label_values(
            queries.SLICE,
            build,
            "The slice of a multi-slice job each sidecar labels its series with (tpuscope serve --slice, by "
            "default from MEGASCALE_SLICE_ID).",
        ),
        _label_values(
            queries.WORKER,
            f'{build}{{slice=~"${queries.SLICE}"}}',
            "The worker (host index within its slice) each sidecar labels its series with (tpuscope serve "
            "--worker, by default from TPU_WORKER_ID or an Indexed Job's completion index).",
        ),
        _label_values(
            queries.ACCELERATOR,
            catalog.DUTY_CYCLE.name,
            "The devices shown, by accelerator type (v5e, v5p, v6e, h100, ...) as the collectors found them; "
            "per-workload panels (MFU, cost) are not filtered by it.",
        ),
        _label_values(
            queries.TPU_TOPOLOGY,
            build,
            "The devices shown, by the topology of their TPU slice (2x4, 4x4x4, ...), which each sidecar labels its "
            "series with (tpuscope serve --tpu-topology, by default from TPU_TOPOLOGY or GKE's TPU device plugin); "
            "All includes hosts without one (GPUs). Per-workload panels are not filtered by it.",
            title="TPU topology",
        ),
    ]
    if one_workload:
        result.append(
            _label_values(
                queries.HOST,
                queries.selector(catalog.LAST_STEP),
                "The hosts (scrape targets) of the chosen workload, which its panels of devices and hosts read.",
                label="instance",
                all_value=None,
                hidden=True,
            )
        )
    if job:
        result.append(
            _label_values(
                queries.JOB, build, "The Prometheus job(s) whose targets are tpuscope sidecars.", all_value=None
            )
        )
    if price:
        result.append(
            TextBoxVariable(queries.PRICE)
            .label("Price per chip-hour (USD)")
            .description("What one accelerator chip costs per hour, in US dollars: the basis of every cost panel.")
            .default_value(DEFAULT_CHIP_HOUR_PRICE)
        )
    return result


DEFAULT_CHIP_HOUR_PRICE = "1.20"  # about a TPU v5e chip-hour on demand; users set their own


# --- the dashboard -------------------------------------------------------------------------
@dataclass(frozen=True)
class Section:
    """A row of the dashboard and its panels, laid out left to right in 24 columns. ``numbered_last``: its row and
    panels take their ids after every other section's, wherever it sits: a row added above existing ones leaves
    their panels' ids (a link to one, ``viewPanel=N``) as they were."""

    title: str
    panels: Sequence[Any]
    numbered_last: bool = False


def build(
    uid: str, title: str, description: str, sections: Sequence[Section], variables: Sequence[Builder[Any]]
) -> dict[str, Any]:
    """The dashboard as the JSON object Grafana imports, with panel ids assigned in order."""
    board = (
        Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .time("now-6h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(dashboard.DashboardCursorSync.CROSSHAIR)
        .variables(list(variables))
    )
    for section in sections:
        board = board.with_row(Row(section.title))
        for panel in section.panels:
            board = board.with_panel(panel)
    encoded: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(board.build()))
    # The row, then its panels, section by section (the rows are not collapsed: they hold none).
    rows: list[list[dict[str, Any]]] = []
    remaining = iter(encoded["panels"])
    for section in sections:
        rows.append([next(remaining) for _ in range(1 + len(section.panels))])
    if next(remaining, None) is not None:
        raise ValueError("a panel outside the sections")
    in_order = [row for row, section in zip(rows, sections, strict=True) if not section.numbered_last]
    last = [row for row, section in zip(rows, sections, strict=True) if section.numbered_last]
    for number, panel in enumerate((panel for row in [*in_order, *last] for panel in row), start=1):
        panel["id"] = number
    return encoded


def panels_of(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that shows data (rows hold none)."""
    return [p for p in board["panels"] if p["type"] != "row"]
