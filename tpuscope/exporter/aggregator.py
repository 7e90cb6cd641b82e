"""Fold validated events into the catalogue's metrics.

One handler per event type, looked up by the event's class. Only the ingest thread
calls them, and :meth:`Aggregator.tick` and :meth:`Aggregator.expire` too, so the
aggregator's own state (each workload's goodput ledger, its processes, its last
progress) has one writer. Other threads only read: the HTTP threads read the
prometheus_client objects and the sample store, which lock themselves, and a
collector's thread reads :meth:`Aggregator.progress`, which copies each dict whole.

Before its handler, an event's label values pass the :class:`LabelLimiter`
(a value past ``max_label_values`` becomes ``_overflow``), and a workload that
has had no process connected and no event for ``workload_expiry`` seconds is
forgotten (:meth:`Aggregator.expire`): its series, its goodput ledger and its
label values go, so a sidecar that outlives many jobs does not serve them all.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from tpuscope import __version__, catalog, events
from tpuscope.conventions import PROFILE_FRESH_PERIODS, PROFILE_FRESH_SECONDS
from tpuscope.exporter.labels import LIMITED, OTHER_LABELS, LabelLimiter
from tpuscope.exporter.metrics import Series
from tpuscope.exporter.samples import SampleStore
from tpuscope.exporter.training_health import TrainingHealth
from tpuscope.goodput import CATEGORIES as GOODPUT_CATEGORIES
from tpuscope.goodput import Increments, WorkloadGoodput
from tpuscope.utilization import Mfu, ProfileSummary, measured_steps

log = logging.getLogger("tpuscope.exporter")

INGEST_RESULTS = catalog.INGEST_EVENTS.values(catalog.Label.RESULT)
CONNECTION_ERRORS = catalog.INGEST_CONNECTION_ERRORS.values(catalog.Label.REASON)
# The SampleStore owner of the device memory that workloads report: one for all jobs.
DEVICE_MEMORY_OWNER = "workload"


@dataclass(frozen=True)
class Capture:
    """A device-profile capture that measured something, as the sidecar keeps it to average with the next."""

    received: float  # Unix time
    steps: tuple[events.ProfiledStep, ...]


@dataclass
class WorkloadState:
    """What the sidecar remembers of one workload between its events."""

    goodput: WorkloadGoodput = field(default_factory=WorkloadGoodput)
    wall_served: float = 0.0  # of goodput.wall, what the wall counter holds
    down_served: float | None = None  # what the down-since gauge holds
    start_served: bool = False  # the start-time gauge holds the first start this sidecar saw
    peak_flops_per_second: float = 0.0
    mfu: Mfu = field(default_factory=lambda: Mfu(catalog.MFU_STEPS))
    # The latest captures that measured, oldest first: the profile gauges' mean is over their steps.
    captures: deque[Capture] = field(default_factory=lambda: deque(maxlen=catalog.PROFILE_MEAN_CAPTURES))
    profile_period: float = 0.0  # the job's capture period as its latest attempt said it (0: unknown)
    training: TrainingHealth = field(default_factory=TrainingHealth)
    rolled_back_served: tuple[int, float] = (0, 0.0)  # what the rollback counters hold: steps, seconds
    # Monotonic time of its latest event, or of its last process leaving: the expiry clock.
    last_seen: float = field(default_factory=time.monotonic)


class Aggregator:
    def __init__(
        self,
        metrics: Series,
        store: SampleStore,
        *,
        max_label_values: int = 100,
        workload_expiry: float = 3600.0,
    ) -> None:
        self.metrics = metrics
        self._now = 0.0  # Unix time of the event being folded in (apply sets it)
        self._store = store
        self._expiry = workload_expiry
        self._handlers: dict[type, Callable[[Any], None]] = {
            events.Step: self._step,
            events.Compile: self._compile,
            events.CompileCache: self._compile_cache,
            events.Checkpoint: self._checkpoint,
            events.DeviceMemory: self._device_memory,
            events.ProgramMemory: self._program_memory,
            events.Hardware: self._hardware,
            events.Lifecycle: self._lifecycle,
            events.InferenceBatch: self._inference_batch,
            events.CompileFailure: self._compile_failure,
            events.Recompile: self._recompile,
            events.ModelLoaded: self._model_loaded,
            events.TrainingValues: self._training_values,
        }
        self._workloads: dict[str, WorkloadState] = {}
        self._processes: dict[str, int] = {}  # workload -> its connected processes
        self._progressed: dict[str, float] = {}  # workload -> Unix time of its last progress (LAST_PROGRESS)
        ingest = self.metrics[catalog.INGEST_EVENTS]
        self._ingest = {result: ingest.labels(result) for result in INGEST_RESULTS}
        invalid = self.metrics[catalog.INGEST_INVALID_EVENTS]
        invalid_reasons = catalog.INGEST_INVALID_EVENTS.values(catalog.Label.REASON)
        self._invalid = {reason: invalid.labels(reason) for reason in invalid_reasons}
        errors = self.metrics[catalog.INGEST_CONNECTION_ERRORS]
        self._connection_errors = {reason: errors.labels(reason) for reason in CONNECTION_ERRORS}
        self.metrics[catalog.BUILD_INFO].labels(__version__).set(1)
        values, overflow = self.metrics[catalog.LABEL_VALUES], self.metrics[catalog.LABEL_OVERFLOW]
        self._limiter = LabelLimiter(
            max_label_values,
            on_overflow=lambda label: overflow.labels(label).inc(),
            on_held=lambda label, count: values.labels(label).set(count),
        )
        for label in LIMITED:  # from startup, at zero: a label that never overflows still says so
            values.labels(label).set(0)
            overflow.labels(label)
        self._expired = self.metrics[catalog.WORKLOADS_EXPIRED]
        self._per_workload = [m for metric, m in metrics.items() if catalog.Label.WORKLOAD in metric.labels]

    # --- the ingest loop's entry points --------------------------------------------
    def process_joined(self, workload: str) -> None:
        """A connected process said which workload it belongs to."""
        self._processes[workload] = self._processes.get(workload, 0) + 1
        self.metrics[catalog.WORKLOAD_PROCESSES].labels(workload).set(self._processes[workload])

    def progress(self) -> dict[str, float]:
        """Each workload with a process connected -> the Unix time of its last progress (a step, its start, a
        checkpoint or a compile stage ending), for the libtpu collector, which asks the runtime what a stalled
        job's cores are doing. Called from a collector's thread: it copies each dict whole (one C call under
        the GIL) rather than iterate what the ingest thread changes."""
        connected, progressed = dict(self._processes), dict(self._progressed)
        return {workload: progressed[workload] for workload in connected if workload in progressed}

    def process_left(self, workload: str, source: Hashable = None) -> None:
        """One of the workload's processes disconnected, or now reports another workload; the series goes with
        the last one. Its goodput ledger ends, if a failure (or its vanishing) has not ended it already: what it
        sent after its stop or failure, or under this workload before it took another name."""
        if source is not None and (state := self._workloads.get(workload)) is not None:
            self._book(workload, state, state.goodput.left(source, time.time(), clean=True), wall=True)
        self._processes[workload] -= 1
        if self._processes[workload] > 0:
            self.metrics[catalog.WORKLOAD_PROCESSES].labels(workload).set(self._processes[workload])
        else:
            del self._processes[workload]
            self.metrics[catalog.WORKLOAD_PROCESSES].remove(workload)
            # The expiry clock starts when the last process leaves, even if its last event is older.
            self._workload(workload).last_seen = time.monotonic()

    def accept(self, event: events.AnyEvent, at: float | None = None, source: Hashable = None) -> str:
        """A valid event from a job, sent at ``at`` (Unix time; default: now) by the process behind ``source``
        (its connection: one goodput ledger each); the workload it was filed under (``_overflow`` past the cap)."""
        workload = self.apply(event, at, source)
        self._ingest[catalog.ACCEPTED].inc()
        return workload

    def apply(self, event: events.AnyEvent, at: float | None = None, source: Hashable = None) -> str:
        """Fold an event into the metrics without counting it as received (the sidecar's own inferences)."""
        # When it happened, for the timestamps and the goodput ledger: the ingest reads the kernel's stamp of
        # the send, since it polls its connections and receives an event up to tens of milliseconds later.
        self._now = time.time() if at is None else at
        # The common case, a step of a known workload, costs two look-ups here: a workload with a state
        # is one the limiter holds (or _overflow). Only an event with a new workload or with other
        # labels goes through the limiter, and is copied only if a value overflows.
        state = self._workloads.get(event.workload)
        if state is None or OTHER_LABELS[type(event)]:
            event = self._limiter.limit(event)
            # Before the handler: a handler's failure must not leave a held workload without a state to expire.
            state = self._workload(event.workload)
        state.last_seen = time.monotonic()
        self._handlers[type(event)](event)
        increments = state.goodput.observe(event, self._now, source)
        if type(event) is events.Lifecycle:
            # Wall time moves with the clock: each second (tick), and at each process's start and end.
            self._book(event.workload, state, increments, wall=True)
            self._run_ended(event, state.goodput)
        elif increments or state.goodput.gaps or state.down_served is not None:
            self._book(event.workload, state, increments, wall=False)
        if type(event) is events.Checkpoint:
            self._rolled_back(event.workload, state)
        return event.workload

    def _rolled_back(self, workload: str, state: WorkloadState) -> None:
        """Serve what the workload's restores threw away (goodput.Rollbacks), as it grew."""
        rollbacks = state.goodput.rollbacks
        steps, seconds = state.rolled_back_served
        if rollbacks.steps > steps:
            self.metrics[catalog.GOODPUT_ROLLED_BACK_STEPS].labels(workload).inc(rollbacks.steps - steps)
        if rollbacks.seconds > seconds:
            self.metrics[catalog.GOODPUT_ROLLED_BACK].labels(workload).inc(rollbacks.seconds - seconds)
        state.rolled_back_served = (rollbacks.steps, rollbacks.seconds)

    def _run_ended(self, e: events.Lifecycle, goodput: WorkloadGoodput) -> None:
        """The end of the workload's wall time: its last process stopped cleanly and none is down."""
        end = self.metrics[catalog.WORKLOAD_END_TIME]
        if e.state == "stop" and not goodput.processes and not goodput.gaps:
            end.labels(e.workload).set(self._now)
        elif e.state == "start":
            end.remove(e.workload)

    def tick(self, now: float | None = None) -> None:
        """Bring every workload's wall time and ongoing downtime up to ``now`` (Unix time; default: now). The ingest
        thread calls it every second, so both grow between events, and a job that is down reads so at once."""
        now = time.time() if now is None else now
        for workload, state in self._workloads.items():
            self._book(workload, state, state.goodput.tick(now), wall=True)

    def _book(self, workload: str, state: WorkloadState, increments: Increments, wall: bool) -> None:
        goodput = self.metrics[catalog.GOODPUT]
        for category, seconds in increments:
            goodput.labels(workload, category).inc(seconds)
        if not wall:
            if not state.goodput.gaps and state.down_served is None:  # a step's: nothing else moved
                return
        elif (grown := state.goodput.wall - state.wall_served) > 0:
            self.metrics[catalog.GOODPUT_WALL].labels(workload).inc(grown)
            state.wall_served = state.goodput.wall
        if (since := state.goodput.down_since) != state.down_served:
            down = self.metrics[catalog.WORKLOAD_DOWN_SINCE]
            if since is None:
                down.remove(workload)
            else:
                down.labels(workload).set(since)
            state.down_served = since

    def _workload(self, workload: str) -> WorkloadState:
        if (state := self._workloads.get(workload)) is None:
            state = self._workloads[workload] = WorkloadState()
        return state

    def expire(self, now: float | None = None) -> list[str]:
        """Forget the workloads with no process connected and no event for ``workload_expiry`` seconds.

        Called by the ingest thread (never concurrently with an event's handling); 0 turns it off.
        """
        if not self._expiry:
            return []
        now = time.monotonic() if now is None else now
        gone = [
            workload
            for workload, state in self._workloads.items()
            if workload not in self._processes and now - state.last_seen >= self._expiry
        ]
        for workload in gone:
            self._forget(workload, now - self._workloads[workload].last_seen)
        return gone

    def _forget(self, workload: str, idle: float) -> None:
        """Remove every series of the workload, its state and its label values; it may come back afresh."""
        del self._workloads[workload]
        self._progressed.pop(workload, None)
        for metric in self._per_workload:
            metric.remove_matching(catalog.Label.WORKLOAD, workload)
        for label, value in self._limiter.release(workload):
            # Reported device memory carries no workload label: its series go with the device or
            # accelerator value once no remaining workload uses it (the limiter freed the value).
            if label in (catalog.Label.DEVICE, catalog.Label.ACCELERATOR):
                self._store.remove_matching(DEVICE_MEMORY_OWNER, catalog.Label(label), value)
        self._expired.inc()
        log.info(
            "workload %s expired after %.0f s without a process or an event; its series are removed", workload, idle
        )

    def reject(self, reason: str) -> None:
        self._ingest[catalog.INVALID].inc()
        self._invalid[reason].inc()

    def connection_error(self, reason: str) -> None:
        """A job connection the sidecar could not take or read (one of CONNECTION_ERRORS)."""
        self._connection_errors[reason].inc()

    # --- one handler per event type ----------------------------------------------------
    def _step(self, e: events.Step) -> None:
        m = self.metrics
        # A kept step's trace id rides on its bucket as an exemplar (served under OpenMetrics), so a
        # slow bucket on a dashboard links to the trace of a step that landed in it.
        exemplar = {"trace_id": e.trace_id} if e.trace_id else None
        m[catalog.STEP_DURATION].labels(e.workload).observe(e.duration_s, exemplar)
        phases = m[catalog.STEP_PHASE_DURATION]
        for phase, seconds in e.phase_seconds():
            phases.labels(e.workload, phase).observe(seconds)
        m[catalog.STEPS].labels(e.workload).inc()
        m[catalog.LAST_STEP].labels(e.workload).set(self._now)
        self._progress(e.workload)
        if e.dropped:
            self._ingest[catalog.DROPPED].inc(e.dropped)
        if e.values or e.unread:
            self._step_values(e.workload, e.values, e.unread)
        if e.profile is not None and not e.profile.served:  # a served one was counted as it was parsed
            self._profile(e.workload, e.profile)
        if e.flops:
            m[catalog.MODEL_FLOPS].labels(e.workload).inc(e.flops)
            state = self._workload(e.workload)
            state.mfu.add(e.flops, e.duration_s)
            if (mfu := state.mfu.of(state.peak_flops_per_second)) is not None:
                m[catalog.MFU].labels(e.workload).set(mfu)

    def parsed_profile(self, workload: str, profile: events.DeviceProfile) -> None:
        """A capture this sidecar parsed and serves itself (tpuscope.exporter.profiles), whether or not its job is
        still there to carry the answer back; the step that does carries it marked ``served``. Called on the ingest
        thread, as the events are."""
        self._now = time.time()
        workload = self._limiter.value(catalog.Label.WORKLOAD, workload, workload)
        state = self._workload(workload)
        state.last_seen = time.monotonic()
        self._profile(workload, profile)

    def _profile(self, workload: str, p: events.DeviceProfile) -> None:
        """A device-profile capture, riding on a step. Every attempt is counted with its cost, and says the job's
        period where it knows it (a busy or failed one too: the rules judge the last reading's age by it); only
        one that measured sets the other gauges and their timestamp: a busy or failed capture leaves the last
        reading."""
        m = self.metrics
        m[catalog.PROFILE_CAPTURES].labels(workload, p.result).inc()
        m[catalog.PROFILE_CAPTURE_SECONDS].labels(workload).inc(p.capture_s)
        m[catalog.PROFILE_CAPTURE_BYTES].labels(workload).inc(p.trace_bytes)
        state = self._workload(workload)
        if p.period_s:  # 0: a job older than the field, whose captures the rules judge by the default period
            m[catalog.PROFILE_PERIOD].labels(workload).set(p.period_s)
            state.profile_period = p.period_s
        if p.result != "ok":
            return
        ops = m[catalog.PROFILE_OPS]
        for classifier, count in zip(catalog.PROFILE_OP_CLASSIFIERS, (p.ops_by_category, p.ops_by_name), strict=True):
            ops.labels(workload, classifier).inc(count)
        self._keep_fresh(state)
        state.captures.append(Capture(self._now, measured_steps(p)))
        self._serve_profile(workload, ProfileSummary.of(step for capture in state.captures for step in capture.steps))
        m[catalog.PROFILE_LAST_CAPTURE].labels(workload).set(self._now)

    def _keep_fresh(self, state: WorkloadState) -> None:
        """Drop the kept captures that the rules would no longer count fresh: a mean of the last few captures
        must not carry one from before a long pause (a job that stopped capturing, then resumed)."""
        period = state.profile_period
        fresh_for = period * PROFILE_FRESH_PERIODS if period else PROFILE_FRESH_SECONDS
        while state.captures and state.captures[0].received <= self._now - fresh_for:
            state.captures.popleft()

    def _serve_profile(self, workload: str, summary: ProfileSummary) -> None:
        m = self.metrics
        m[catalog.PROFILE_STEP].labels(workload).set(summary.step_s)
        m[catalog.PROFILE_STEPS].labels(workload).set(summary.steps)
        parts, spread = m[catalog.PROFILE_TIME], m[catalog.PROFILE_TIME_STDDEV]
        for part in catalog.PROFILE_PARTS:
            parts.labels(workload, part).set(summary.parts[part])
            spread.labels(workload, part).set(summary.stddev[part])
        # A ratio with nothing to divide (no collective, no compute) is undefined: no series rather than
        # a 0 that reads "nothing hidden" or a former capture's value.
        self._ratio(catalog.PROFILE_OVERLAP, workload, summary.overlap)
        self._ratio(catalog.PROFILE_IMBALANCE, workload, summary.imbalance)

    def _ratio(self, metric: catalog.GaugeMetric, workload: str, value: float | None) -> None:
        if value is not None:
            self.metrics[metric].labels(workload).set(value)
        else:
            self.metrics[metric].remove(workload)

    def _hardware(self, e: events.Hardware) -> None:
        self._workload(e.workload).peak_flops_per_second = e.peak_flops_per_second
        self.metrics[catalog.PEAK_FLOPS].labels(e.workload, e.accelerator).set(e.peak_flops_per_second)
        self.metrics[catalog.WORKLOAD_DEVICES].labels(e.workload, e.accelerator).set(e.devices)

    def _compile(self, e: events.Compile) -> None:
        self.metrics[catalog.COMPILE_DURATION].labels(e.workload, e.stage).observe(e.duration_s)
        # JAX reports each stage when it ends, which is when the next one begins: a long backend compile is
        # timed from the lowering's end, not from the step before it.
        self._progress(e.workload)

    def _compile_failure(self, e: events.CompileFailure) -> None:
        self.metrics[catalog.COMPILE_FAILURES].labels(e.workload, e.stage, e.reason).inc()

    def _recompile(self, e: events.Recompile) -> None:
        self.metrics[catalog.RECOMPILES].labels(e.workload, e.cause).inc()

    def _model_loaded(self, e: events.ModelLoaded) -> None:
        """The model's age counts from here; the version it replaced goes (one series per workload)."""
        loaded = self.metrics[catalog.MODEL_LOADED]
        loaded.remove_matching(catalog.Label.WORKLOAD, e.workload)
        loaded.labels(e.workload, e.version).set(self._now)

    def _compile_cache(self, e: events.CompileCache) -> None:
        self.metrics[catalog.COMPILE_CACHE_REQUESTS].labels(e.workload, "hit" if e.hit else "miss").inc()

    def _checkpoint(self, e: events.Checkpoint) -> None:
        m = self.metrics
        result = "ok" if e.ok else "error"
        m[catalog.CHECKPOINT_DURATION].labels(e.workload, e.operation, result).observe(e.duration_s)
        m[catalog.CHECKPOINT_BYTES].labels(e.workload, e.operation).inc(e.bytes)
        if e.ok and e.operation == "save":
            m[catalog.CHECKPOINT_LAST_SUCCESS].labels(e.workload).set(self._now)
        # Failed ones too: the job came back from it and goes on (CheckpointFailing says the rest).
        self._progress(e.workload)

    def _device_memory(self, e: events.DeviceMemory) -> None:
        # The same families as the libtpu and nvml collectors fill; `source` tells them apart.
        labels = (e.device, e.accelerator, e.source)
        owner = DEVICE_MEMORY_OWNER  # one owner for all jobs: a device's latest report wins, as with one gauge
        self._store.set(owner, catalog.DEVICE_MEMORY_USED, labels, e.used_bytes)
        if e.limit_bytes:
            self._store.set(owner, catalog.DEVICE_MEMORY_LIMIT, labels, e.limit_bytes)
        if e.peak_bytes:
            self._store.set(owner, catalog.DEVICE_MEMORY_PEAK, labels, e.peak_bytes)

    def _program_memory(self, e: events.ProgramMemory) -> None:
        self.metrics[catalog.MEMORY_SPILL].labels(e.workload, e.program).set(e.spill_bytes)

    def _lifecycle(self, e: events.Lifecycle) -> None:
        log.info("workload %s: %s (%s)", e.workload, e.state, e.reason)
        if e.state == "start":
            # Create the counters at zero, so Prometheus' rate() and increase() see their first change too.
            self.metrics[catalog.STEPS].labels(e.workload)
            # A (re)start is progress too: stall detection counts from here, not from before a restart.
            self.metrics[catalog.LAST_STEP].labels(e.workload).set(self._now)
            self._progress(e.workload)
            for category in GOODPUT_CATEGORIES:
                self.metrics[catalog.GOODPUT].labels(e.workload, category)
            self.metrics[catalog.GOODPUT_WALL].labels(e.workload)
            self.metrics[catalog.GOODPUT_ROLLED_BACK].labels(e.workload)
            self.metrics[catalog.GOODPUT_ROLLED_BACK_STEPS].labels(e.workload)
            state = self._workload(e.workload)
            if not state.start_served:
                state.start_served = True
                self.metrics[catalog.WORKLOAD_START_TIME].labels(e.workload).set(self._now)
        elif e.state == "restart":
            self.metrics[catalog.WORKLOAD_RESTARTS].labels(e.workload, e.reason).inc()
        elif e.state == "failure":
            self.metrics[catalog.WORKLOAD_FAILURES].labels(e.workload, e.reason).inc()

    def _progress(self, workload: str) -> None:
        """The workload progressed (a step, a start, a checkpoint or a compile stage ending): TpuscopeWorkloadStalled
        counts from here, and so does the libtpu collector's question on the cores' state (:meth:`progress`)."""
        self.metrics[catalog.LAST_PROGRESS].labels(workload).set(self._now)
        self._progressed[workload] = self._now

    def _training_values(self, e: events.TrainingValues) -> None:
        self._step_values(e.workload, e.values, e.unread)

    def _step_values(self, workload: str, values: tuple[events.StepValues, ...], unread: int) -> None:
        """Steps' loss, gradient norm and local value (tracing/training_values.py), on a step or at the job's close;
        exporter/training_health.py says what is kept of them."""
        m = self.metrics
        health = self._workload(workload).training
        m[catalog.TRAINING_VALUES_UNREAD].labels(workload).inc(unread)  # at 0 from the first
        nonfinite, onsets = m[catalog.TRAINING_NONFINITE], m[catalog.TRAINING_NONFINITE_ONSET]
        for step in values:
            for value, reading in step.values():
                m[catalog.TRAINING_VALUE].labels(workload, value).set(reading)
                count = nonfinite.labels(workload, value)  # at 0 from the first reading: the first NaN is an increase
                finite = math.isfinite(reading)
                if health.onset(value, finite):
                    onsets.labels(workload, value).set(step.step)
                if not finite:
                    count.inc()
                elif value == "loss" and (deviation := health.baseline.deviation(reading)) is not None:
                    m[catalog.LOSS_DEVIATION].labels(workload).set(deviation)

    def _inference_batch(self, e: events.InferenceBatch) -> None:
        m = self.metrics
        m[catalog.INFERENCE_BATCH_SIZE].labels(e.workload).observe(e.batch_size)
        m[catalog.INFERENCE_QUEUE_DEPTH].labels(e.workload).set(e.queue_depth)
        latency = m[catalog.INFERENCE_REQUEST_DURATION].labels(e.workload)
        for seconds in e.request_seconds:
            latency.observe(seconds)
