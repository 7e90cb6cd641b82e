"""Orbax checkpoints reported to the Monitor: ``checkpoints = mon.orbax(ocp.CheckpointManager(...))``.

A checkpoint's report needs its step, the time until it is durable, the bytes written and whether it
succeeded. An async save (what Orbax does by default) returns once the arrays are copied off the devices and
is written by Orbax's threads afterwards, so the job must neither wait for the report nor walk directories.

Why a wrapper around the manager: Orbax 0.12 has three hooks, and none of them tells all of that.

- ``AsyncOptions.post_finalization_callback`` is called with no argument (which step?), only after a save
  that succeeded, before the step's directory is committed (renamed into place), and only if it was set
  when the manager was built.
- The manager's ``logger`` (``AbstractLogger.log_entry``) receives the blocking part of each save and each
  restore, but nothing when an async save becomes durable or fails.
- Its ``jax.monitoring`` events (``/jax/orbax/write/...``) are durations without a step, and none says
  that a save failed.

Nor does Orbax's ``StepMetadata`` hold a size (and 0.12.8 leaves its ``commit_timestamp_nsecs`` unset).

So :class:`OrbaxCheckpoints` stands where the job calls Orbax: ``save`` and ``restore`` are timed around the
manager's own, and everything else is the manager's, passed through. After each save a watcher thread calls
the manager's public ``wait_until_finished()``, which joins that save's finalize thread and raises its
error, then reports it: the time from the call until durable (the event's one duration, which the
checkpoint's age and goodput count), the part the job waited for (in the checkpoint's span and the log: the
wire's Checkpoint event has no field for it), the bytes of the finished step directory, read on that
thread, and success or failure.

The watcher must join *its* save's finalize thread, so a save that Orbax is going to make first waits until
the watcher has: no new wait, as Orbax's save waits for the previous one at that point anyway. A save that
Orbax will skip (its ``should_save`` says no) waits for nothing.

Failures. A failed save, at the call or in the background, is reported (``ok=False``) and logged, and the
job goes on: ``save`` returns False, as for a save not made, and the error that Orbax keeps for the next
``save``, ``wait_until_finished`` or ``close`` after an async save failed is taken there, not raised again.
``raise_errors=True`` raises them instead, where Orbax would. A failed restore is reported, then raised: the
job needs what it asked for. A failure of tpuscope's own part (reading a size, reporting) is counted in
``errors`` and logged once, and never reaches the job.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from tpuscope.tracing import failures

if TYPE_CHECKING:
    from tpuscope.tracing.monitor import Monitor

log = logging.getLogger("tpuscope")

# How long ``close`` waits for the last save's report (its size read from a bucket, say) before leaving it.
CLOSE_TIMEOUT_SECONDS = 30.0


class OrbaxCheckpoints:
    """An Orbax ``CheckpointManager`` whose saves and restores are reported to a Monitor (see the module)."""

    def __init__(self, manager: Any, monitor: Monitor, *, raise_errors: bool = False) -> None:
        self.manager = manager
        self.errors = 0  # failures of tpuscope's own part: reading a size, reporting (never a checkpoint's)
        self._monitor = monitor
        self._raise = raise_errors
        self._last: _SaveWatcher | None = None

    def __getattr__(self, name: str) -> Any:
        """What this class does not define is the manager's: ``latest_step``, ``all_steps``, ``directory``, ..."""
        manager = self.__dict__.get("manager")
        if manager is None:
            raise AttributeError(name)
        return getattr(manager, name)

    # --- the manager's calls, timed ------------------------------------------------------------------------------

    def save(self, step: int, *args: Any, **kwargs: Any) -> bool:
        """The manager's ``save``, reported when the checkpoint is durable. False when no save was made: Orbax
        skipped it (``should_save``), or it failed (reported and logged; raised with ``raise_errors``)."""
        started = time.perf_counter()  # what the job waits for includes the previous save's end, as in Orbax
        force = kwargs.get("force", args[3] if len(args) > 3 else False)  # (step, items, save_kwargs, metrics, force)
        last = self._last
        if last is not None and not last.settled.is_set() and (force or self._will_save(step)):
            last.settled.wait()
        self._take_error()
        try:
            saved = bool(self.manager.save(step, *args, **kwargs))
        except Exception as e:
            self._report("save", step, time.perf_counter() - started, ok=False)
            if self._raise:
                raise
            log.warning("tpuscope: the checkpoint save of step %d failed: %s (reported; the job goes on)", step, e)
            return False
        if saved:
            self._last = _SaveWatcher(self, step, started, returned=time.perf_counter())
        return saved

    def restore(self, step: int | None = None, *args: Any, **kwargs: Any) -> Any:
        """The manager's ``restore`` (of the latest step when ``step`` is None), reported with the bytes of the
        step it read. A failed restore is reported, then raised."""
        directory = kwargs.get("directory", args[2] if len(args) > 2 else None)  # (step, items, kwargs, directory)
        number = step if step is not None else self._latest_step(directory)
        compiled_before = self._monitor.compile_seconds
        started = time.perf_counter()
        try:
            restored = self.manager.restore(step, *args, **kwargs)
        except BaseException as e:
            self._report("restore", number, time.perf_counter() - started, ok=False)
            failures.mark(e, "checkpoint_restore")  # should it end the job, the failure's reason
            raise
        seconds = time.perf_counter() - started
        compiled = self._monitor.compiled_since(compiled_before, seconds)
        # Read here, not on a thread: the restore has just held the job for far longer than a listing takes.
        self._report("restore", number, seconds, ok=True, bytes=self._step_bytes(number, directory), compiled=compiled)
        return restored

    def wait_until_finished(self) -> None:
        """The manager's wait. An async save that failed has been reported by then; it is raised only with
        ``raise_errors``."""
        if self._last is not None:
            self._last.settled.wait()
        self._take_error()
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Wait for the last save, close the manager, and send the last save's report (waiting
        ``CLOSE_TIMEOUT_SECONDS`` at most for it)."""
        try:
            self.wait_until_finished()
        finally:
            self.manager.close()
            if self._last is not None:
                self._last.thread.join(CLOSE_TIMEOUT_SECONDS)

    def __enter__(self) -> OrbaxCheckpoints:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- inside ----------------------------------------------------------------------------------------------------

    def _will_save(self, step: int) -> bool:
        try:
            return bool(self.manager.should_save(step))
        except Exception:
            return True  # then wait, as Orbax's save itself would

    def _take_error(self) -> None:
        """Take from the manager, on the job's thread, the error of a failed async save that was reported already:
        Orbax raises it once per thread, from the next wait, which would otherwise be the next save's."""
        last = self._last
        if last is None or not last.settled.is_set() or last.error is None or last.taken:
            return
        last.taken = True
        try:
            self.manager.wait_until_finished()
        except BaseException as e:
            if self._raise or e is not last.error:
                raise

    def _latest_step(self, directory: Any) -> int:
        """The step a restore of "the latest" will read: the manager's, unless another directory is named."""
        if directory is not None:
            return 0  # unknown without reading that directory as Orbax does; the step label is all it costs
        try:
            return int(self.manager.latest_step() or 0)
        except Exception:
            return 0

    def _step_bytes(self, step: int, directory: Any = None) -> int:
        """The bytes of the step's directory on disk (0 when it cannot be read: counted in ``errors``)."""
        try:
            root = self.manager.directory if directory is None else _epath(directory)
            path = step_directory(root, step)
            return tree_bytes(path) if path is not None else 0
        except Exception as e:
            self._failed(e)
            return 0

    def _report(
        self,
        operation: Literal["save", "restore"],
        step: int,
        seconds: float,
        *,
        ok: bool,
        bytes: int = 0,
        blocking: float | None = None,
        compiled: float | None = None,
    ) -> None:
        try:
            self._monitor.record_checkpoint(
                operation, seconds, ok=ok, bytes=bytes, step=step, blocking_seconds=blocking, compile_seconds=compiled
            )
        except Exception as e:
            self._failed(e)

    def _failed(self, error: Exception) -> None:
        self.errors += 1
        if self.errors == 1:
            log.warning(
                "tpuscope: reporting an Orbax checkpoint failed: %s. Checkpoints go on; "
                "further failures of this kind are counted (.errors), not said",
                error,
            )
        else:
            log.debug("tpuscope: reporting an Orbax checkpoint failed again: %s", error)


class _SaveWatcher:
    """Waits, on a thread of its own, for one save to be durable or to fail, then reports it."""

    def __init__(self, owner: OrbaxCheckpoints, step: int, started: float, returned: float) -> None:
        self.settled = threading.Event()  # the manager's wait has returned: the next save may go ahead
        self.error: BaseException | None = None  # the save's failure, as the manager raised it
        self.taken = False  # whether the job's thread has taken that error from the manager
        self._owner = owner
        self._step = step
        self._started = started
        self._returned = returned  # when save() returned: the job waited from started to here
        self.thread = threading.Thread(target=self._run, name=f"tpuscope-orbax-save-{step}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        owner = self._owner
        try:
            owner.manager.wait_until_finished()
        except BaseException as e:  # the save's own failure, raised again by Orbax for this thread
            self.error = e
        durable = time.perf_counter()
        self.settled.set()
        seconds, blocking = durable - self._started, self._returned - self._started
        if self.error is not None:
            owner._report("save", self._step, seconds, ok=False, blocking=blocking)
            if not owner._raise:
                log.warning(
                    "tpuscope: the checkpoint save of step %d failed: %s (reported; the job goes on)",
                    self._step,
                    self.error,
                )
            return
        size = owner._step_bytes(self._step)
        owner._report("save", self._step, seconds, ok=True, bytes=size, blocking=blocking)
        log.info(
            "tpuscope: checkpoint of step %d durable after %.3f s, %.3f s of it blocking the job; %d bytes",
            self._step,
            seconds,
            blocking,
            size,
        )


def step_directory(root: Any, step: int) -> Any | None:
    """The committed directory of ``step`` under ``root``: ``7``, or with the manager's step prefix or fixed
    length ``checkpoint_7`` or ``ckpt_00000007``; None when there is none (deleted meanwhile)."""
    exact = root / str(step)
    if exact.is_dir():
        return exact
    name = re.compile(rf"(?:.+_)?0*{step}")  # Orbax's uncommitted directories end in ".orbax-checkpoint-tmp-..."
    return next((path for path in root.iterdir() if name.fullmatch(path.name) and path.is_dir()), None)


def tree_bytes(path: Any) -> int:
    """The bytes of the files under ``path``: a local directory or a bucket's, as Orbax's ``etils.epath.Path``
    or any path ``epath.Path`` takes."""
    total = 0
    for folder, _, files in _epath(path).walk():
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed while read: max_to_keep let the step go
                total += (folder / name).stat().length
    return total


def _epath(directory: Any) -> Any:
    from etils import epath  # type: ignore[import-untyped]  # Orbax's path library: there with any CheckpointManager

    return epath.Path(directory)
