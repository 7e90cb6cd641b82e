"""``tpuscope bench``: the demo workload, or, when a mode or a benchmark's flag says so, one of our benchmarks.

The workload's own flags are beside it (:func:`tpuscope.workload.runner.add_arguments`); the benchmarks'
are here, with the choice between them, so the workload never imports a benchmark.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tpuscope.workload import runner


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run an instrumented training loop that reports to a sidecar. When no sidecar listens on the socket, one "
        "is started for the run and its /metrics address printed."
    )
    parser.add_argument(
        "mode",
        nargs="?",
        choices=["perf", "flood", "soak", "rule-cost", "fleet-scale", "hangs"],
        help="perf: benchmark tpuscope's own cost against its targets and its peers (table and JSON); "
        "flood: jobs sending at ten times the supported event rate against one sidecar, and what it held; "
        "soak: the workload, a sidecar and a real Prometheus for --minutes, then what was lost (nothing); "
        "rule-cost: what each group of one or more rules files costs Prometheus (samples read, seconds) on a "
        "backfilled fleet; fleet-scale: one sidecar's real series set on N hosts, with the rules, the dashboards' "
        "queries and a peer's rules, against the budgets of docs/fleet.md; hangs: a 4-process job whose worker 1 "
        "hangs three ways, --trials times each, and the clean slow runs that must not page (issue 54's trials)",
    )
    parser.add_argument(
        "--perf-json",
        "--json",
        type=Path,
        help="perf, flood, soak, rule-cost, fleet-scale, hangs: where the JSON goes (default run/perf.json, "
        "run/flood.json, run/soak.json, run/rule-cost.json, run/fleet-scale.json, run/hangs.json)",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="flood: how long to flood (default %(default)s)")
    parser.add_argument("--trials", type=int, default=10, help="hangs: trials of each way (default %(default)s)")
    parser.add_argument("--minutes", type=float, default=10.0, help="soak: how long to run (default %(default)s)")
    parser.add_argument("--tiny", action="store_true", help="perf: a seconds-long run (tests), figures not meaningful")
    parser.add_argument(
        "--scrape-latency",
        type=int,
        metavar="SCRAPES",
        help="benchmark: time this many /metrics scrapes of a sidecar with every collector on (8 fake TPU devices, "
        "8 fake GPUs, the host) while a job sends events",
    )
    parser.add_argument(
        "--trace-cost",
        type=int,
        metavar="STEPS",
        help="benchmark: the per-step cost of spans, unsampled and sampled, over this many empty steps per round",
    )
    parser.add_argument(
        "--overhead",
        action="store_true",
        help="benchmark: the Monitor's cost per step of the JAX workload, on against off, interleaved (uses --steps)",
    )
    rule_cost = parser.add_argument_group("rule-cost")
    rule_cost.add_argument(
        "--rules",
        action="append",
        metavar="[NAME=]FILE",
        help="a rules file to measure, labelled NAME (default: its file name); repeat it to compare, the first "
        "is the baseline of the ratios (default deploy/prometheus/tpuscope-rules.yaml)",
    )
    # Sized to run in a few minutes on this project's 2-core machine; the samples read grow with the hosts.
    rule_cost.add_argument("--hosts", type=int, default=128, help="hosts, 16 to a workload (default %(default)s)")
    # The longest SLO window's; the intervals are deploy/prometheus/prometheus.yml's.
    rule_cost.add_argument("--days", type=float, default=3.0, help="days of history (default %(default)s)")
    rule_cost.add_argument(
        "--interval", default="30s", help="rule evaluation interval, and the recorded series' (default %(default)s)"
    )
    rule_cost.add_argument("--scrape-interval", default="15s", help="sidecar scrape interval (default %(default)s)")
    fleet_scale = parser.add_argument_group("fleet-scale (also --rules: ours, the first one)")
    fleet_scale.add_argument(
        "--fleet-hosts", default="64,256,1000", help="the fleet sizes, comma-separated (default %(default)s)"
    )
    # A dashboard's history is most of the TSDB: 24 h of 1,000 hosts' board series is too much to backfill here.
    fleet_scale.add_argument(
        "--board-hours",
        default="6",
        help="hours of history for the series the dashboards read, one for all sizes or one per size (e.g. "
        "24,24,6); boards are measured over 6 h and 24 h where it holds them (default %(default)s)",
    )
    fleet_scale.add_argument(
        "--peer-rules", type=Path, help="a peer's rules file, measured beside ours (node-exporter-mixin's, rendered)"
    )
    fleet_scale.add_argument(
        "--record-series", type=Path, metavar="FILE", help="record one sidecar's series set into FILE, and stop"
    )
    runner.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    if args.mode == "perf":
        from tpuscope.bench import perf

        return perf.run(tiny=args.tiny, json_path=args.perf_json or Path("run/perf.json"))
    if args.mode == "flood":
        from tpuscope.bench import flood

        return flood.run(args)
    if args.mode == "soak":
        from tpuscope.bench import soak

        return soak.run(args)
    if args.mode == "rule-cost":
        from tpuscope.bench import rule_cost

        return rule_cost.run(args)
    if args.mode == "hangs":
        from tpuscope.bench import hangs

        return hangs.run(args)
    if args.mode == "fleet-scale":
        from tpuscope.bench import fleet_scale

        return fleet_scale.run(args)
    if args.scrape_latency:
        from tpuscope.bench import scrape_latency

        return scrape_latency.run(args.scrape_latency)
    if args.trace_cost:
        from tpuscope.bench import trace_cost

        return trace_cost.run(args.trace_cost)
    if args.overhead:
        from tpuscope.bench import overhead

        return overhead.run(args)
    return runner.run(args)
