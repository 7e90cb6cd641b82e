"""``tpuscope serve``: wire the event socket, the aggregator and /metrics together."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    disable_created_metrics,
)

from tpuscope.exporter import collectors, otlp_logs
from tpuscope.exporter import config as serve_config
from tpuscope.exporter.aggregator import Aggregator
from tpuscope.exporter.collectors.runner import CollectorRunner
from tpuscope.exporter.config import ServeConfig
from tpuscope.exporter.hangs import HangWatch, Limits
from tpuscope.exporter.http import MetricsServer
from tpuscope.exporter.ingest import IngestLoop, SocketError
from tpuscope.exporter.metrics import Series, register
from tpuscope.exporter.otlp_push import OtlpPusher, metric_exporter
from tpuscope.exporter.profiles.service import ProfileService
from tpuscope.exporter.samples import SampleStore
from tpuscope.exporter.webconfig import WebConfigError
from tpuscope.otel import resource

log = logging.getLogger("tpuscope.exporter")


def build_registry() -> CollectorRegistry:
    """Our catalogue plus the sidecar's own process_* and python_* metrics."""
    # `_created` series would double the series count and show up as stray gauges
    # in the text format Prometheus scrapes; nothing downstream uses them.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=True)
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return registry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Receive events from instrumented jobs on a Unix socket and serve them, with the sidecar's own health, "
        "as Prometheus metrics on /metrics. Stops cleanly on SIGTERM."
    )
    serve_config.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    try:
        settings = serve_config.resolve(args)
    except serve_config.ConfigError as e:  # said at once, before anything is bound
        print(f"tpuscope serve: error: {e}", file=sys.stderr)
        return 2
    return serve(settings)


def serve(config: ServeConfig) -> int:
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registry = build_registry()
    metrics = register(registry)
    store = SampleStore()
    registry.register(store)
    aggregator = Aggregator(
        metrics, store, max_label_values=config.max_label_values, workload_expiry=config.workload_expiry
    )
    otlp_exporter = None
    if config.otlp_metrics_interval:
        try:  # before anything is bound, so that a bad OTEL_* setting leaves nothing behind
            otlp_exporter = metric_exporter()
        except Exception as e:
            print(f"tpuscope serve: cannot push metrics over OTLP: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    limits = Limits(floor=config.hang_after, long=config.core_state_after, exit_after=config.hang_exit_after)
    verdict_logs = None
    if otlp_logs.wanted():
        try:  # as the metrics' exporter: a bad OTEL_* setting is said at once
            verdict_logs = otlp_logs.VerdictLogs(f"{socket.gethostname()}:{config.listen_port}")
        except Exception as e:
            print(f"tpuscope serve: cannot send hang verdicts over OTLP: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    hangs = HangWatch(config.socket, config.socket_mode, metrics, limits, config.host_labels, otlp=verdict_logs)
    try:
        ingest = IngestLoop(config.socket, config.socket_mode, aggregator, hangs)
    except SocketError as e:
        print(f"tpuscope serve: {e}", file=sys.stderr)
        return 1
    try:
        http = MetricsServer(
            config.listen_host,
            config.listen_port,
            registry,
            web_config=config.web_config_file,
            host_labels=config.host_labels,
        )
    except WebConfigError as e:
        ingest.stop()
        print(f"tpuscope serve: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        ingest.stop()
        print(
            f"tpuscope serve: cannot listen on {config.listen_host}:{config.listen_port}: {e.strerror}", file=sys.stderr
        )
        return 1

    stop, hurry = threading.Event(), threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            log.info("received %s again, stopping now", signal.Signals(signum).name)
            hurry.set()
            return
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    runners = collector_runners(config, ingest, store, metrics, aggregator.progress, hangs.stuck)
    pusher = None
    if otlp_exporter and config.otlp_metrics_interval:
        instance = f"{socket.gethostname()}:{http.port}"  # as Prometheus' instance label would say
        pusher = OtlpPusher(
            registry,
            resource("tpuscope", instance),
            otlp_exporter,
            config.otlp_metrics_interval,
            metrics,
            config.host_labels,
        )
        log.info("pushing metrics over OTLP every %g s", config.otlp_metrics_interval)
    ingest.start()
    # The jobs' device traces, parsed in a child at the nice value the config gives.
    profiles = ProfileService(
        config.socket,
        config.socket_mode,
        metrics,
        config.profile_parser_nice,
        serve=lambda workload, profile: ingest.call(lambda: aggregator.parsed_profile(workload, profile)),
    )
    profiles.start()
    http.start()
    for runner in runners:
        runner.start()
    if pusher:
        pusher.start()
    # One line on stdout that people and tests can read: where to look, where to send.
    print(f"tpuscope serve: metrics at {http.url}, events at {config.socket}", flush=True)
    log.info("serving as slice %s, worker %s", config.slice, config.worker)
    while not stop.wait(1.0):
        pass
    ingest.stopping(hurry)  # the verdicts on jobs that just vanished, before the last scrape
    linger(config.shutdown_linger, http, ingest, hurry)
    for runner in runners:
        runner.stop()
    if pusher:
        pusher.stop()
    http.stop()
    profiles.stop()
    ingest.stop()
    log.info("stopped")
    return 0


def linger(seconds: float, http: MetricsServer, ingest: IngestLoop, hurry: threading.Event) -> None:
    """Serve on after SIGTERM until a scrape has read the final state: no job connected (in a pod whose containers
    get SIGTERM together the job books its last steps as it stops; a native sidecar gets it once the job has
    exited), no verdict pending on a job that
    vanished, and a scrape begun after the last one left. At most ``seconds``; not at all for a sidecar nothing
    scrapes."""
    termed = time.monotonic()
    deadline = termed + seconds
    if seconds and http.last_scrape:
        log.info("serving for up to %g s more, until a scrape reads the final state", seconds)
    while seconds and http.last_scrape and time.monotonic() < deadline and not hurry.is_set():
        if not ingest.connected() and not ingest.deciding() and http.last_scrape > max(ingest.last_left, termed):
            log.info("the final state was scraped")
            return
        hurry.wait(0.1)


def collector_runners(
    config: ServeConfig,
    ingest: IngestLoop,
    store: SampleStore,
    metrics: Series,
    progress: Callable[[], Mapping[str, float]],
    stuck: Callable[[], frozenset[str]] = frozenset,
) -> list[CollectorRunner]:
    """The collectors the configuration asks for (``auto``: those with something to read here). ``progress``:
    the aggregator's last progress of each connected workload, for the libtpu collector's stall trigger."""
    settings = collectors.Settings(
        libtpu_addresses=config.libtpu_addresses,
        device_plugin_address=config.device_plugin_address,
        pids=config.pids,
        pid_file=config.pid_file,
        job_pids=ingest.job_pids,
        workload_progress=progress,
        core_state_after=config.core_state_after,
        stuck_workloads=stuck,
    )
    runners = []
    for name, collector in collectors.COLLECTORS.items():
        if config.collectors is None:
            if why_not := collector.unavailable_here(settings):
                log.info("collector %s: off (auto): %s", name, why_not)
                continue
        elif name not in config.collectors:
            continue
        interval = config.collector_intervals.get(name, collector.default_interval)
        runners.append(CollectorRunner(collector, settings, interval, config.collector_deadline, store, metrics))
        log.info("collector %s: every %g s, deadline %g s", name, interval, config.collector_deadline)
    return runners
