"""The ``tpuscope`` command: ``serve`` the sidecar, run a ``bench`` workload, ``generate`` artifacts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tpuscope import __version__, events
from tpuscope.exporter import config as serve_config


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tpuscope",
        description="Observability for TPU (and GPU) training fleets.",
    )
    parser.add_argument("--version", action="version", version=f"tpuscope {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the sidecar exporter",
        description="Receive events from instrumented jobs on a Unix socket and serve them, with the "
        "sidecar's own health, as Prometheus metrics on /metrics. Stops cleanly on SIGTERM.",
    )
    serve_config.add_arguments(serve)
    serve.set_defaults(run=_serve)

    bench = commands.add_parser(
        "bench",
        help="run the instrumented benchmark workload",
        description="Run an instrumented training loop that reports to a sidecar. When no sidecar listens "
        "on the socket, one is started for the run and its /metrics address printed.",
    )
    bench.add_argument(
        "mode",
        nargs="?",
        choices=["perf", "flood", "soak"],
        help="perf: benchmark tpuscope's own cost against its targets and its peers (table and JSON); "
        "flood: jobs sending at ten times the supported event rate against one sidecar, and what it held; "
        "soak: the workload, a sidecar and a real Prometheus for --minutes, then what was lost (nothing)",
    )
    bench.add_argument(
        "--perf-json",
        type=Path,
        help="perf, flood, soak: where the JSON goes (default run/perf.json, run/flood.json, run/soak.json)",
    )
    bench.add_argument("--seconds", type=float, default=30.0, help="flood: how long to flood (default %(default)s)")
    bench.add_argument("--minutes", type=float, default=10.0, help="soak: how long to run (default %(default)s)")
    bench.add_argument("--tiny", action="store_true", help="perf: a seconds-long run (tests), figures not meaningful")
    bench.add_argument(
        "--synthetic",
        action="store_true",
        help="a JAX-free loop with realistic phase timings (tests, fleet simulation)",
    )
    bench.add_argument("--steps", type=int, default=200, help="training steps to run (default %(default)s)")
    bench.add_argument("--workload", default="bench", help="the workload label (default %(default)s)")
    bench.add_argument(
        "--socket",
        type=Path,
        default=None,
        help=f"the sidecar's socket (default ${events.SOCKET_ENV}, else {events.default_socket_path()})",
    )
    bench.add_argument(
        "--listen",
        default=f"127.0.0.1:{serve_config.DEFAULT_PORT}",
        help="where a sidecar started by bench serves /metrics (default %(default)s)",
    )
    bench.add_argument("--record", type=Path, help="also append every event to this file as JSON lines")
    bench.add_argument("--checkpoint-every", type=int, default=50, help="save a checkpoint every N steps; 0: never")
    bench.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="FAULT[=VALUE]",
        help="cause a fault: slow-io, stall, straggler, recompile, ckpt-fail, crash, spill (repeatable; "
        "docs/bench.md says what each does)",
    )
    bench.add_argument(
        "--linger", type=float, default=0.0, help="keep a sidecar bench started serving this many seconds after the run"
    )
    bench.add_argument(
        "--scrape-latency",
        type=int,
        metavar="SCRAPES",
        help="benchmark: time this many /metrics scrapes of a sidecar with every collector on (8 fake TPU devices, "
        "8 fake GPUs, the host) while a job sends events",
    )
    bench.add_argument(
        "--trace-cost",
        type=int,
        metavar="STEPS",
        help="benchmark: the per-step cost of spans, unsampled and sampled, over this many empty steps per round",
    )
    jax_flags = bench.add_argument_group("the JAX workload")
    jax_flags.add_argument(
        "--overhead",
        action="store_true",
        help="benchmark: the Monitor's cost per step, on against off, interleaved (uses --steps)",
    )
    jax_flags.add_argument("--fused", action="store_true", help="run each step as one program, as a TPU job would")
    jax_flags.add_argument("--d-model", type=int, default=64, help="model width (default %(default)s)")
    jax_flags.add_argument("--layers", type=int, default=2, help="transformer layers (default %(default)s)")
    jax_flags.add_argument("--heads", type=int, default=4, help="attention heads (default %(default)s)")
    jax_flags.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default %(default)s)")
    jax_flags.add_argument("--batch-per-device", type=int, default=4, help="sequences per device (default %(default)s)")
    jax_flags.add_argument(
        "--io-latency",
        type=float,
        default=0.005,
        help="seconds the input pipeline takes per batch (default %(default)s)",
    )
    jax_flags.add_argument("--async-checkpoint", action="store_true", help="write checkpoints in the background")
    jax_flags.add_argument(
        "--run-dir", type=Path, default=Path("run/bench"), help="checkpoints go here (default %(default)s)"
    )
    jax_flags.add_argument("--compile-cache", type=Path, help="persistent XLA compilation cache directory")
    jax_flags.add_argument(
        "--calibrate", action="store_true", help="measure the CPU's matmul peak FLOP/s again (for MFU)"
    )
    jax_flags.add_argument(
        "--cpu-devices", type=int, default=8, help="CPU devices JAX gets when XLA_FLAGS does not say (default 8)"
    )
    synth = bench.add_argument_group("the synthetic workload")
    synth.add_argument("--step-time", type=float, default=0.05, help="mean step time, seconds (default %(default)s)")
    bench.set_defaults(run=_bench)

    fleet = commands.add_parser(
        "fleet-sim",
        help="simulate a fleet: a sidecar per host, a real Prometheus with the rules, injected faults",
        description="Start a real sidecar per simulated host (a fake TPU runtime of --chips chips each), jobs "
        "stepping in lockstep workloads through a Monitor per host, and a real Prometheus scraping them all with "
        "the generated rules, every duration in them divided by --time-scale. One host straggles, one workload "
        "stalls. Prints and writes (--json) what Prometheus and the sidecars cost and what the alerts named; exits 1 "
        "when TpuscopeStraggler does not name exactly the injected worker (docs/bench.md).",
    )
    fleet.add_argument("--hosts", type=int, default=16, help="simulated hosts, one sidecar each (default %(default)s)")
    fleet.add_argument("--chips", type=int, default=4, help="TPU chips per host (default %(default)s)")
    fleet.add_argument(
        "--hosts-per-workload", type=int, default=8, help="hosts of one lockstep job (default %(default)s)"
    )
    fleet.add_argument(
        "--hosts-per-slice", type=int, default=4, help="hosts per slice of a workload (default %(default)s)"
    )
    fleet.add_argument(
        "--time-scale",
        type=float,
        default=10.0,
        help="divide every range, offset and for: of the rules, and the thresholds that are times, by this "
        "(default %(default)s: 5m windows of 30 s)",
    )
    fleet.add_argument(
        "--scrape-interval",
        type=float,
        default=2.0,
        help="Prometheus' scrape and evaluation interval, seconds (default %(default)s)",
    )
    fleet.add_argument(
        "--collector-interval", type=float, default=5.0, help="the sidecars' libtpu interval (default %(default)s)"
    )
    fleet.add_argument("--step-time", type=float, default=0.5, help="mean step time, seconds (default %(default)s)")
    fleet.add_argument(
        "--straggler-factor",
        type=float,
        default=1.5,
        help="the straggler's compute time over its peers' (default %(default)s)",
    )
    fleet.add_argument(
        "--seconds", type=float, default=600.0, help="the longest the run may take (default %(default)s)"
    )
    fleet.add_argument("--seed", type=int, default=0, help="picks the straggler and the jitter (default %(default)s)")
    fleet.add_argument(
        "--run-dir",
        type=Path,
        default=Path("run/fleet"),
        help="Prometheus' configuration, rules and data, the jobs' plan and log (default %(default)s)",
    )
    fleet.add_argument("--json", type=Path, help="where the JSON report goes (default run/fleet.json)")
    fleet.set_defaults(run=_fleet_sim)

    top = commands.add_parser(
        "top",
        help="a live terminal view of a sidecar: devices, workloads' step time and phases, alerts",
        description="Draw a sidecar's /metrics in the terminal, refreshed: each device's duty cycle and HBM, "
        "each workload's steps/s, step time and phase breakdown, compile time, checkpoint age and goodput, and "
        "with --prometheus the firing tpuscope alerts. Over ssh: run it on the host, or tunnel the port.",
    )
    top.add_argument(
        "url",
        nargs="?",
        default="localhost:9478",
        help="the sidecar's /metrics URL, or HOST:PORT (default %(default)s)",
    )
    top.add_argument("--refresh", type=float, default=2.0, help="seconds between refreshes (default %(default)s)")
    top.add_argument("--prometheus", default="", help="a Prometheus URL, to show the firing tpuscope alerts")
    top.add_argument("--once", action="store_true", help="print one frame and exit (1 if the sidecar is unreachable)")
    top.set_defaults(run=_top)

    report = commands.add_parser(
        "report",
        help="a run report for a post-mortem or a ticket: an HTML page and PNGs, from Prometheus or a recording",
        description="Write a self-contained HTML page (and each chart as a PNG, and the data as JSON) of one "
        "workload over a window: step time, where it went by phase, wall time by goodput category, the compile "
        "and checkpoint timelines, and the alerts that fired. From Prometheus, or with no Prometheus at all from "
        "a recording of the job's events (tpuscope bench --record, or a Monitor with a RecordSink).",
    )
    source = report.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="read the workload's series and alerts from Prometheus")
    source.add_argument("--recording", type=Path, metavar="FILE", help="read a recording of the job's events")
    report.add_argument("--workload", help="the workload (needed with --prometheus; a recording of one may omit it)")
    report.add_argument(
        "--since",
        help="how far back the window reaches, e.g. 30m, 6h, 2d (default: from Prometheus 6h; the whole recording)",
    )
    report.add_argument(
        "--until",
        help="when the window ends: RFC 3339 (2026-11-23T03:10:00Z) or Unix seconds (default: now, or the "
        "recording's end)",
    )
    report.add_argument("--out", type=Path, help="directory to write into (default ./tpuscope-report-WORKLOAD)")
    report.set_defaults(run=_report)

    boards = commands.add_parser(
        "dashboards",
        help="write the Grafana dashboards as JSON files",
        description="Write the Grafana dashboards (fleet overview, on-call, job debug, serving) as JSON files "
        "to import into Grafana or provision from a directory.",
    )
    boards.add_argument("--out", type=Path, required=True, help="directory to write NAME.json files into")
    boards.set_defaults(run=_dashboards)

    alerting = commands.add_parser(
        "alerts",
        help="write the Prometheus rules and the Alertmanager configuration",
        description="Write tpuscope-rules.yaml (recording and alert rules) and alertmanager.yml (page and ticket "
        "routing), with the thresholds, webhooks and links of --config.",
    )
    alerting.add_argument("--out", type=Path, required=True, help="directory to write the two files into")
    alerting.add_argument("--config", type=Path, help="YAML: thresholds, webhook URLs, runbook and Grafana URLs")
    alerting.set_defaults(run=_alerts)

    gen = commands.add_parser(
        "generate",
        help="write the committed generated files (docs/metrics.md, ...)",
        description="Regenerate every committed artifact from the code, or check that none is stale.",
    )
    gen.add_argument("--root", type=Path, default=Path("."), help="repository root (default .)")
    gen.add_argument("--check", action="store_true", help="change nothing; exit 1 if any file is stale")
    gen.set_defaults(run=_generate)

    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except serve_config.ConfigError as e:
        parser.exit(2, f"tpuscope {args.command}: error: {e}\n")
    except KeyboardInterrupt:
        return 130


def _serve(args: argparse.Namespace) -> int:
    from tpuscope.exporter.daemon import serve

    return serve(serve_config.resolve(args))


def _bench(args: argparse.Namespace) -> int:
    """The workload, or one of tpuscope's own benchmarks (tpuscope/bench/) when a mode or flag names one."""
    if args.mode == "perf":
        from tpuscope.bench import perf

        return perf.run(tiny=args.tiny, json_path=args.perf_json or Path("run/perf.json"))
    if args.mode in ("flood", "soak"):
        from tpuscope.bench import flood, soak

        return {"flood": flood.run, "soak": soak.run}[args.mode](args)
    if args.scrape_latency:
        from tpuscope.bench import scrape_latency

        return scrape_latency.run(args.scrape_latency)
    if args.trace_cost:
        from tpuscope.bench import trace_cost

        return trace_cost.run(args.trace_cost)
    if args.overhead:
        from tpuscope.bench import overhead

        return overhead.run(args)
    from tpuscope.workload import runner

    return runner.run(args)


def _fleet_sim(args: argparse.Namespace) -> int:
    from tpuscope.fleetsim import simulator

    return simulator.run(args)


def _top(args: argparse.Namespace) -> int:
    from tpuscope import top

    if args.refresh <= 0:
        print("tpuscope top: --refresh must be a positive number of seconds", file=sys.stderr)
        return 2
    return top.run(args.url, args.prometheus, args.refresh, args.once)


def _report(args: argparse.Namespace) -> int:
    from tpuscope import report

    try:
        window = report.Window.parse(args.since, args.until)
    except ValueError as e:
        print(f"tpuscope report: {e}", file=sys.stderr)
        return 2
    return report.run(args.prometheus, args.recording, args.workload, window, args.out)


def _dashboards(args: argparse.Namespace) -> int:
    from tpuscope import dashboards  # grafana-foundation-sdk: the dashboards extra

    for path in dashboards.write(args.out):
        print(f"wrote {path}")
    return 0


def _alerts(args: argparse.Namespace) -> int:
    from tpuscope import alerts
    from tpuscope.generator_config import GeneratorConfig

    try:
        config = GeneratorConfig.load(args.config)
    except ValueError as e:
        print(f"tpuscope alerts: {e}", file=sys.stderr)
        return 2
    for path in alerts.write(args.out, config):
        print(f"wrote {path}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from tpuscope import generate

    if args.check:
        stale = generate.stale(args.root)
        for path in stale:
            print(f"stale: {path} (run `tpuscope generate`)", file=sys.stderr)
        return 1 if stale else 0
    for path in generate.write(args.root):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
