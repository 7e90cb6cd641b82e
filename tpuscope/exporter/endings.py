"""Why a job ended when it ended without a word: the verdict on a connection that closed with no stop or failure.

A job stopped by SIGTERM's default action (the Monitor installs no handler unless asked), killed by SIGKILL, or
crashed in native code closes its connection and says nothing. On a Compute Engine or Cloud TPU VM the metadata
server says when the VM is preempted or stopped for host maintenance (tpuscope/gce_metadata.py), so a job that
vanishes is booked ``failure{reason}``: ``preemption`` or ``maintenance`` when the metadata server says so,
``vanished`` otherwise. A crash is never booked preemption unless its VM was being preempted.

The verdict (docs/failures.md) is booked at once where no metadata server serves the notices (none, or GKE's,
which a pod under Workload Identity reaches instead; one request at start finds out); else on an answer asked
after the job vanished, ``vanished`` without a notice after :data:`HOLD_SECONDS`. The kubelet stops a native
sidecar right after the job's container exits, whether the pod is being deleted (a preempted node drains) or its
job crashed, and a notice can lag the job's end: at that SIGTERM the sidecar asks once more and books every
verdict still pending on that answer before its last scrape. A new process of the same workload books its
predecessor's verdict first (on the answer in by then), so the workload's downtime is the gap between the two.

The ingest thread (ingest.py) owns the aggregator and must never wait on HTTP: the metadata server is asked on a
thread of its own, one lookup at a time, and the ingest thread books each verdict at its next round, at the time
the job vanished, so the goodput ledger reads as if it had been booked then.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from tpuscope import events, gce_metadata, reasons
from tpuscope.exporter.aggregator import Aggregator

log = logging.getLogger("tpuscope.exporter")

# How long a vanished job's verdict waits for the sidecar's own SIGTERM when the metadata server has no notice:
# room for the kubelet to see the job's container exit at its next relist and stop the native sidecars in the same
# pod sync, yet under a scrape interval, so where nothing stops the sidecar a crash reads vanished within a scrape.
HOLD_SECONDS = 10.0
# How long an answer may take once asked: two requests, each a connect and a read within the module's timeout.
ANSWER_SECONDS = 4 * gce_metadata.TIMEOUT_SECONDS + 1.0


@dataclass(frozen=True)
class _Vanished:
    workload: str
    source: Hashable  # its connection: the goodput ledger the verdict ends
    at: float  # Unix time its connection closed: the verdict is booked at it
    since: float  # the same on the monotonic clock: only answers asked after it count


class Endings:
    """The verdicts on jobs that vanished: :meth:`vanished` and :meth:`settle` on the ingest thread only."""

    def __init__(self, aggregator: Aggregator, environ: Mapping[str, str] = os.environ) -> None:
        self._aggregator = aggregator
        self._environ = environ
        # The jobs whose verdict waits, oldest first: a plain list, as the ingest looks at it at every event.
        self.pending: list[_Vanished] = []
        # The latest lookup that ended: (monotonic time it began, its reason), replaced and read whole (two threads).
        self._answer: tuple[float, str | None] = (-math.inf, None)
        self._stopping_since: float | None = None  # monotonic time the sidecar was told to stop
        self._wanted = threading.Event()  # a lookup is wanted: set by the ingest thread and at the stop
        self._closed = False
        host = gce_metadata.metadata_host(environ)
        self.asking = host is not None  # whether verdicts wait for the metadata server; cleared if it cannot tell
        if self.asking:
            log.info("a job that ends without a word is booked as the metadata server at %s says", host)
            threading.Thread(target=self._ask, name="tpuscope-endings", daemon=True).start()

    def vanished(self, workload: str, source: Hashable) -> None:
        """The process behind ``source`` closed its connection without a stop or failure, just now."""
        if not self.asking:
            self._book(workload, source, reasons.VANISHED, at=None)
            return
        self.pending.append(_Vanished(workload, source, time.time(), time.monotonic()))
        self._wanted.set()

    def settle(self, workload: str | None = None, everything: bool = False) -> int:
        """Book the verdicts that are in, and how many: every one due, plus, without waiting longer, those of
        ``workload`` (a new process of it has come) or all of them (``everything``: the ingest has stopped)."""
        if not self.pending:
            return 0
        now = time.monotonic()
        waiting = []
        for job in self.pending:
            reason = self._verdict(job, now, hurry=everything or job.workload == workload)
            if reason is None:
                waiting.append(job)
            else:
                self._book(job.workload, job.source, reason, job.at)
        booked = len(self.pending) - len(waiting)
        self.pending = waiting
        return booked

    def stopping(self) -> None:
        """The sidecar was told to stop: ask once more for the verdicts pending (a notice can lag the job's end),
        and from now on book each verdict on the first answer asked after both its job's end and the stop."""
        if self._stopping_since is None:
            self._stopping_since = time.monotonic()
            if self.pending:
                self._wanted.set()

    def close(self) -> None:
        """Stop the asking thread (after :meth:`settle` with ``everything``)."""
        self._closed = True
        self._wanted.set()

    def _verdict(self, job: _Vanished, now: float, hurry: bool) -> str | None:
        """The reason to book for ``job``, or None while it should wait for an answer."""
        asked_at, reason = self._answer
        answered = asked_at >= job.since
        if answered and reason is not None:
            return reason
        if hurry or not self.asking or now >= job.since + HOLD_SECONDS:
            return reasons.VANISHED
        if self._stopping_since is not None:
            since = max(job.since, self._stopping_since)
            if asked_at >= since or now >= since + ANSWER_SECONDS:
                return reasons.VANISHED
        return None

    def _book(self, workload: str, source: Hashable, reason: str, at: float | None) -> None:
        ended = events.Lifecycle(workload=workload, state="failure", reason=reason)
        self._aggregator.apply(ended, at=at, source=source)

    def _ask(self) -> None:
        """The asking thread: once, whether the server here serves the notices at all; then a lookup whenever
        one is wanted, one at a time (a lookup wanted while one runs is the next)."""
        if gce_metadata.serves_termination_notices(self._environ) is False:
            self.asking = False
            log.info(
                "the metadata server here does not serve instance/preempted (GKE's, under Workload Identity?): "
                "a job that ends without a word is booked vanished (docs/failures.md: run the sidecar with "
                "hostNetwork to reach the VM's)"
            )
            return
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._closed:
                return
            asked_at = time.monotonic()
            self._answer = (asked_at, gce_metadata.termination_reason(self._environ))
