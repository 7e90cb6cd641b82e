"""``tpuscope bench scrape-latency``: how long Prometheus waits for ``/metrics`` with every collector on.

A sidecar runs with the libtpu, nvml and host collectors collecting every
second while a synthetic job streams events to it, so scrapes contend with
collections and ingest as they would on a training host. The libtpu
collector reads the fake runtime (:mod:`tpuscope.testing.fake_tpu`) with 8
devices and the full metric set; nvml reads the fake NVML library
(:mod:`tpuscope.testing.fake_nvml`, built with gcc) with 8 GPUs, so both
collectors produce all their series. The scrapes ask as Prometheus does
(OpenMetrics first, gzip) and are timed from request to last byte.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from tpuscope import catalog
from tpuscope.bench.timing import scrape_once
from tpuscope.scrape import Scrape
from tpuscope.testing import fake_nvml
from tpuscope.testing.fake_tpu import Chip, FakeTpuRuntime, FakeTpuServer, default_megascale
from tpuscope.tracing import Monitor
from tpuscope.workload import synthetic
from tpuscope.workload.sidecar import SidecarProcess

TARGET_P99_SECONDS = 0.050
DEVICES = 8  # fake TPU chips, and fake GPUs: a full host of each


def run(args: argparse.Namespace) -> int:
    scrapes: int = args.scrapes
    with tempfile.TemporaryDirectory(prefix="ts-") as tmp:
        directory = Path(tmp)
        nvml_state = fake_nvml.FakeNvmlState(directory / "nvml.state", gpus=[fake_nvml.FakeGpu()] * DEVICES)
        nvml_state.write()
        env = fake_nvml.environment(fake_nvml.build(directory / "lib"), nvml_state)
        runtime = FakeTpuRuntime([Chip(d, duty_cycle_percent=10.0 * d) for d in range(DEVICES)], default_megascale())
        with (
            FakeTpuServer(runtime) as server,
            SidecarProcess(
                directory / "s.sock",
                "127.0.0.1:0",
                "--collectors=libtpu,nvml,host",
                f"--libtpu-address={server.address}",
                "--collector-interval=1",
                env=env,
            ) as sidecar,
            Monitor("scrape-bench", socket=sidecar.socket) as monitor,
        ):
            stop = threading.Event()
            profile = synthetic.Profile(step_seconds=0.05, checkpoint_every=100, checkpoint_seconds=0.2)
            job = threading.Thread(target=synthetic.run, args=(monitor, 10**9, profile), kwargs={"stop": stop})
            job.start()
            try:
                time.sleep(2.5)  # every collector has collected at least twice
                first = Scrape.fetch(sidecar.url)
                timings = []
                size = 0
                for _ in range(scrapes):
                    seconds, size = scrape_once(sidecar.url)
                    timings.append(seconds)
                last = Scrape.fetch(sidecar.url)
            finally:
                stop.set()
                job.join()
    return report(timings, size, first, last)


def report(timings: list[float], size: int, first: Scrape, last: Scrape) -> int:
    up = {s.labels["collector"]: s.value for s in last.find(catalog.COLLECTOR_UP.name)}
    durations = {s.labels["collector"]: s.value for s in last.find(catalog.COLLECTOR_DURATION.name)}
    samples = len(last.samples)
    timings.sort()
    p50, p90, p99 = (timings[int(q * (len(timings) - 1))] for q in (0.5, 0.9, 0.99))
    print(f"scrape latency, {len(timings)} scrapes as Prometheus asks (OpenMetrics, gzip):")
    print(f"  exposition: {samples} samples, {len(last.text) / 1024:.0f} KiB text, {size / 1024:.1f} KiB gzipped")
    print(
        f"  collectors up: {up}; last collection took "
        + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in durations.items())
    )
    # Before the job's first step there is no step series: it has sent none yet.
    steps = (last.value(catalog.STEPS.name) or 0.0) - (first.value(catalog.STEPS.name) or 0.0)
    print(f"  the job sent {steps:.0f} steps meanwhile")
    ms = {"p50": p50, "p90": p90, "p99": p99, "max": timings[-1], "mean": statistics.fmean(timings)}
    print("  " + ", ".join(f"{name} {seconds * 1000:.1f} ms" for name, seconds in ms.items()))
    verdict = "within" if p99 < TARGET_P99_SECONDS else "OVER"
    print(f"  p99 is {verdict} the {TARGET_P99_SECONDS * 1000:.0f} ms target")
    return 0 if all(up.values()) else 1
