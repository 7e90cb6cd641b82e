"""The bench's trainer in a real multi-process JAX job: ``jax.distributed`` over loopback, gloo collectives between
the processes' CPU devices (issue 24 builds the multi-host bench on it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpuscope.testing.prometheus import free_port

JOB = Path(__file__).with_name("distributed_step.py")


def losses(processes: int, devices: int) -> list[float]:
    """Each process's loss after two fused steps of one job of ``processes`` x ``devices`` CPU devices."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(JOB), str(p), str(processes), str(port), str(devices)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(processes)
    ]
    out = [proc.communicate(timeout=240) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-2000:] for _, err in out]
    found = [re.search(rf"of {processes}: {processes * devices} devices, loss (\S+)", stdout) for stdout, _ in out]
    assert all(found), out
    return [float(match[1]) for match in found if match]


def test_two_processes_of_two_devices_train_as_one_process_of_four() -> None:
    """Each process feeds only its own rows (``put_batch`` of its ``local_batch``), the all-reduce crosses the
    processes over sockets, and both see the loss one process of four devices sees on the whole batch."""
    alone = losses(1, 4)
    together = losses(2, 2)
    assert together[0] == together[1], "every process holds the same replicated loss"
    assert together[0] == pytest.approx(alone[0], rel=1e-5)
