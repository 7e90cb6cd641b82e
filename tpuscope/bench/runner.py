"""``tpuscope bench``: run a workload against a sidecar (starting one if needed) and show the result."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tpuscope import catalog, events
from tpuscope.bench import synthetic
from tpuscope.bench.summary import RunSummary
from tpuscope.exporter.child import SidecarProcess
from tpuscope.exporter.ingest import SocketError, has_listener
from tpuscope.exporter.scrape import Scrape
from tpuscope.tracing import Monitor

# What the end-of-run snapshot shows: the series a newcomer should look at first.
SNAPSHOT = (
    catalog.STEPS,
    catalog.STEP_DURATION,
    catalog.STEP_PHASE_DURATION,
    catalog.COMPILE_DURATION,
    catalog.CHECKPOINT_DURATION,
    catalog.CHECKPOINT_BYTES,
    catalog.INGEST_EVENTS,
)


def run_bench(args: argparse.Namespace) -> int:
    socket: Path = args.socket or events.default_socket_path()
    sidecar = None
    if _listening(socket):
        print(f"tpuscope bench: sending events to the sidecar already listening on {socket}")
    else:
        sidecar = SidecarProcess(socket, args.listen)
        print(f"tpuscope bench: started a sidecar; metrics at {sidecar.url} (log {sidecar.log_path})")
    try:
        summary = RunSummary()
        profile = synthetic.Profile(step_seconds=args.step_time, checkpoint_every=args.checkpoint_every)
        every = max(1, args.steps // 10)

        def progress(n: int) -> None:
            if (n + 1) % every == 0 or n + 1 == args.steps:
                print(f"  step {n + 1}/{args.steps}  {summary.steps_per_second():.1f} steps/s", flush=True)

        with Monitor(args.workload, socket=socket, sinks=[summary]) as monitor:
            synthetic.run(monitor, args.steps, profile, progress=progress)
        print("\n".join(["", "Run summary (measured in the job):", *("  " + line for line in summary.lines())]))
        print(f"  events        {monitor.sent} sent to {socket}, {monitor.dropped} dropped")
        if sidecar:
            _print_snapshot(sidecar.url, monitor.sent)
            if args.linger > 0:
                print(f"\nThe sidecar serves {sidecar.url} for {args.linger:g} s more (Ctrl-C to stop).")
                time.sleep(args.linger)
    finally:
        if sidecar:
            sidecar.stop()
    return 0


def _listening(socket: Path) -> bool:
    try:
        return socket.exists() and has_listener(socket)
    except SocketError:
        return False


def _print_snapshot(url: str, sent: int) -> None:
    """Print the snapshot's series from /metrics once the sidecar has taken every event we sent."""
    deadline = time.monotonic() + 5.0
    scrape = Scrape.fetch(url)
    accepted = catalog.INGEST_EVENTS.name
    while scrape.value(accepted, result="accepted") + scrape.value(accepted, result="invalid") < sent:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
        scrape = Scrape.fetch(url)
    print(f"\nWhat the sidecar serves on {url} (non-zero series; histogram buckets left out):")
    names = {metric.name for metric in SNAPSHOT} | {
        metric.series(part) for metric in SNAPSHOT if metric.kind is catalog.Kind.HISTOGRAM for part in ("sum", "count")
    }
    for sample in scrape.samples:
        if sample.name in names and sample.value:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            print(f"  {sample.name}{{{labels}}} {sample.value:g}")
