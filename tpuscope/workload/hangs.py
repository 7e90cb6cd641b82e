"""Hangs ``tpuscope workload --inject`` can cause, and long healthy phases that must not read as one.

A hang stops one worker for good at a step (``@WORKER``; the value is the step, -1 half the run), each its own
way, while its peers wait for it in a collective:

- ``hang-input``: its input pipeline blocks in a read that never returns (a read of a pipe no one writes, as a
  read of a dead network filesystem does), in the step's io phase.
- ``hang-spin``: it spins in a Python loop in its metrics code, in the step after its compute.
- ``skip-collective``: it skips the barrier its peers enter in the step's sync phase and goes on to the next
  step, whose collective then waits for peers that wait for it. The barrier is JAX's coordination service's
  (as Orbax's and multihost_utils' barriers are): gloo, the CPU's collectives, pairs device collectives in the
  order they come, so a device collective skipped on the CPU pairs the peers' with the skipper's next one (a
  program of another shape too: measured) and the job runs on, wrong, where a TPU job would hang.

The long healthy phases hit every worker:

- ``eval``: halfway, an eval loop of that many seconds between two steps, which the job does not mark.
- ``slow-save``: after the last step, a checkpoint whose save takes that many seconds (slow storage).
- ``slow-compile``: halfway, in a step's compute, a new program that takes XLA about that many seconds to
  compile on this project's machine alone (longer beside peers that compile too; the Monitor reports how long).
- ``slow-steps``: each step's compute takes that many seconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from tpuscope.workload.faults import HANGING, Faults

BARRIER_TIMEOUT_MS = 3_600_000  # the peers of a skipped barrier wait an hour: the hang, not a timeout, is shown
# XLA's CPU compile of the slow-compile program grows faster than its operations, as a power of their number: the
# fit of the measured compiles docs/bench.md quotes (the slow-compile fault).
COMPILE_SECONDS_AT_1000, COMPILE_EXPONENT = 10.7, 1.56
EVAL_BATCH_SECONDS = 0.5  # the eval loop's pause between its programs


class Hangs:
    """Where this worker's hang and the long phases strike; the training loop calls each at its place."""

    def __init__(self, faults: Faults, start: int, steps: int, log: Callable[[str], None]) -> None:
        def at(name: str, value: float) -> int:
            return (start + steps) // 2 if value < 0 else int(value)

        self._faults = faults
        self._log = log
        self.hang_at = {name: at(name, faults.get(name)) for name in HANGING if name in faults}
        # Every worker enters the barrier the skipper skips: its step is known to all.
        self.barrier_at = (
            at("skip-collective", faults.anywhere["skip-collective"])
            if ("skip-collective" in faults.anywhere)
            else None
        )
        self.halfway = (start + steps) // 2

    def before_input(self, n: int) -> None:
        if n == self.hang_at.get("hang-input"):
            self._log(f"hang-input: step {n}: the input pipeline blocks in a read that never returns")
            read_that_never_returns()

    def after_compute(self, n: int) -> None:
        if n == self.hang_at.get("hang-spin"):
            self._log(f"hang-spin: step {n}: the metrics code spins in a Python loop")
            summarise_metrics_forever()

    def in_sync(self, n: int, step: Any) -> None:
        """The step's barrier, where there is one; the skipper goes on without it."""
        if n != self.barrier_at:
            return
        if n == self.hang_at.get("skip-collective"):
            self._log(f"skip-collective: step {n}: this worker skips the barrier its peers enter")
            return
        with step.phase("sync"):
            barrier(f"tpuscope-bench-step-{n}")

    def slow_compute(self, n: int) -> None:
        """The long phases inside a step's compute: each step's, and the recompile halfway."""
        if "slow-steps" in self._faults:
            time.sleep(self._faults.get("slow-steps"))
        if n == self.halfway and "slow-compile" in self._faults:
            seconds = self._faults.get("slow-compile")
            self._log(f"slow-compile: step {n}: compiling a program of about {seconds:g} s")
            compile_slowly(seconds)

    def between_steps(self, n: int, evaluate: Callable[[], object]) -> None:
        """The unmarked eval loop after the step halfway: ``evaluate`` runs one of its programs, as many times on
        every worker (they meet in its collectives: a loop timed by each worker's clock would leave one waiting in
        a collective its peers no longer enter)."""
        if n == self.halfway and "eval" in self._faults:
            seconds = self._faults.get("eval")
            self._log(f"eval: after step {n}: an eval loop of {seconds:g} s the job does not mark")
            for _ in range(max(1, round(seconds / EVAL_BATCH_SECONDS))):
                evaluate()
                time.sleep(EVAL_BATCH_SECONDS)


def read_that_never_returns() -> bytes:
    """A read of a pipe whose writer stays open and never writes: blocked in the kernel, the GIL released."""
    reader, writer = os.pipe()
    try:
        return os.read(reader, 1)
    finally:  # never reached but by a signal's exception
        os.close(reader)
        os.close(writer)


def summarise_metrics_forever() -> int:
    """Metrics code caught in a loop that never ends: pure Python, holding the GIL but for its switch interval."""
    total, n = 0, 0
    while n >= 0:
        total += n * n
        n += 1
    return total


def barrier(name: str) -> None:
    """Wait until every process of the job reaches ``name`` (JAX's coordination service)."""
    from jax._src import distributed

    client = distributed.global_state.client
    if client is not None:  # one process alone has no one to wait for
        client.wait_at_barrier(name, BARRIER_TIMEOUT_MS)


def compile_slowly(seconds: float) -> None:
    """Compile and run a new program that takes XLA about ``seconds`` to compile here: chained small matmuls,
    which XLA does not fuse away. A random constant makes it new to a persistent compilation cache too."""
    import jax
    import jax.numpy as jnp

    operations = max(1, round(1000 * (seconds / COMPILE_SECONDS_AT_1000) ** (1 / COMPILE_EXPONENT)))
    salt = int.from_bytes(os.urandom(2), "little")

    def program(x: Any, w: Any) -> Any:
        for i in range(operations):
            x = jnp.tanh(x @ w + (i + salt))
        return x

    device = jax.local_devices()[0]
    x = jax.device_put(jnp.ones((8, 8)), device)
    jax.jit(program)(x, x).block_until_ready()
