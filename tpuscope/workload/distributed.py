"""One process of a multi-process JAX job: ``jax.distributed`` across hosts, each process driving its own devices.

``tpuscope workload --processes N --process-id I --coordinator HOST:PORT`` runs process I of N, as one host of a
multi-host job does (on GPU hosts, say, with the coordinator on the first). ``tpuscope workload --processes N``
alone starts all N here, each its own "host" (:mod:`tpuscope.workload.launcher`). On the CPU the processes'
devices meet in gloo's collectives over TCP, so a cross-process all-reduce crosses real sockets.

A failure must end the whole job, soon. A process that fails leaves at once, without the runtime's orderly
shutdown: that is a barrier every process has to reach, and the others are stuck in a collective waiting for
the one that failed, so it would wait out its 5-minute timeout. Its heartbeats stop with it, and after
:data:`HEARTBEAT_TIMEOUT_S` the coordination service aborts every other process (SIGABRT, exit 134): their
sidecars see them vanish. A run that succeeds shuts the runtime down in order.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

# Seconds without a process's heartbeats after which the coordination service declares it dead and aborts the
# others: the bound on how long a failure takes to end the job (JAX's default is 100 s).
HEARTBEAT_TIMEOUT_S = 10


@dataclass(frozen=True)
class Process:
    """Where this process sits in its job."""

    coordinator: str  # host:port of process 0's coordination service
    processes: int
    process_id: int
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT_S


def initialize(process: Process) -> None:
    """Join the job (blocks until every process has). Gloo for the collectives between CPU devices of different
    processes (XLA's default CPU collectives stay inside one process); other backends ignore the setting."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[no-untyped-call]
    jax.distributed.initialize(
        process.coordinator,
        num_processes=process.processes,
        process_id=process.process_id,
        heartbeat_timeout_seconds=round(process.heartbeat_timeout),
    )


def finish(code: int) -> int:
    """End this process of the job: after a success the runtime's orderly shutdown, after a failure straight out
    (see the module's doc), output flushed first. Returns ``code`` only after a success."""
    if code == 0:
        if "jax" in sys.modules:
            import jax

            jax.distributed.shutdown()  # type: ignore[no-untyped-call]
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def of_worker(path: Path, worker: int) -> Path:
    """A path of one worker's own, where all of them share a machine: ``run/events.jsonl`` ->
    ``run/events-worker2.jsonl``."""
    return path.with_name(f"{path.stem}-worker{worker}{path.suffix}")
