"""Run a collector on its own thread: interval, deadline, health metrics, backoff, one log line per change.

A collection runs on a worker thread and the runner waits for it at most the
deadline. One that passes it is marked down (``deadline``) and left to finish
on its own; no second collection starts while it hangs, so a stuck device
driver costs one thread, not one per interval. After a failure the next try
waits twice as long as the one before (from the interval up to
:data:`MAX_BACKOFF`), so a source that is down is not hammered; the first
success puts the interval back.
"""

from __future__ import annotations

import concurrent.futures
import logging
import random
import threading
import time

from tpuscope import catalog
from tpuscope.exporter.collectors.base import DEADLINE, ERROR, REASONS, Collector, CollectorError, Settings
from tpuscope.exporter.metrics import Series
from tpuscope.exporter.samples import Sample, SampleStore

log = logging.getLogger("tpuscope.collectors")

MAX_BACKOFF = 60.0


class CollectorRunner:
    def __init__(
        self,
        collector: type[Collector],
        settings: Settings,
        interval: float,
        deadline: float,
        store: SampleStore,
        metrics: Series,
    ) -> None:
        self.name = collector.name
        self.interval = interval
        self.deadline = deadline
        self._factory = collector
        self._settings = settings
        self._store = store
        self._instance: Collector | None = None
        self._up = metrics[catalog.COLLECTOR_UP].labels(self.name)
        self._duration = metrics[catalog.COLLECTOR_DURATION].labels(self.name)
        errors = metrics[catalog.COLLECTOR_ERRORS]
        # Every reason at 0 from the start, so increase() sees the first error too.
        self._errors = {reason: errors.labels(self.name, reason) for reason in REASONS}
        self._up.set(0)
        self.failures = 0  # consecutive
        self._state: str | None = None  # "up", or the reason it is down; None before the first try
        self._hung: concurrent.futures.Future[list[Sample]] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tpuscope-{self.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.deadline + 1)
        if self._instance is not None and (self._hung is None or self._hung.done()):
            self._instance.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.collect_once()
            if self.failures:
                delay = min(MAX_BACKOFF, self.interval * 2 ** min(self.failures - 1, 16))
                delay *= random.uniform(0.9, 1.1)  # many sidecars restarted together should not retry in step
            else:
                delay = self.interval
            self._stop.wait(delay)

    def collect_once(self) -> None:
        """One collection, bounded by the deadline; its outcome goes to the store and the health metrics."""
        started = time.perf_counter()
        try:
            if self._hung is not None and not self._hung.done():
                raise CollectorError(DEADLINE, "the previous collection has still not returned")
            self._hung = None
            future = self._start_collection()
            try:
                samples = future.result(timeout=self.deadline)
            except concurrent.futures.TimeoutError:
                self._hung = future
                raise CollectorError(DEADLINE, f"no answer within the {self.deadline:g} s deadline") from None
            self._store.replace(self.name, samples)
        except CollectorError as e:
            self._failed(e)
        except Exception as e:  # a bug of ours, or a library raising what it should not: report, keep going
            log.debug("collector %s raised", self.name, exc_info=True)
            self._failed(CollectorError(ERROR, f"{type(e).__name__}: {e}"))
        else:
            self._up.set(1)
            if self._state != "up":
                suffix = f" after {self.failures} failed collections" if self.failures else ""
                log.info("collector %s: up%s (%d series)", self.name, suffix, len(samples))
            self._state = "up"
            self.failures = 0
        finally:
            self._duration.set(time.perf_counter() - started)

    def _start_collection(self) -> concurrent.futures.Future[list[Sample]]:
        """Run one collection on a daemon thread: one stuck in a driver must not keep the sidecar from exiting."""
        future: concurrent.futures.Future[list[Sample]] = concurrent.futures.Future()

        def work() -> None:
            try:
                future.set_result(self._collect())
            except BaseException as e:
                future.set_exception(e)

        threading.Thread(target=work, name=f"tpuscope-collect-{self.name}", daemon=True).start()
        return future

    def _collect(self) -> list[Sample]:
        if self._instance is None:
            self._instance = self._factory(self._settings)
        return self._instance.collect(self.deadline)

    def _failed(self, error: CollectorError) -> None:
        # What could still be read is served; what could not disappears rather than freezing at old values.
        try:
            self._store.replace(self.name, error.partial)
        except ValueError:
            self._store.clear(self.name)
        self._up.set(0)
        self._errors[error.reason].inc()
        self.failures += 1
        if self._state != error.reason:  # one line per change of state, not one per try
            log.warning("collector %s: down (%s): %s; retrying with backoff", self.name, error.reason, error)
        self._state = error.reason
