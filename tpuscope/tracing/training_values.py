"""A step's loss, gradient norm and local value, read without waiting for the device.

``s.loss(loss, grad_norm=g, local=mine)`` (:meth:`tpuscope.tracing.monitor.StepTimer.loss`) hands over JAX
arrays the step's program is still computing: reading one at once (``float(loss)``) would block the host until
the device is done, and take away the asynchronous dispatch that lets the host prepare the next step meanwhile.
So each array starts its copy to the host (``copy_to_host_async``) and waits here; at the end of each later step
the oldest ones that are ready (``is_ready()`` asks without waiting) are read, in the order given, and ride on that
step's event (trailing fields a sidecar older than them ignores: no event of a new kind, no send of their own). One
never ready within :data:`MAX_PENDING` steps, or deleted (a donated buffer), or still pending when the Monitor
closes, is dropped and counted (``unread`` on the next event). Those still unsent at the close go in an event of
their own, :class:`tpuscope.events.TrainingValues`. A number (a Python or NumPy float) is ready at once.

``local`` is this process's value before the reduction that makes the step's loss or gradient one for all: the
sidecars compare it across workers to name the first to go non-finite. An array sharded over several processes
is read from this process's shards only. A value of several elements reads as non-finite if any element is, else
as its largest.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from typing import Any

from tpuscope import events

log = logging.getLogger("tpuscope")

# How many steps' values may wait for the device: a host that runs this far ahead of its device is rare, and a
# value not ready by then is one that never will be (a computation that hangs, a value the job deleted).
MAX_PENDING = events.MAX_STEP_VALUES

Given = tuple[int, Any, Any, Any]  # (step, loss, grad_norm, local), each value None where not given


class PendingValues:
    """The values given and not yet read (``waiting``, oldest first) and the count of those dropped unread: a step's
    end has nothing to do here while both are empty, which it asks with two attribute reads (every step of every
    job asks, most of them never give a value)."""

    __slots__ = ("unread", "waiting")

    def __init__(self) -> None:
        self.waiting: deque[Given] = deque()
        self.unread = 0

    def give(self, step: int, loss: Any, grad_norm: Any, local: Any) -> None:
        for value in (loss, grad_norm, local):
            copy = getattr(value, "copy_to_host_async", None)
            if copy is not None:
                try:
                    copy()
                except Exception:  # a deleted array, a backend without it: is_ready() says the rest
                    log.debug("tpuscope: no asynchronous copy of a training value", exc_info=True)
        if len(self.waiting) >= MAX_PENDING:
            self.waiting.popleft()
            self.unread += 1
        self.waiting.append((step, loss, grad_norm, local))

    def ready(self) -> tuple[events.StepValues, ...]:
        """Read the oldest values that are ready, up to the first that is not (a value unreadable on its own,
        deleted or no number, is dropped and counted)."""
        out: list[events.StepValues] = []
        pending = self.waiting
        while pending:
            step, loss, grad_norm, local = pending[0]
            try:
                if not (_is_ready(loss) and _is_ready(grad_norm) and _is_ready(local)):
                    break
                out.append(events.StepValues(step, _reading(loss), _reading(grad_norm), _reading(local)))
            except Exception as e:  # deleted, or not a number at all: dropped, counted, and the next one read
                log.debug("tpuscope: a training value of step %s is unreadable: %s", step, e)
                self.unread += 1
            pending.popleft()
        return tuple(out)

    def drop_all(self) -> None:
        """The Monitor closes: what is still computing is not waited for, and counts as unread."""
        self.unread += len(self.waiting)
        self.waiting.clear()

    def take_unread(self) -> int:
        """The count of values dropped unread since it was last taken."""
        unread, self.unread = self.unread, 0
        return unread


def _reading(value: Any) -> events.Reading:
    return None if value is None else events.reading(_read(value))


def _is_ready(value: Any) -> bool:
    is_ready = getattr(value, "is_ready", None)
    return is_ready is None or bool(is_ready())


def _read(value: Any) -> float:
    """The value as one float, without waiting (the caller asked ``is_ready`` first). A JAX array is fetched
    explicitly (``jax.device_get``): a job that forbids implicit transfers (``jax.transfer_guard``) to catch its
    own syncs sees none of ours."""
    if isinstance(value, int | float):
        return float(value)
    import numpy as np  # present wherever an array is: jax and NumPy arrays both need it

    if getattr(value, "is_fully_addressable", True) is False:  # over several processes: this process's shards
        device_get = sys.modules["jax"].device_get  # a JAX array, so jax is imported
        parts = [np.asarray(device_get(shard.data)).ravel() for shard in value.addressable_shards]
        array = np.concatenate(parts) if parts else np.asarray([], dtype=float)
    elif hasattr(value, "addressable_shards"):  # all of it here: one transfer, not one per shard
        array = np.asarray(sys.modules["jax"].device_get(value)).ravel()
    else:
        array = np.asarray(value).ravel()
    if array.size == 1:
        return float(array[0])
    if array.size == 0:
        raise ValueError("an empty array")
    finite = np.isfinite(array)
    if not finite.all():
        return float(array[~finite][0])
    return float(array.max())
