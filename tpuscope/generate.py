"""Every generated file the repository commits, and how to write or check them.

``tpuscope generate`` rewrites them; ``tpuscope generate --check`` fails when
any committed file differs from what the code generates now (the test suite
runs it, so a stale artifact fails CI).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from tpuscope import alerts, catalog, dashboards, events, kubernetes
from tpuscope.catalog import Label
from tpuscope.generator_config import GeneratorConfig
from tpuscope.tracing import hooks


def closed(metric: catalog.Metric, label: Label, last: str = ", ") -> str:
    """A metric's closed set of ``label`` values, in backquotes, as the catalogue holds them."""
    values = [f"`{v}`" for v in metric.values(label)]
    return ", ".join(values[:-1]) + (last if len(values) > 1 else "") + values[-1]


def metrics_markdown() -> str:
    """docs/metrics.md: the catalogue as a reference table, grouped as in catalog.py."""
    lines = [
        "# Metrics reference",
        "",
        "Generated from `tpuscope/catalog.py` by `tpuscope generate`; do not edit by hand.",
        "",
        "Every series is exported by `tpuscope serve` on `/metrics`. Prometheus adds `job` and `instance`",
        "from its scrape; tpuscope never sets them. Units are base units: seconds, bytes, ratios 0..1.",
        "",
    ]
    groups: dict[str, list[catalog.Metric]] = {}
    for metric in catalog.CATALOG:
        groups.setdefault(metric.group, []).append(metric)
    for group, metrics in groups.items():
        lines += [f"## {group}", "", "| metric | type | labels | description |", "|---|---|---|---|"]
        for m in metrics:
            labels = ", ".join(f"`{label}`" for label in m.labels) or "none"
            text = m.help
            if m.buckets:
                text += " Buckets: " + ", ".join(f"{b:g}" for b in m.buckets) + "."
            elif m.kind is catalog.Kind.HISTOGRAM:
                text += " Buckets: the source's own bounds."
            lines.append(f"| `{m.name}` | {m.kind} | {labels} | {text} |")
        lines.append("")
    lines += [
        "## Label values",
        "",
        f"- `phase`: {', '.join(events.PHASES)}. `other` is the part of a step no measured phase claims.",
        "- `result`: `ok` or `error` (checkpoints), `hit` or `miss` (compile cache), "
        f"{closed(catalog.INGEST_EVENTS, Label.RESULT, ' or ')} (ingest), "
        f"{closed(catalog.PROFILE_CAPTURES, Label.RESULT)} (`{catalog.PROFILE_CAPTURES.name}`), "
        f"{closed(catalog.PROFILE_PARSES, Label.RESULT)} (`{catalog.PROFILE_PARSES.name}`).",
        f"- `reason` on `{catalog.INGEST_INVALID_EVENTS.name}`: {closed(catalog.INGEST_INVALID_EVENTS, Label.REASON)}. "
        f"On `{catalog.INGEST_CONNECTION_ERRORS.name}`: {closed(catalog.INGEST_CONNECTION_ERRORS, Label.REASON)}.",
        "- `source` on device series: `workload` when the job reported it, `libtpu`, `gke-device-plugin` or `nvml` "
        "when a collector sampled it. A TPU host's chips come from `libtpu` wherever the runtime's metrics service "
        "answers the sidecar (on GKE the device plugin gives every TPU container its ports; on a TPU VM it serves "
        "8431), and `gke-device-plugin` adds TensorCore utilization, which only it has; where libtpu does not "
        "answer the sidecar, everything the plugin has comes from it (docs/fleet.md, Which TPU source, where).",
        f"- `collector`: {closed(catalog.COLLECTOR_UP, Label.COLLECTOR)}. `reason` on "
        f"`{catalog.COLLECTOR_ERRORS.name}`: {closed(catalog.COLLECTOR_ERRORS, Label.REASON)}.",
        "- `direction`: `read` or `write` (disk), `receive` or `transmit` (network). `clock`: `sm` or `memory`.",
        f"- {', '.join(f'`{label}`' for label in catalog.HOST_LABELS)}: on every series, where in a multi-host job "
        f"the sidecar runs (`tpuscope serve {'/'.join(f'--{label}' for label in catalog.HOST_LABELS)}`, by default "
        "from MEGASCALE_SLICE_ID and TPU_WORKER_ID or JOB_COMPLETION_INDEX).",
        "- `tpu_topology`: on every series of a TPU host, the shape of its slice (`4x4`, `8x8x16`), from "
        "`tpuscope serve --tpu-topology`, by default TPU_TOPOLOGY or GKE's TPU device plugin; absent elsewhere.",
        "- `device`: the device's index on its host, whatever the source: a TPU chip's (0 to 7), which the device "
        "plugin's TensorCore utilization, libtpu's HLO metrics (the process's ordinal) and XProf's device planes "
        "count by too; a GPU's NVML index. On a multi-host TPU slice the runtime numbers chips across the slice "
        "(404, 405, 412, 413 on one v5p host), as libtpu's duty cycle and HBM and the plugin's copies of them do: "
        f"`{catalog.TPU_CHIP_INFO.name}` maps each `device` to that `device_id` (jax.Device.id), the host's chips "
        "in increasing id order. `pid` on job series: the process id as the sidecar sees it.",
        "- `buffer_size` on megascale latencies: the runtime's own size buckets, spelled as it spells them (`512B+`, "
        "`1MB+`, `8MB+`: transfers of at least that size; for collective_end_to_end, the collective's input size). "
        "libtpu sends several distributions per size, one per transport (`type`: grpc, rdma) or kind of collective "
        "(`collective_type`: ALL_REDUCE...); they are summed per size, as tpu-info and Cloud Monitoring show them.",
        "",
        "## Device profiles and XProf",
        "",
        "The `tpuscope_profile_*` split agrees with XProf's own converters (`op_profile`, `input_pipeline_analyzer`) "
        "within 1 % per device on two real captures, a Cloud TPU v6e inference run and a V100 training step "
        "(tests/test_reference_traces.py). Where they differ, it is by definition:",
        "",
        "- A TPU run without steps is split by program runs, known across cores by their program and which of its "
        "runs it is. XProf's op profile spans a core from its first op to its last, so its program time and idle "
        "hold the host's gaps between runs; ours sums the runs, and idle is what no op covers inside them.",
        "- XProf times a TPU op by its `device_offset_ps`/`device_duration_ps` stats, ours by the event's own "
        "offset and duration (0.0015 % apart on the v6e capture).",
        "- A GPU step: XProf's ends at the step's last kernel, ours at the next step's first, so the GPU's idle "
        "between steps is in ours.",
        "- A GPU's copies: XProf files part of its device-to-host copies as compute; ours counts no copy as compute "
        "(0.06 % of the V100 step).",
        "- XProf has no step graph for a TPU capture without steps, and no overlapped-collective figure on a TPU: "
        "those are ours alone.",
        "",
    ]
    return "\n".join(lines)


def artifacts(config: GeneratorConfig) -> dict[str, Callable[[], str]]:
    """Path relative to the repository root -> the function that produces its content. The committed artifacts
    are made with the built-in settings; a team renders its own with ``--config`` (and ``--root`` elsewhere)."""
    return {
        "docs/metrics.md": metrics_markdown,
        **{
            f"deploy/grafana/{name}.json": partial(dashboards.file, name, config.thresholds)
            for name in dashboards.DASHBOARDS
        },
        "deploy/kubernetes/grafana-dashboards.yaml": lambda: dashboards.configmaps(config.thresholds),
        **{f"deploy/kubernetes/{name}": partial(render, config) for name, render in kubernetes.MANIFESTS.items()},
        **{
            f"deploy/kubernetes/{kubernetes.GMP_DIR}/{name}": partial(render, config)
            for name, render in kubernetes.GMP_FILES.items()
        },
        "deploy/prometheus/tpuscope-rules.yaml": lambda: alerts.rules_file(config),
        "deploy/alertmanager/alertmanager.yml": lambda: alerts.alertmanager_file(config),
        "docs/alerts.md": lambda: alerts.runbooks_markdown(config),
        "docs/hooks.md": hooks.markdown,
    }


ARTIFACTS = artifacts(kubernetes.BUILT_IN)


def stale(root: Path, config: GeneratorConfig = kubernetes.BUILT_IN) -> list[str]:
    """The artifacts under ``root`` that are missing or differ from what would be generated now."""
    return list(_stale(root, config))


def write(root: Path, config: GeneratorConfig = kubernetes.BUILT_IN) -> list[str]:
    """Write every stale artifact under ``root``; return their paths."""
    changed = _stale(root, config)
    for relative, content in changed.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return list(changed)


def _stale(root: Path, config: GeneratorConfig) -> dict[str, str]:
    """Each stale artifact's path and its content now, each rendered once."""
    made = {relative: render() for relative, render in artifacts(config).items()}
    return {relative: content for relative, content in made.items() if _read(root / relative) != content}


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Regenerate every committed artifact from the code, or check that none is stale."
    parser.add_argument("--root", type=Path, default=Path("."), help="repository root (default .)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if any file is stale")
    parser.add_argument(
        "--config",
        type=Path,
        help="a team's thresholds, routing and links (YAML, as for `tpuscope alerts --config`): the rules, "
        "routing, boards and manifests follow it, the sidecar's --hang-after and --core-state-after included",
    )


def main(args: argparse.Namespace) -> int:
    try:
        config = GeneratorConfig.load(args.config)
    except ValueError as e:
        print(f"tpuscope generate: {e}", file=sys.stderr)
        return 2
    if args.check:
        for path in (found := stale(args.root, config)):
            print(f"stale: {path} (run `tpuscope generate`)", file=sys.stderr)
        return 1 if found else 0
    for path in write(args.root, config):
        print(f"wrote {path}")
    return 0
