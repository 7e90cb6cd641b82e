"""The training jobs of ``tpuscope fleet-sim``: every simulated host's process, as threads of one process.

    python -m tpuscope.fleetsim.jobs PLAN.json     # SIGTERM or SIGINT: every Monitor stops cleanly

Each host has its own :class:`~tpuscope.tracing.Monitor` connected to its own
sidecar's socket, as a job's process on that host would. One process runs them
all (a thread per host, asleep most of the time) so that a fleet of 64 hosts
costs the 2-core machine little besides its sidecars.

The hosts of a workload step in lockstep, as data-parallel workers do: each
reads its input (``io``, small), computes (``compute``, lognormal jitter), then
enters the step's collective (``sync``), which starts once the slowest host
arrives and then takes its own time. So the sync phase is waiting for the
slowest host plus the reduction: a straggler shows the largest compute and the
least sync, its peers wait for it in sync. What the plan injects:

- a straggler: from ``straggle_from`` on, one host's compute takes
  ``straggler_factor`` times as long;
- a stall: from ``stall_from`` to ``stall_until`` one workload's collective hangs,
  so none of its hosts completes a step while every process stays connected.

Each host also compiles at its start (the train step, a cache miss), reports its
chips' memory every 10 steps and saves a checkpoint every
``profile.checkpoint_every`` steps.
"""

from __future__ import annotations

import math
import random
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import msgspec

from tpuscope.tracing import Monitor
from tpuscope.workload import synthetic

ACCELERATOR = "tpu-v5e"  # the fake runtime's chips; peak FLOP/s and HBM are a v5e's (synthetic.Profile)
MEMORY_EVERY = 10  # steps between device-memory reports


@dataclass(frozen=True)
class Host:
    workload: str
    slice: str
    worker: str
    socket: str
    straggler: bool = False


@dataclass(frozen=True)
class Plan:
    """What the jobs do, written by ``fleet-sim`` as JSON; times are Unix times."""

    hosts: list[Host]
    profile: synthetic.Profile = field(default_factory=synthetic.Profile)
    straggler_factor: float = 1.5
    straggle_from: float = 0.0
    stall_workload: str = ""
    stall_from: float = 0.0
    stall_until: float = 0.0
    seed: int = 0

    def dump(self, path: Path) -> None:
        path.write_bytes(msgspec.json.format(msgspec.json.encode(self)))

    @classmethod
    def load(cls, path: Path) -> Plan:
        return msgspec.json.decode(path.read_bytes(), type=cls)


class Collective:
    """The all-reduce that ends each step of a workload: a barrier (everyone waits for the slowest),
    then the reduction, run once by the barrier's action while every host still waits. A stall is a
    collective that hangs."""

    def __init__(self, hosts: int, plan: Plan, stalls: bool, stop: threading.Event, rng: random.Random) -> None:
        self._plan, self._stalls, self._stop, self._rng = plan, stalls, stop, rng
        self._barrier = threading.Barrier(hosts, action=self._reduce)

    def _reduce(self) -> None:
        now = time.time()
        if self._stalls and self._plan.stall_from <= now < self._plan.stall_until:
            self._stop.wait(self._plan.stall_until - now)  # a hung collective: one host down or stuck
        profile = self._plan.profile
        self._stop.wait(profile.step_seconds * profile.sync_share * self._rng.lognormvariate(0.0, profile.jitter))

    def join(self) -> bool:
        """Wait for the workload's other hosts and the reduction; False once the run is stopping."""
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            return False
        return not self._stop.is_set()

    def abort(self) -> None:
        self._barrier.abort()


def run_host(host: Host, monitor: Monitor, collective: Collective, plan: Plan, stop: threading.Event) -> int:
    """Step until stopped; the steps done."""
    profile = plan.profile
    rng = random.Random(f"{plan.seed}/{host.workload}/{host.slice}/{host.worker}")
    peak_flops = profile.peak_flops_per_device * profile.devices

    def sleep_share(share: float, factor: float = 1.0) -> None:
        time.sleep(profile.step_seconds * share * factor * rng.lognormvariate(0.0, profile.jitter))

    monitor.hardware(ACCELERATOR, profile.devices, peak_flops)
    synthetic.compile_programs(monitor, profile.compile_seconds)  # before the first step, as an AOT compile is
    n = 0
    while not stop.is_set():
        slow = plan.straggler_factor if host.straggler and time.time() >= plan.straggle_from else 1.0
        with monitor.step(n) as step:
            with step.phase("io"):
                sleep_share(profile.io_share)
            with step.phase("compute"):
                sleep_share(profile.compute_share, slow)
            with step.phase("sync"):
                joined = collective.join()
            step.flops = profile.mfu * peak_flops * profile.step_seconds
        if not joined:
            return n + 1
        sleep_share(max(0.0, 1.0 - profile.io_share - profile.compute_share - profile.sync_share))  # host-side work
        if n % MEMORY_EVERY == 0:
            for chip in range(profile.devices):
                used = int(profile.device_memory_bytes * rng.uniform(0.70, 0.75))
                monitor.device_memory(
                    str(chip), ACCELERATOR, used_bytes=used, limit_bytes=profile.device_memory_bytes, peak_bytes=used
                )
        n += 1
        if profile.checkpoint_every and n % profile.checkpoint_every == 0:
            with monitor.checkpoint("save", step=n) as ckpt:  # every host writes its shard
                sleep_share(profile.checkpoint_seconds / profile.step_seconds)
                ckpt.bytes = profile.checkpoint_bytes
    return n


def run(plan: Plan, stop: threading.Event) -> Counter[str]:
    """Run every host until ``stop``; the steps each workload's hosts did, summed."""
    by_workload: dict[str, list[Host]] = {}
    for host in plan.hosts:
        by_workload.setdefault(host.workload, []).append(host)
    collectives = {
        workload: Collective(len(hosts), plan, workload == plan.stall_workload, stop, random.Random(workload))
        for workload, hosts in by_workload.items()
    }
    # Spans off: a fleet's worth of span exporters would cost more than the sidecars they sit beside.
    monitors = [Monitor(host.workload, socket=host.socket, traces=False) for host in plan.hosts]
    done = [0] * len(plan.hosts)

    def host_thread(index: int) -> None:
        host = plan.hosts[index]
        try:
            done[index] = run_host(host, monitors[index], collectives[host.workload], plan, stop)
        finally:
            collectives[host.workload].abort()  # a host that ends releases its peers

    threads = [threading.Thread(target=host_thread, args=(i,), name=str(i)) for i in range(len(plan.hosts))]
    for thread in threads:
        thread.start()
    while not stop.wait(0.5):  # a timed wait, so that the signal handler runs
        pass
    for collective in collectives.values():
        collective.abort()
    for thread in threads:
        thread.join()
    for monitor in monitors:
        monitor.close()
    steps: Counter[str] = Counter()
    for host, count in zip(plan.hosts, done, strict=True):
        steps[host.workload] += count
    return steps


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tpuscope.fleetsim.jobs PLAN.json", file=sys.stderr)
        return 2
    plan = Plan.load(Path(argv[0]))
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    print(f"fleet jobs: {len(plan.hosts)} hosts stepping; SIGTERM stops", flush=True)
    steps = run(plan, stop)
    hosts = Counter(host.workload for host in plan.hosts)
    for workload, total in sorted(steps.items()):
        print(f"  {workload}: {math.floor(total / hosts[workload])} steps on each of {hosts[workload]} hosts")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
