"""``tpuscope workload``: run the workload against a sidecar (starting one if needed) and show the result."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from tpuscope import catalog, events
from tpuscope.conventions import DEFAULT_PORT
from tpuscope.scrape import Scrape
from tpuscope.tracing import Hooks, Monitor, RecordSink, Sink, Traces, failure_reason
from tpuscope.tracing.profile_sampler import PERIOD_ENV, parse_period
from tpuscope.workload import distributed, launcher, synthetic
from tpuscope.workload.faults import FaultError, Faults
from tpuscope.workload.sidecar import sidecar_for
from tpuscope.workload.summary import RunSummary
from tpuscope.workload.training import InjectedCrash, UnsupportedHere, Workload, WorkloadOptions, ensure_cpu_devices

# What the end-of-run snapshot shows: the series a newcomer should look at first.
SNAPSHOT = (
    catalog.STEPS,
    catalog.STEP_DURATION,
    catalog.STEP_PHASE_DURATION,
    catalog.COMPILE_DURATION,
    catalog.COMPILE_CACHE_REQUESTS,
    catalog.MFU,
    catalog.CHECKPOINT_DURATION,
    catalog.CHECKPOINT_BYTES,
    catalog.GOODPUT,
    catalog.INGEST_EVENTS,
    catalog.COLLECTOR_UP,
    catalog.HOST_CPU_IOWAIT,
)
CRASHED = 3  # the exit code of a run stopped by the injected crash
# Short, so that a default run (200 steps, some seconds) captures a few device profiles; a job's default is 10 minutes.
PROFILE_PERIOD = "1s"
# A benchmark's replacement for the training loop: the flags, the faults, the monitor the run opened.
Body = Callable[[argparse.Namespace, Faults, Monitor], None]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload's flags (``tpuscope bench overhead`` takes them too)."""
    parser.description = (
        "Run an instrumented training loop that reports to a sidecar. When no sidecar listens on the socket, one "
        "is started for the run and its /metrics address printed."
    )
    parser.add_argument(
        "--synthetic",
        action="store_true",
        help="a JAX-free loop with realistic phase timings (tests, fleet simulation)",
    )
    parser.add_argument("--steps", type=int, default=200, help="training steps to run (default %(default)s)")
    parser.add_argument("--workload", default="bench", help="the workload label (default %(default)s)")
    parser.add_argument(
        "--socket",
        type=Path,
        default=None,
        help=f"the sidecar's socket (default ${events.SOCKET_ENV}, else {events.default_socket_path()})",
    )
    parser.add_argument(
        "--listen",
        default=f"127.0.0.1:{DEFAULT_PORT}",
        help="where a sidecar started by the run serves /metrics (default %(default)s)",
    )
    parser.add_argument("--record", type=Path, help="also append every event to this file as JSON lines")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="save a checkpoint every N steps; 0: never")
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="FAULT[=VALUE]",
        help="cause a fault: slow-io, stall, straggler, blip, nan, spike, recompile, ckpt-fail, crash, oom, "
        "compile-error, bad-data, spill (repeatable; docs/bench.md says what each does)",
    )
    parser.add_argument(
        "--linger", type=float, default=0.0, help="keep a sidecar the run started serving this many seconds after it"
    )
    jax_flags = parser.add_argument_group("the JAX workload")
    jax_flags.add_argument(
        "--profile-period",
        type=_profile_period,
        default=os.environ.get(PERIOD_ENV) or PROFILE_PERIOD,
        metavar="DURATION",
        help=f"how often the Monitor captures a device profile of a few steps (seconds, a duration such as 30s, or "
        f"off); default ${PERIOD_ENV}, else {PROFILE_PERIOD}, short for a demo (a job's default is 10 minutes)",
    )
    jax_flags.add_argument("--fused", action="store_true", help="run each step as one program, as a TPU job would")
    jax_flags.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="one jax.distributed job of N processes; alone, all N start here, each a host with its own worker id "
        "and sidecar (docs/bench.md); with --process-id, this is one of them",
    )
    jax_flags.add_argument(
        "--process-id", type=int, metavar="I", help="this process's index in a job of --processes (0 to N-1)"
    )
    jax_flags.add_argument(
        "--coordinator", metavar="HOST:PORT", help="with --process-id: where process 0 runs the job's coordinator"
    )
    jax_flags.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=distributed.HEARTBEAT_TIMEOUT_S,
        metavar="SECONDS",
        help="with --processes: seconds without a process's heartbeats before the others are aborted (default "
        "%(default)s: a failure ends the job soon; a hung process still beats, so hang trials on a loaded machine "
        "take JAX's 100)",
    )
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
    jax_flags.add_argument(
        "--eval-every",
        type=int,
        default=0,
        metavar="N",
        help="after every N steps, an eval of --eval-batches batches, marked as custom badput eval (mon.badput); "
        "0: none (default)",
    )
    jax_flags.add_argument(
        "--eval-batches",
        type=int,
        default=4,
        metavar="B",
        help="batches in each --eval-every eval (default %(default)s)",
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
    synth = parser.add_argument_group("the synthetic workload")
    synth.add_argument("--step-time", type=float, default=0.05, help="mean step time, seconds (default %(default)s)")


def main(args: argparse.Namespace) -> int:
    return run(args)


def run(args: argparse.Namespace, body: Body | None = None) -> int:
    """Run the workload the flags describe; ``body`` replaces the training loop (the overhead benchmark's)."""
    processes, process_id = getattr(args, "processes", 1), getattr(args, "process_id", None)
    if error := _job_error(args, processes, process_id, body):
        print(f"tpuscope workload: {error}", file=sys.stderr)
        return 2
    try:
        faults = Faults.parse(args.inject, process_id or 0, processes)
    except FaultError as e:
        print(f"tpuscope workload: {e}", file=sys.stderr)
        return 2
    if processes > 1 and process_id is None:
        return launcher.launch(args)
    if process_id is None:
        return _run(args, body, faults)
    job = distributed.Process(args.coordinator, processes, process_id, args.heartbeat_timeout)
    try:
        code = _run(args, body, faults, job)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # anything: leave without the runtime's shutdown barrier, which would wait for nothing
        traceback.print_exc()
        code = 1
    return distributed.finish(code)


def _job_error(args: argparse.Namespace, processes: int, process_id: int | None, body: Body | None) -> str | None:
    """What is wrong with the flags of a job of several processes, if anything."""
    if processes < 1:
        return f"--processes {processes}: at least 1"
    if processes == 1:
        return "--process-id needs --processes N, the job's count, over 1" if process_id is not None else None
    if args.synthetic or body is not None:
        return "--processes runs the JAX workload only"
    if process_id is not None and not 0 <= process_id < processes:
        return f"--process-id {process_id}: a job of {processes} processes has ids 0 to {processes - 1}"
    if process_id is not None and not args.coordinator:
        return "--process-id needs --coordinator HOST:PORT, where process 0 serves the job's coordination"
    return None


def _run(args: argparse.Namespace, body: Body | None, faults: Faults, job: distributed.Process | None = None) -> int:
    """One process of the run: alone, or ``job``'s."""
    if not args.synthetic:
        ensure_cpu_devices(args.cpu_devices)  # before anything imports jax
    socket: Path = args.socket or events.default_socket_path()
    own = (lambda path: distributed.of_worker(path, job.process_id)) if job else (lambda path: path)
    with sidecar_for(socket, args.listen) as url:
        summary = RunSummary()
        every = max(1, args.steps // 10)
        since = [time.monotonic(), 0]  # when the last progress line was printed, and at which step

        def progress(n: int) -> None:
            # The rate since the last line, not since the start: the first tenth pays for compiling, and an
            # average over the run would read like a slow warm-up long after it ended.
            if (n + 1) % every == 0 or n + 1 == args.steps:
                now = time.monotonic()
                rate = (n + 1 - since[1]) / max(now - since[0], 1e-9)
                print(f"  step {n + 1}/{args.steps}  {rate:.2f} steps/s over the last {n + 1 - since[1]}", flush=True)
                since[:] = [now, n + 1]

        try:
            sinks: list[Sink] = [summary, RecordSink(args.record)] if args.record else [summary]
        except OSError as e:
            print(f"tpuscope workload: cannot write --record {args.record}: {e.strerror or e}", file=sys.stderr)
            return 2
        try:
            with Monitor(
                args.workload,
                socket=socket,
                sinks=sinks,
                traces=Traces(spans_file=own(args.run_dir / "spans.jsonl")),
                # Our demo job opts in: a SIGTERM ends it at its next step, its summary printed and exit 143, a
                # preemption (a job of several processes keeps JAX's own notifier, which takes SIGTERM after this).
                hooks=Hooks(sigterm=True, profile_period=args.profile_period),
            ) as monitor:
                if body:
                    body(args, faults, monitor)
                elif args.synthetic:
                    profile = synthetic.Profile(step_seconds=args.step_time, checkpoint_every=args.checkpoint_every)
                    synthetic.run(monitor, args.steps, profile, progress=progress)
                else:
                    _run_jax(args, faults, monitor, progress if job is None or job.process_id == 0 else None, job)
        except UnsupportedHere as e:
            print(f"tpuscope workload: {e}", file=sys.stderr)
            return 2
        except InjectedCrash as e:
            reason = f'{catalog.WORKLOAD_FAILURES.name}{{reason="{failure_reason(e)}"}}'
            again = "run the same command again to resume"
            print(f"\ntpuscope workload: {e}\n  the sidecar counts it as {reason}; {again}")
            return CRASHED
        finally:
            print("\n".join(["", "Run summary (measured in the job):", *("  " + line for line in summary.lines())]))
            print(f"  events        {monitor.sent} sent to {socket}, {monitor.dropped} dropped")
            if monitor.spans:
                spans = monitor.spans
                kept = f"1 in {spans.sampler.every} steps and the slow ones ({spans.kept} kept)"
                print(f"  spans         {kept}, compiles, checkpoints -> {spans.destination}")
            _write_summary(own(args.run_dir / "summary.json"), summary)
        if url:
            _print_snapshot(url, monitor.sent)
            if args.linger > 0:
                print(f"\nThe sidecar serves {url} for {args.linger:g} s more (Ctrl-C to stop).")
                time.sleep(args.linger)
    return 0


def _profile_period(value: str) -> str:
    """The flag's value, checked here so that a typo is an error now rather than a warning and no profiles."""
    try:
        parse_period(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def _write_summary(path: Path, summary: RunSummary) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary.json(), indent=2) + "\n")
    except OSError as e:
        print(f"  summary JSON  not written: {path}: {e.strerror or e}")
        return
    print(f"  summary JSON  {path}")


def _run_jax(
    args: argparse.Namespace,
    faults: Faults,
    monitor: Monitor,
    progress: Callable[[int], None] | None,
    job: distributed.Process | None,
) -> None:
    if job is not None:
        print(f"joining a job of {job.processes} processes as process {job.process_id} ({job.coordinator})")
        distributed.initialize(job)
    with Workload(options(args, faults), monitor) as workload:
        workload.run(progress)


def options(args: argparse.Namespace, faults: Faults) -> WorkloadOptions:
    """The workload's options from the flags of the same names (those without a flag keep their default)."""
    given = {f.name: getattr(args, f.name) for f in fields(WorkloadOptions) if hasattr(args, f.name)}
    return WorkloadOptions(**{**given, "faults": faults})


def _print_snapshot(url: str, sent: int) -> None:
    """Print the snapshot's series from /metrics once the sidecar has taken every event we sent."""
    deadline = time.monotonic() + 5.0
    scrape = Scrape.fetch(url)
    ingest = catalog.INGEST_EVENTS.name
    while scrape.present(ingest, result=catalog.ACCEPTED) + scrape.present(ingest, result=catalog.INVALID) < sent:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
        scrape = Scrape.fetch(url)
    first = scrape.samples[0].labels if scrape.samples else {}
    host = ",".join(f'{label}="{first.get(label, "")}"' for label in catalog.HOST_LABELS)
    print(f"\nWhat the sidecar serves on {url} (non-zero series; histogram buckets left out; each also {host}):")
    names = {metric.name for metric in SNAPSHOT} | {
        metric.series(part) for metric in SNAPSHOT if metric.kind is catalog.Kind.HISTOGRAM for part in ("sum", "count")
    }
    for sample in scrape.samples:
        if sample.name in names and sample.value:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k not in catalog.HOST_LABELS)
            print(f"  {sample.name}{{{labels}}} {sample.value:g}" if labels else f"  {sample.name} {sample.value:g}")
