"""``tpuscope bench BENCHMARK``: one of tpuscope's own benchmarks, each a subcommand with its own flags.

The flags are here and each benchmark's module is imported only when it runs, as :mod:`tpuscope.cli` does for the
commands. Without a benchmark, ``tpuscope bench`` still runs the demo workload (``tpuscope workload``, as it did
before that command had its own name) with a notice, for one release: its flags are taken here, hidden.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

from tpuscope.workload import runner


def _json(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--json", "--perf-json", type=Path, help=f"where the JSON report goes (default {default})")


def _perf(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run (tests), figures not meaningful")
    _json(parser, "run/perf.json")


def _overhead(parser: argparse.ArgumentParser) -> None:
    runner.add_arguments(parser)


def _trace_cost(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--steps", type=int, default=20_000, help="empty steps per round, per Monitor (default %(default)s)"
    )


def _scrape_latency(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scrapes", type=int, default=1000, help="scrapes to time (default %(default)s)")


def _flood(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to flood (default %(default)s)")
    _json(parser, "run/flood.json")


def _soak(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to run (default %(default)s)")
    _json(parser, "run/soak.json")


def _hangs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=10, help="trials of each way (default %(default)s)")
    _json(parser, "run/hangs.json")


def _interval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval", default="30s", help="rule evaluation interval, and the recorded series' (default %(default)s)"
    )


def _rule_cost(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rules",
        action="append",
        metavar="[NAME=]FILE",
        help="a rules file to measure, labelled NAME (default: its file name); repeat it to compare, the first "
        "is the baseline of the ratios (default deploy/prometheus/tpuscope-rules.yaml)",
    )
    # Sized to run in a few minutes on a 2-core machine; the samples read grow with the hosts.
    parser.add_argument("--hosts", type=int, default=128, help="hosts, 16 to a workload (default %(default)s)")
    # The longest SLO window's; the intervals are deploy/prometheus/prometheus.yml's.
    parser.add_argument("--days", type=float, default=3.0, help="days of history (default %(default)s)")
    _interval(parser)
    parser.add_argument("--scrape-interval", default="15s", help="sidecar scrape interval (default %(default)s)")
    _json(parser, "run/rule-cost.json")


def _fleet_scale(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rules", type=Path, metavar="FILE", help="our rules file (default deploy/prometheus/tpuscope-rules.yaml)"
    )
    parser.add_argument(
        "--fleet-hosts", default="64,256,1000", help="the fleet sizes, comma-separated (default %(default)s)"
    )
    # A dashboard's history is most of the TSDB: 24 h of 1,000 hosts' board series is too much to backfill here.
    parser.add_argument(
        "--board-hours",
        default="6",
        help="hours of history for the series the dashboards read, one for all sizes or one per size (e.g. "
        "24,24,6); boards are measured over 6 h and 24 h where it holds them (default %(default)s)",
    )
    parser.add_argument(
        "--peer-rules", type=Path, help="a peer's rules file, measured beside ours (node-exporter-mixin's, rendered)"
    )
    _interval(parser)
    parser.add_argument(
        "--record-series", type=Path, metavar="FILE", help="record one sidecar's series set into FILE, and stop"
    )
    _json(parser, "run/fleet-scale.json")


# name -> (the line `tpuscope bench --help` shows, the module with its run(args), its flags)
BENCHMARKS: dict[str, tuple[str, str, Callable[[argparse.ArgumentParser], None]]] = {
    "perf": (
        "what tpuscope costs, side by side with its peers measured in the same run, against its targets (a table "
        "and JSON)",
        "tpuscope.bench.perf",
        _perf,
    ),
    "overhead": (
        "the Monitor's cost per step of the JAX workload, on against off, interleaved (the workload's flags; --steps)",
        "tpuscope.bench.overhead",
        _overhead,
    ),
    "trace-cost": (
        "the per-step cost of spans, unsampled and sampled, on empty steps",
        "tpuscope.bench.trace_cost",
        _trace_cost,
    ),
    "scrape-latency": (
        "a sidecar's /metrics scrape time with every collector on (8 fake TPU chips, 8 fake GPUs, the host) while a "
        "job sends events",
        "tpuscope.bench.scrape_latency",
        _scrape_latency,
    ),
    "flood": (
        "jobs sending at ten times the supported event rate against one sidecar, and what it held",
        "tpuscope.bench.flood",
        _flood,
    ),
    "soak": (
        "the workload, a sidecar and a real Prometheus for --minutes, then what was lost (nothing)",
        "tpuscope.bench.soak",
        _soak,
    ),
    "hangs": (
        "a 4-process job whose worker 1 hangs three ways, --trials times each, and the clean slow runs that must "
        "not page",
        "tpuscope.bench.hangs",
        _hangs,
    ),
    "rule-cost": (
        "what each group of one or more rules files costs Prometheus (samples read, seconds) on a backfilled fleet",
        "tpuscope.bench.rule_cost",
        _rule_cost,
    ),
    "fleet-scale": (
        "one sidecar's real series set on N hosts, with the rules, the dashboards' queries and a peer's rules, "
        "against the budgets of docs/fleet.md",
        "tpuscope.bench.fleet_scale",
        _fleet_scale,
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    benchmarks = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for name, (summary, module, flags) in BENCHMARKS.items():
        benchmark = benchmarks.add_parser(name, help=summary)
        flags(benchmark)
        benchmark.description = summary[0].upper() + summary[1:] + "."
        benchmark.set_defaults(benchmark_module=module)
    # `tpuscope bench --steps 300 ...`: the workload, as before it had its own command (for one release).
    taken = len(parser._actions)  # argparse keeps no public list of a parser's arguments
    runner.add_arguments(parser)
    for action in parser._actions[taken:]:
        action.help = argparse.SUPPRESS
    parser.description = "Run one of tpuscope's own benchmarks (the demo workload is `tpuscope workload`)."


def main(args: argparse.Namespace) -> int:
    if args.benchmark is None:
        print(
            "tpuscope bench: running the workload as `tpuscope bench` is deprecated and will be removed in the next "
            "release: run `tpuscope workload` with the same flags",
            file=sys.stderr,
        )
        argv: list[str] = getattr(args, "argv", None) or []
        if "bench" in argv:  # a job of --processes runs its workers with the new name
            argv[argv.index("bench")] = "workload"
        return runner.run(args)
    module = importlib.import_module(args.benchmark_module)
    return int(module.run(args))
