"""Orbax checkpoints for the benchmark workload, each reported through the Monitor."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from tpuscope.tracing import Monitor
from tpuscope.tracing.orbax_checkpoints import tree_bytes


class InjectedCheckpointFailure(OSError):
    """The ``ckpt-fail`` fault: what a full disk or a lost bucket looks like to the job."""


class Checkpointer:
    """Saves every ``every`` steps and restores the latest, with Orbax's CheckpointManager.

    With ``async_save`` the training loop pays only for the copy off the devices;
    the write finishes on Orbax's thread, and the event (duration: until
    durable) is sent when it has.
    """

    def __init__(self, directory: Path, monitor: Monitor, every: int, async_save: bool = False, fail: bool = False):
        import orbax.checkpoint as ocp

        logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax logs every save at WARNING through absl
        self._ocp = ocp
        self.directory = directory.resolve()
        self._monitor = monitor
        self.every = every
        self._fail = fail
        self._async = async_save
        options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=async_save)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._waiter: threading.Thread | None = None
        self._delay = 0.0  # the save under way's slow storage (the slow-save fault)

    def restore_latest(self, like: Any) -> tuple[Any, int] | None:
        """The latest saved state (shaped and sharded like ``like``) and its step, or None."""
        step = self._manager.latest_step()
        if step is None:
            return None
        import jax

        abstract = jax.tree.map(self._ocp.utils.to_shape_dtype_struct, like)
        with self._monitor.checkpoint("restore", step=step) as ckpt:
            state = self._manager.restore(step, args=self._ocp.args.StandardRestore(abstract))
            ckpt.bytes = tree_bytes(self.directory / str(step))
        return state, step

    def due(self, step: int) -> bool:
        return self.every > 0 and (step + 1) % self.every == 0

    def save(self, step: int, state: Any, delay: float = 0.0) -> None:
        """Save ``state`` as ``step``; ``delay``: seconds the storage takes beyond the write (the ``slow-save``
        fault), inside the save."""
        self._delay = delay
        self._wait()  # one save in flight at a time, as Orbax itself requires
        started = time.perf_counter()
        if self._async:
            try:
                self._save(step, state)
            except Exception:
                self._monitor.record_checkpoint("save", time.perf_counter() - started, ok=False, step=step)
                return
            # What held the loop: the call, which copies the state off the devices (the goodput ledger books
            # only this as checkpoint time; the write overlaps the steps).
            blocking = time.perf_counter() - started
            self._waiter = threading.Thread(target=self._finish, args=(step, started, blocking), daemon=True)
            self._waiter.start()
            return
        try:
            with self._monitor.checkpoint("save", step=step) as ckpt:
                self._save(step, state)
                ckpt.bytes = tree_bytes(self.directory / str(step))
        except Exception as e:  # a failed save is reported and survived, as a real job would
            logging.getLogger("tpuscope.bench").warning("checkpoint at step %d failed: %s", step, e)

    def _save(self, step: int, state: Any) -> None:
        time.sleep(self._delay)
        if self._fail:
            time.sleep(0.01)
            raise InjectedCheckpointFailure(f"injected checkpoint failure at step {step}")
        self._manager.save(step, args=self._ocp.args.StandardSave(state))
        if not self._async:
            self._manager.wait_until_finished()

    def _finish(self, step: int, started: float, blocking: float) -> None:
        try:
            self._manager.wait_until_finished()
            ok, size = True, tree_bytes(self.directory / str(step))
        except Exception:
            ok, size = False, 0
        seconds = time.perf_counter() - started
        self._monitor.record_checkpoint("save", seconds, ok=ok, bytes=size, step=step, blocking_seconds=blocking)

    def _wait(self) -> None:
        if self._waiter is not None:
            self._waiter.join()
            self._waiter = None

    def close(self) -> None:
        self._wait()
        self._manager.close()
