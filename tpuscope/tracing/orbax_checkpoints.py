"""Orbax checkpoints reported to the Monitor: ``checkpoints = mon.orbax(ocp.CheckpointManager(...))``.

A checkpoint's report needs its step, the time until it is durable, the bytes written and whether it
succeeded. An async save (what Orbax does by default) returns once the arrays are copied off the devices and
is written by Orbax's threads afterwards, so the job must neither wait for the report nor walk directories.

Why a wrapper around the manager: none of Orbax 0.12's hooks tells all of that.
``AsyncOptions.post_finalization_callback`` gets no step, is called only after a save that succeeded and before
its directory is committed, and only if set when the manager was built; the manager's ``logger`` hears nothing
when an async save becomes durable or fails; its ``jax.monitoring`` events (``/jax/orbax/write/...``) are
durations without a step, none for a failure. Nor does ``StepMetadata`` hold a size (and 0.12.8 leaves its
``commit_timestamp_nsecs`` unset).

So :class:`OrbaxCheckpoints` times ``save`` and ``restore`` around the manager's own and passes everything else
through. A watcher thread then reports each save: the time from the call until durable (the event's one
duration), the part the job waited for (in the span and the log: the wire's Checkpoint event has no field for
it), the bytes of the finished step directory, and success or failure.

The watcher learns that a save is durable from Orbax itself, without a call into the manager: an async
``CheckpointManager.save`` ends by starting a ``_FinalizeThread`` for its step, kept in the manager's
``_finalize_thread`` (orbax/checkpoint/checkpoint_manager.py, as of 0.12.8). That thread waits for the step's
commit, then deletes what ``max_to_keep`` lets go: it ends when the save is durable, and its ``run`` keeps the
save's failure in ``exception``. The watcher joins it with the base class's ``threading.Thread.join``: Orbax's
override raises the failure once in each thread that joins, and the watcher must neither take it from the job's
thread nor write an Orbax log line. Nothing waits before ``save`` either: Orbax's ``save`` waits for the
previous save on the job's thread, so what Orbax records of that wait
(``/jax/checkpoint/write/wait_for_prev_duration_secs``, on the main thread only; the logger's statistics) and its
log lines are those of the job without tpuscope. The checkpointer's commit futures do not serve: they are its
own, replaced by the next save. A manager without ``_finalize_thread`` (not Orbax's) has its saves reported
durable when ``save`` returns. Orbax before 0.6.2 clears the failure for the first thread that joins: if that is
the job's, the watcher learns it only if that call returns before the watcher reads the thread.

Failures. A failed save, at the call or in the background, is reported (``ok=False``) and logged, and the job
goes on: ``save`` returns False, and the error Orbax keeps for the next ``save``, ``wait_until_finished`` or
``close`` is taken there, not raised again. If Orbax's next ``save`` raises it, the wrapper calls that ``save``
again, once (a host of a multi-host job then passes Orbax's start-of-save barrier twice; without tpuscope its job
would have raised there). ``raise_errors=True`` raises them where Orbax would. A failed restore is reported, then
raised: the job needs what it asked for. Failures of tpuscope's own part never reach the job.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

from tpuscope.tracing import failures
from tpuscope.tracing.adapter_protocol import CheckpointReporter

log = logging.getLogger("tpuscope")

# How long ``close`` waits for the last save's report (its size read from a bucket, say) before leaving it.
CLOSE_TIMEOUT_SECONDS = 30.0


class OrbaxCheckpoints:
    """An Orbax ``CheckpointManager`` whose saves and restores are reported to a Monitor (see the module)."""

    def __init__(self, manager: Any, monitor: CheckpointReporter, *, raise_errors: bool = False) -> None:
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
        """The manager's ``save``, reported when the checkpoint is durable; False when Orbax skipped it
        (``should_save``) or it failed. While the job waits in it, its position is the save's (tracing/position.py)."""
        with self._monitor.position_at("save"):
            return self._save(step, *args, **kwargs)

    def _save(self, step: int, *args: Any, **kwargs: Any) -> bool:
        started = time.perf_counter()  # what the job waits for includes the previous save's end, as in Orbax
        self._take_error()
        before = finalize_thread(self.manager)
        try:
            try:
                saved = bool(self.manager.save(step, *args, **kwargs))
            except Exception as e:
                if not self._previous_failure(e) or self._raise:
                    raise
                # Orbax's save raised the previous save's failure (reported by its watcher) before saving this
                # step; taken now, so the job's one call saves it.
                before = finalize_thread(self.manager)
                saved = bool(self.manager.save(step, *args, **kwargs))
        except Exception as e:
            if self._raise and self._previous_failure(e):
                raise  # the previous save's, where Orbax raises it: reported already
            self._report("save", step, time.perf_counter() - started, ok=False)
            if self._raise:
                raise
            log.warning("tpuscope: the checkpoint save of step %d failed: %s (reported; the job goes on)", step, e)
            return False
        returned = time.perf_counter()
        if saved:
            after = finalize_thread(self.manager)
            mine = after is not None and after is not before and _step_of(after) in (step, None)
            self._last = _SaveWatcher(self, step, started, returned, after if mine else None)
        return saved

    def restore(self, step: int | None = None, *args: Any, **kwargs: Any) -> Any:
        """The manager's ``restore`` (of the latest step when ``step`` is None), reported with the bytes it read."""
        with self._monitor.position_at("restore"):
            return self._restore(step, *args, **kwargs)

    def _restore(self, step: int | None = None, *args: Any, **kwargs: Any) -> Any:
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
        """The manager's wait; a failed async save, reported by its watcher, is raised only with ``raise_errors``."""
        try:
            with self._monitor.position_at("save"):
                self.manager.wait_until_finished()
        except Exception as e:
            if not self._previous_failure(e) or self._raise:
                raise

    def close(self) -> None:
        """Close the manager (which waits for the last save), then wait for that save's report."""
        with self._monitor.position_at("save"):
            self._close()

    def _close(self) -> None:
        try:
            try:
                self.manager.close()
            except Exception as e:
                if not self._previous_failure(e) or self._raise:
                    raise
                self.manager.close()  # Orbax's close stopped at that error, before closing anything
        finally:
            if self._last is not None:
                self._last.thread.join(CLOSE_TIMEOUT_SECONDS)

    def __enter__(self) -> OrbaxCheckpoints:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- inside ----------------------------------------------------------------------------------------------------

    def _previous_failure(self, error: BaseException) -> bool:
        """Whether ``error``, raised by one of the manager's calls on the job's thread, is the last save's
        failure, which Orbax raises again there (and the watcher reports): then it is taken."""
        last = self._last
        if last is None or last.finalize is None or not _raised_from(error, last.finalize):
            return False
        last.taken = True
        if last.error is None:
            last.error = error  # Orbax before 0.6.2 hands it to the first thread that joins: maybe this one
        return True

    def _take_error(self) -> None:
        """Take, on the job's thread, the error of a failed async save already reported: Orbax raises it once per
        thread, from the next wait, which would otherwise be the next save's. That wait returns at once: the save's
        finalize thread has ended."""
        last = self._last
        if self._raise or last is None or not last.settled.is_set() or last.error is None or last.taken:
            return
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            if not self._previous_failure(e):
                raise
        last.taken = True

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
    """Waits, on a thread of its own, for one save's finalize thread (Orbax's) to end, then reports the save."""

    def __init__(
        self, owner: OrbaxCheckpoints, step: int, started: float, returned: float, finalize: threading.Thread | None
    ) -> None:
        self.settled = threading.Event()  # the save is durable, or failed
        self.finalize = finalize  # Orbax's thread that finalizes the save; None: durable when save() returned
        self.error: BaseException | None = None  # the save's failure, as Orbax's finalize thread kept it
        self.taken = False  # whether the job's thread has taken that error from the manager
        self._owner = owner
        self._step = step
        self._started = started
        self._returned = returned  # when save() returned: the job waited from started to here
        self.thread = threading.Thread(target=self._run, name=f"tpuscope-orbax-save-{step}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        owner, finalize = self._owner, self.finalize
        if finalize is not None:
            # The base class's join: Orbax's would take the failure the job's thread must still get (see the module).
            threading.Thread.join(finalize)
            self.error = self.error or getattr(finalize, "exception", None)
        durable = time.perf_counter() if finalize is not None else self._returned  # synchronous: made in the call
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


def finalize_thread(manager: Any) -> threading.Thread | None:
    """The thread that finalizes the manager's latest async save (Orbax's ``_FinalizeThread``, kept in an
    ``OptionalRef`` since 0.11.6, in a plain attribute before), or None: none yet, or not Orbax's manager."""
    kept = getattr(manager, "_finalize_thread", None)
    thread = kept.get() if kept is not None and callable(getattr(kept, "get", None)) else kept
    return thread if isinstance(thread, threading.Thread) else None


def _step_of(thread: threading.Thread) -> int | None:
    """The step of Orbax's finalize thread (``step()``, since 0.6), None when it does not say."""
    step: Callable[[], Any] | None = getattr(thread, "step", None)
    try:
        return int(step()) if callable(step) else None
    except Exception:
        return None


def _raised_from(error: BaseException, thread: threading.Thread) -> bool:
    """Whether ``error`` is the failure kept by Orbax's finalize ``thread``: the object itself, or (once Orbax
    before 0.6.2 cleared it) one whose traceback passes through the thread's ``run`` or ``join``."""
    if error is getattr(thread, "exception", None):
        return True
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_locals.get("self") is thread:
            return True
        tb = tb.tb_next
    return False


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
