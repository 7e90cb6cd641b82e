"""``tpuscope workload --processes N``: N processes of one ``jax.distributed`` job on this machine, each its own host.

Each worker gets what a TPU pod's host has: its index in the environment (``TPU_WORKER_ID``, which the sidecar
puts on every series as ``worker``) and a sidecar of its own (on ``SOCKET-workerI``, serving /metrics on the
``--listen`` port plus I), found or started here. Every worker runs the same ``tpuscope workload`` command with
``--process-id`` and the coordinator's address added (:mod:`tpuscope.workload.distributed`), its output printed
here behind ``[worker I]``. They share ``--run-dir``'s checkpoints, as a pod's hosts share a bucket.

When one worker fails, the job has failed: the others end by themselves within the runtime's heartbeat timeout
(their collectives wait for the failed one forever, but the coordination service aborts them), and whatever is
still running :data:`GRACE_S` after the first failure is killed. SIGKILL, since JAX turns SIGTERM into a
preemption notice and runs on. The exit code is the first failed worker's (128 + N for one killed by signal N).
The workers run JAX on the CPU (``JAX_PLATFORMS=cpu``) unless the environment says otherwise: N processes on
one host would each claim all of its accelerators.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from tpuscope import events
from tpuscope.workload.distributed import HEARTBEAT_TIMEOUT_S, of_worker
from tpuscope.workload.sidecar import sidecar_for

GRACE_S = HEARTBEAT_TIMEOUT_S + 20  # after a worker failed, how long the others have to end before they are killed
WORKER_VARIABLE = "TPU_WORKER_ID"  # what a TPU VM and GKE's TPU webhook set (tpuscope.placement)


def launch(args: argparse.Namespace) -> int:
    """Run the job the flags describe as ``args.processes`` local processes; returns the job's exit code."""
    argv: list[str] | None = getattr(args, "argv", None)
    if argv is None:
        print("tpuscope workload: --processes needs the command line (run it as `tpuscope workload`)", file=sys.stderr)
        return 2
    socket: Path = args.socket or events.default_socket_path()
    # A SIGTERM (timeout, a scheduler) ends the launcher through its cleanup: a worker hung by a fault would
    # otherwise outlive it, for good.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with ExitStack() as sidecars:
        urls = []
        for worker in range(args.processes):
            env = {WORKER_VARIABLE: str(worker)}
            sidecar = sidecar_for(of_worker(socket, worker), _listen(args.listen, worker), env)
            urls.append(sidecars.enter_context(sidecar))
        coordinator = f"127.0.0.1:{_free_port()}"  # after the sidecars bound theirs
        workers: list[subprocess.Popen[str]] = []
        try:
            for worker in range(args.processes):
                workers.append(
                    _start(argv, worker, args.processes, coordinator, of_worker(socket, worker), args.record)
                )
            code = _supervise(workers)
        finally:  # interrupted, or a worker that would not start: none may outlive the launcher
            for process in workers:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        served = [f"worker {w}: {url}" for w, url in enumerate(urls) if url]
        if served:
            print("\nThe workers' sidecars served /metrics at " + ", ".join(served))
        if served and args.linger > 0:
            print(f"They serve for {args.linger:g} s more (Ctrl-C to stop).")
            time.sleep(args.linger)
    return code


def _start(
    argv: list[str], worker: int, processes: int, coordinator: str, socket: Path, record: Path | None
) -> subprocess.Popen[str]:
    # The same command, its later flags winning: this worker's place in the job, its sidecar, its recording.
    own = ["--process-id", str(worker), "--processes", str(processes), "--coordinator", coordinator]
    own += ["--socket", os.fspath(socket)]
    if record is not None:
        own += ["--record", os.fspath(of_worker(record, worker))]
    return subprocess.Popen(
        [sys.executable, "-m", "tpuscope", *argv, *own],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # The CPU unless said otherwise: N processes on one host would each claim all of its accelerators.
        env={"JAX_PLATFORMS": "cpu", **os.environ, WORKER_VARIABLE: str(worker), "PYTHONUNBUFFERED": "1"},
    )


def _supervise(workers: list[subprocess.Popen[str]]) -> int:
    """Relay every worker's output until all have ended; kill the rest :data:`GRACE_S` after a first failure."""
    relays = [threading.Thread(target=_relay, args=(w.stdout, n), daemon=True) for n, w in enumerate(workers)]
    for relay in relays:
        relay.start()
    failed: tuple[int, int, float] | None = None  # the first failed worker, its exit code, when it was seen
    while [w.poll() for w in workers].count(None):  # every worker polled: each one's exit code known as it ends
        if failed is None:
            failed = next(((n, w.returncode, time.monotonic()) for n, w in enumerate(workers) if w.returncode), None)
        elif time.monotonic() - failed[2] > GRACE_S:
            for n, w in enumerate(workers):
                if w.poll() is None:
                    late = f"worker {n} still runs {GRACE_S} s after worker {failed[0]} failed"
                    print(f"tpuscope workload: {late}: killed")
                    w.kill()
        time.sleep(0.1)
    for relay in relays:
        relay.join(5)
    if failed is None:
        failed = next(((n, w.returncode, time.monotonic()) for n, w in enumerate(workers) if w.returncode), None)
    if failed is None:
        return 0
    ends = ", ".join(f"worker {n} {_exit_status(w.returncode)}" for n, w in enumerate(workers))
    print(f"\ntpuscope workload: the job failed: worker {failed[0]} first ({ends})")
    return failed[1] if failed[1] > 0 else 128 - failed[1]  # killed by signal N: 128 + N, as a shell says


def _relay(stream: IO[str] | None, worker: int) -> None:
    if stream is None:
        return
    for line in stream:
        print(f"[worker {worker}] {line}", end="", flush=True)


def _exit_status(code: int) -> str:
    return f"exit {code}" if code >= 0 else f"killed by signal {-code}"


def _listen(listen: str, worker: int) -> str:
    """Worker ``worker``'s /metrics address: the port plus the worker's index (0: any free port)."""
    host, _, port = listen.rpartition(":")
    return f"{host}:{int(port) + worker if int(port) else 0}"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
