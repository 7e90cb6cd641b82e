"""promtool unit-test cases for every alert: input series, when to look, what must (or must not) fire.

Each case names an alert and either the severity it must fire with (its exact labels and description
given) or None: it must stay quiet. tests/test_alerts.py turns them into a `promtool test rules` file
and fails when an alert of the generated rules has no firing case or no quiet one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpuscope import catalog as c
from tpuscope.conventions import AlertName
from tpuscope.promql import SIDECAR_START

HOST = {"job": "tpuscope", "instance": "h:9478"}  # the scrape target's labels
PLACE = {"slice": "0", "worker": "0"}  # the host's place in its job, on every series its sidecar serves


def s(metric: c.Metric | str, suffix: str = "", **labels: str) -> str:
    """A series name with labels, as promtool's input_series wants it (a sidecar's, unless ``metric`` is a
    name: Prometheus' own ``up``, kube-state-metrics')."""
    if isinstance(metric, str):
        return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    name = metric.series(suffix) if suffix else metric.name
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in {**HOST, **PLACE, **labels}.items()) + "}"


def sidecar(
    minutes: int, started: int = 0, gap: range = range(0), instance: str = "h:9478", worker: str = "0"
) -> dict[str, str]:
    """A sidecar's ``up`` and start time (what the rules' count of rare events reads), scraped from minute
    ``started`` to ``minutes``, none of it during ``gap`` (Prometheus was down)."""
    return {
        s("up", **{**HOST, "instance": instance}): values(1, minutes, started, gap),
        s(SIDECAR_START, **{**HOST, **PLACE, "instance": instance, "worker": worker}): values(
            started * 60, minutes, started, gap
        ),
    }


def generations(counter: c.Metric, workers: int, every: int, until: int, **labels: str) -> dict[str, str]:
    """A job of ``workers`` hosts restarted every ``every`` minutes, each time in new pods (a JobSet with
    restartPolicy Never): each generation's sidecars are new targets whose ``counter`` is born at 1."""
    result: dict[str, str] = {}
    for start in range(0, until, every):
        end = until if start + every >= until else start + every - 1
        for worker in map(str, range(workers)):
            instance = f"g{start}-{worker}:9478"
            result |= sidecar(end, start, instance=instance, worker=worker)
            if start:  # the first generation started the job; each later one is a restart
                result[s(counter, instance=instance, worker=worker, **labels)] = values(1, end, start)
    return result


GAP = range(35, 44)  # Prometheus down for 9 minutes, an hour before the 100th minute


def values(value: float, minutes: int, start: int = 0, gap: range = range(0)) -> str:
    """A constant series in promtool's notation, sampled each minute from ``start`` to ``minutes``, with no
    sample during ``gap``."""
    return " ".join("_" if minute < start or minute in gap else f"{value:g}" for minute in range(minutes + 1))


W = {"workload": "w"}


@dataclass(frozen=True)
class Case:
    alert: AlertName
    severity: str | None  # None: must stay quiet
    eval_time: str
    series: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)  # the firing alert's labels besides alertname, severity
    description: str = ""
    also: tuple[tuple[str, str], ...] = ()  # (severity, description) of the same alert firing too


def phases(io: int, sync: int, minutes: int = 40) -> dict[str, str]:
    """One step per second, io and sync taking the given share in hundredths."""
    return {
        s(c.STEP_DURATION, "sum", **W): f"0+60x{minutes}",
        s(c.STEP_PHASE_DURATION, "sum", phase="io", **W): f"0+{io * 60 // 100}x{minutes}",
        s(c.STEP_PHASE_DURATION, "sum", phase="sync", **W): f"0+{sync * 60 // 100}x{minutes}",
    }


def place(index: int) -> dict[str, str]:
    """Worker ``index`` of workload w, alone on its host."""
    return {"instance": f"h{index}:9478", "slice": "0", "worker": str(index), **W}


def workers(*compute: float, minutes: int = 30) -> dict[str, str]:
    """Workers of one workload, worker ``i`` timing ``compute[i]`` seconds of compute a step on the host."""
    result = {}
    for index, seconds in enumerate(compute):
        result[s(c.STEP_PHASE_DURATION, "sum", phase="compute", **place(index))] = f"0+{seconds}x{minutes}"
        result[s(c.STEP_PHASE_DURATION, "count", phase="compute", **place(index))] = f"0+1x{minutes}"
    return result


def lockstep(
    late: dict[int, float], minutes: int, sync: float = 0.05, blip: tuple[int, int, float] | None = None
) -> dict[str, str]:
    """Four workers of workload w (4 chips each) stepping together once a second, each step's input 0.05 s and
    its collective wait ``sync``: worker ``i`` of ``late`` takes ``late[i]`` seconds longer over its input, which
    its peers wait at the collective (``sync`` 0: a step jitted whole, whose wait the host does not see).
    ``blip``: (worker, minute, seconds), that worker's input takes as much longer once."""
    result: dict[str, str] = {}
    for index in range(4):
        where = place(index)
        io = [0.05 * 60 + (late.get(index, 0.0) * 60)] * minutes
        waits = [(sync + max(late.values(), default=0.0) - late.get(index, 0.0)) * 60] * minutes
        if blip and sync:
            worker, minute, seconds = blip
            io[minute] += seconds if index == worker else 0.0
            waits[minute] += 0.0 if index == worker else seconds
        steps = [60.0] * minutes
        duration = [60.0 + (max(late.values(), default=0.0) * 60)] * minutes
        if blip:
            duration[blip[1]] += blip[2]

        def counter(increments: list[float]) -> str:
            total, out = 0.0, ["0"]
            for increment in increments:
                total += increment
                out.append(f"{total:g}")
            return " ".join(out)

        result |= {
            s(c.STEPS, **where): counter(steps),
            s(c.STEP_DURATION, "count", **where): counter(steps),
            s(c.STEP_DURATION, "sum", **where): counter(duration),
            s(c.STEP_PHASE_DURATION, "sum", phase="io", **where): counter(io),
            s(c.WORKLOAD_DEVICES, accelerator="v5e", **where): f"4x{minutes}",
            s(c.WORKLOAD_PROCESSES, **where): f"1x{minutes}",
        }
        if sync:
            result[s(c.STEP_PHASE_DURATION, "sum", phase="sync", **where)] = counter(waits)
        compute = [d - i - w for d, i, w in zip(duration, io, waits if sync else [0.0] * minutes, strict=True)]
        result[s(c.STEP_PHASE_DURATION, "sum", phase="compute", **where)] = counter(compute)
    return result


def started(minute: int, series: dict[str, str]) -> dict[str, str]:
    """``series`` (promtool's notation, from minute 0) begun at ``minute`` instead: none before."""
    return {name: f"{'_ ' * minute}{values}" for name, values in series.items()}


PROFILED_STEP = 2.5  # seconds: one synchronous step, the same on every worker
# Measured steps a sidecar's profile gauges are a mean of: 3 captures of 2 steps (a job older than issue 36's; one of
# this version's captures measures 5).
MEAN_OF_STEPS = 6
ONE_CAPTURE = 2  # an older job's capture's measured steps: too few to judge a worker by


def profiles(
    *parts: tuple[float, float],
    minutes: int = 30,
    until: int = 10**6,
    running: bool = True,
    steps: int | None = MEAN_OF_STEPS,
    held: range | None = None,
) -> dict[str, str]:
    """Device profiles of workers of one workload, captured every 10 minutes up to minute ``until`` (older
    ones go stale; their gauges stay): worker ``i`` computes ``parts[i][0]`` seconds of a step, waits
    ``parts[i][1]`` on collectives that no compute hides and idles the rest, each a mean over ``steps`` measured
    steps (None: a sidecar too old to say). ``running``: its processes are still connected (a finished job's
    gauges linger too). ``held``: the minutes the gauges hold these parts (a slow capture's mean); every worker
    has the first worker's parts at the others."""
    captured = " ".join(f"{min(minute, until) // 10 * 600}" for minute in range(minutes + 1))
    result = {}
    for index, (compute, collective) in enumerate(parts):
        where = place(index)
        seconds = {"compute": compute, "exposed_collective": collective, "idle": PROFILED_STEP - compute - collective}
        usual = {"compute": parts[0][0], "exposed_collective": parts[0][1], "idle": PROFILED_STEP - sum(parts[0])}
        result |= {
            s(c.PROFILE_TIME, part=part, **where): f"{value:g}x{minutes}"
            if held is None
            else " ".join(f"{value if minute in held else usual[part]:g}" for minute in range(minutes + 1))
            for part, value in seconds.items()
        }
        result[s(c.PROFILE_STEP, **where)] = f"{PROFILED_STEP:g}x{minutes}"
        result[s(c.PROFILE_LAST_CAPTURE, **where)] = captured
        if steps is not None:
            result[s(c.PROFILE_STEPS, **where)] = f"{steps}x{minutes}"
        if running:
            result[s(c.WORKLOAD_PROCESSES, **where)] = f"1x{minutes}"
    return result


def collective_history(
    before: float, after: float, at: int, minutes: int, compute: float = 1.0, team: dict[str, str] | None = None
) -> dict[str, str]:
    """Two workers of workload w profiled every 10 minutes, each waiting ``before`` seconds a step on collectives no
    compute hides up to minute ``at``, ``after`` from then on, in a step of :data:`PROFILED_STEP` seconds."""
    result = {}
    for index in range(2):
        where = {**place(index), **(team or {})}
        waits = (before, after)
        parts = {
            "compute": f"{compute:g}x{minutes}",
            "exposed_collective": " ".join(f"{v:g}x{n}" for v, n in zip(waits, (at, minutes - at - 1), strict=True)),
            "idle": " ".join(
                f"{PROFILED_STEP - compute - v:g}x{n}" for v, n in zip(waits, (at, minutes - at - 1), strict=True)
            ),
        }
        result |= {s(c.PROFILE_TIME, part=part, **where): values for part, values in parts.items()}
        result[s(c.PROFILE_STEP, **where)] = f"{PROFILED_STEP:g}x{minutes}"
        result[s(c.PROFILE_LAST_CAPTURE, **where)] = " ".join(f"{minute // 10 * 600}" for minute in range(minutes + 1))
        result[s(c.WORKLOAD_PROCESSES, **where)] = f"1x{minutes}"
    return result


def megascale(at: int, minutes: int, running: bool = True, team: dict[str, str] | None = None) -> dict[str, str]:
    """A multislice job's host whose runtime times 100 collectives a minute, every one within 10 ms up to minute
    ``at`` (a p99 of 9.9 ms), then every one between 10 and 100 ms (99.1 ms): ten times slower."""
    bucket = {"operation": "collective_end_to_end", "buffer_size": "8MB+", **(team or {})}
    result = {
        s(c.MEGASCALE_LATENCY, "bucket", le="0.01", **bucket): f"0+100x{at} {100 * at}x{minutes - at - 1}",
        s(c.MEGASCALE_LATENCY, "bucket", le="0.1", **bucket): f"0+100x{minutes}",
        s(c.MEGASCALE_LATENCY, "bucket", le="+Inf", **bucket): f"0+100x{minutes}",
    }
    if running:
        result[s(c.WORKLOAD_PROCESSES, **W, **(team or {}))] = f"1x{minutes}"
    return result


def goodput(productive: int, io_wait: int, minutes: int, category: str = "io_wait") -> dict[str, str]:
    """A workload up for ``minutes``: a minute of wall time each minute, ``io_wait`` seconds of it badput in
    ``category``, ``productive`` seconds booked productive."""
    return {
        s(c.STEPS, **W): f"0+1x{minutes}",
        s(c.GOODPUT_WALL, **W): f"0+60x{minutes}",
        s(c.GOODPUT, category="productive", **W): f"0+{productive}x{minutes}",
        s(c.GOODPUT, category=category, **W): f"0+{io_wait}x{minutes}",
    }


def saving_every_30_minutes(until: int, then: int) -> dict[str, str]:
    """A workload at 95 % goodput whose productive time is booked at a save every 30 minutes (the rest io_wait),
    which finishes cleanly at minute ``until``: the booking of its last steps at its stop never scraped (the
    sidecar of a pod gone at once); looked at until ``then``."""
    productive, total = [], 0.0
    for minute in range(then + 1):
        if minute < until and minute % 30 == 0:
            total = 57.0 * minute
        productive.append(f"{total:g}")
    flat = then - until
    return {
        s(c.STEPS, **W): f"0+60x{until} {60 * until}x{flat}",
        s(c.GOODPUT_WALL, **W): f"0+60x{until} {60 * until}x{flat}",
        s(c.GOODPUT, category="productive", **W): " ".join(productive),
        s(c.GOODPUT, category="io_wait", **W): f"0+3x{until} {3 * until}x{flat}",
    }


def latency(slow_percent: int, minutes: int, good_before: int = 0, per_minute: int = 100) -> dict[str, str]:
    """A serving workload answering ``per_minute`` requests a minute, ``slow_percent`` of them slow after its
    first ``good_before`` minutes."""
    fast = per_minute * (100 - slow_percent) // 100
    within = f"0+{per_minute}x{good_before} {per_minute * good_before}+{fast}x{minutes - good_before}"
    return {
        s(c.INFERENCE_REQUEST_DURATION, "bucket", le="0.5", **W): within if good_before else f"0+{fast}x{minutes}",
        s(c.INFERENCE_REQUEST_DURATION, "count", **W): f"0+{per_minute}x{minutes}",
    }


def stalling(steps: str, progress: str = "", processes: str = "1x60") -> dict[str, str]:
    """A workload's last step and last progress (a step, a checkpoint or a compile stage ending: as its steps
    unless given), its process connected unless ``processes`` is empty (the job finished)."""
    series = {s(c.LAST_STEP, **W): steps, s(c.LAST_PROGRESS, **W): progress or steps}
    return {**series, s(c.WORKLOAD_PROCESSES, **W): processes} if processes else series


STALLED = (
    "Workload w has completed no step for 16m 0s, nor any checkpoint or compile stage (counted from the last of "
    "them, or from its start), while its processes are still connected."
)
PROGRAM = "9c1f5e2a7b3d4c60"  # a fingerprint, as the sidecar cuts it


def cores_at(*locations: str, asked: int = 10, minutes: int = 20) -> dict[str, str]:
    """A workload of one worker per location, its process connected on each host, each host's sidecar serving its
    TPU core at that HLO location of one program from minute ``asked`` (when the stall made it ask the runtime)."""
    series = {}
    for worker, location in enumerate(locations):
        host = {"instance": f"h{worker}:9478", "worker": str(worker)}
        core = {**host, "device": "0", "core": "tc0"}
        series[s(c.CORE_STATE, **core, fingerprint=PROGRAM, hlo_location=location)] = f"_x{asked} 1x{minutes - asked}"
        # Five minutes at the location, then the age holds: the description reads it through a recording rule of
        # another group, which promtool may evaluate before or after the alerts at the same instant.
        series[s(c.CORE_LOCATION_AGE, **core)] = f"_x{asked} 0+60x5 300x{minutes - asked - 5}"
        series[s(c.WORKLOAD_PROCESSES, **host, **W)] = f"1x{minutes}"
    return series


# Worker 2's core sits at a fusion while its three peers' wait at the all-reduce it never joined.
ODD_ONE_OUT = ("all-reduce.42", "all-reduce.42", "fusion.7", "all-reduce.42")
STALLED_ODD = (
    f"{STALLED} Worker 2 (slice 0, h2:9478) has had its TPU cores at HLO fusion.7 of program {PROGRAM} for 5m 0s, "
    "where most of its peers' are not: the others likely wait for it."
)


def runtime_errors(hang_on: int, workers: int = 4, minutes: int = 20) -> dict[str, str]:
    """Each worker's TPU runtime serving its error detectors, worker ``hang_on``'s reporting a megascale hang
    from minute 8 (before tpuscope's own stall threshold), none a slice error."""
    series = {}
    for worker in range(workers):
        host = {"instance": f"h{worker}:9478", "worker": str(worker)}
        hang = "0x8 1x12" if worker == hang_on else f"0x{minutes}"
        series[s(c.TPU_RUNTIME_ERROR, reason="megascale_hang", **host)] = hang
        series[s(c.TPU_RUNTIME_ERROR, reason="slice_error", **host)] = f"0x{minutes}"
        series[s(c.WORKLOAD_PROCESSES, **host, **W)] = f"1x{minutes}"
    return series


STALLED_HANG = f"{STALLED} The TPU runtime of worker 1 (slice 0, h1:9478) reports megascale_hang."
# Issue 54: where each worker's process is stuck, as its sidecar serves it once past its limit and its stacks logged.
READING = "read_forever (smoke/job.py:6) < <module> (smoke/job.py:11)"  # a reader blocked on its input
WAITING = "all_reduce (smoke/job.py:20) < train_step (smoke/job.py:31)"  # a peer waiting at the collective


@dataclass(frozen=True)
class Stuck:
    """A worker's process where it hangs: since minute ``arrived`` at ``phase`` of ``step`` (its frames there), judged
    stuck from minute ``stuck`` (0: never, though it has been there as long)."""

    phase: str = "sync"
    frames: str = WAITING
    step: str = "41"
    arrived: int = 3
    stuck: int = 5


def stuck_at(*workers: Stuck, minutes: int = 10) -> dict[str, str]:
    """A workload of one worker per ``workers``, each alone on its host, its sidecar serving how long its process has
    been at its place, whether it is stuck, and from then, where."""
    series = {}
    for worker, at in enumerate(workers):
        host = {"instance": f"h{worker}:9478", "worker": str(worker), **W}
        series[s(c.POSITION_AGE, phase=at.phase, **host)] = f"_x{at.arrived} 0+60x{minutes - at.arrived}"
        if not at.stuck:
            series[s(c.STUCK, **host)] = f"0x{minutes}"
            continue
        series[s(c.STUCK, **host)] = f"0x{at.stuck} 1x{minutes - at.stuck}"
        position = {"step": at.step, "phase": at.phase, "frames": at.frames}
        series[s(c.STUCK_POSITION, **position, **host)] = f"_x{at.stuck} 1x{minutes - at.stuck}"
    return series


# Worker 1's reader blocks at minute 2; its peers reach the step's collective and wait there from minute 3. At minute
# 8, the last of them has not moved for 5 minutes.
INPUT_HANG = (Stuck(), Stuck("io", READING, arrived=2, stuck=4), Stuck(), Stuck())
HUNG = (
    "Workload w hangs: every worker has stayed where it is past its limit, none has moved for 5m 0s, and their "
    "sidecars have logged their Python stacks."
)
HUNG_ELSEWHERE = (
    f"{HUNG} Worker 1 (slice 0, h1:9478) is elsewhere than its peers: step 41, io, at {READING}: the others likely "
    "wait for it."
)
REGRESSION_STEPS = s(c.STEP_DURATION, "count", **W)
REGRESSION_SUM = s(c.STEP_DURATION, "sum", **W)
DEVICE = {"device": "0", "accelerator": "v5e", "source": "libtpu"}
GPU = {"device": "0", "accelerator": "h100", "source": "nvml"}
RUNBOOKS = "https://tpuscope.example/docs/alerts"  # GeneratorConfig's runbook_url


def throttled(clock: float, **reasons: int) -> dict[str, str]:
    """GPU 0 of the host at ``clock`` Hz of its 2 GHz maximum (SM), and the driver's throttle reasons (0 unless
    given)."""
    flags = {"power_cap": 0, "power_brake": 0, "thermal": 0, "hardware": 0, **reasons}
    return {
        s(c.CLOCK, clock="sm", **GPU): f"{clock:g}x20",
        s(c.CLOCK_MAX, clock="sm", **GPU): "2e9x20",
        s(c.CLOCK, clock="memory", **GPU): "1.5e9x20",
        s(c.CLOCK_MAX, clock="memory", **GPU): "2.6e9x20",
        **{s(c.THROTTLED, reason=reason, **GPU): f"{flag}x20" for reason, flag in flags.items()},
    }


RUNNING = {s(c.WORKLOAD_PROCESSES, **W): "1x100"}
CRASH_LOOPING = "Workload w failed 3 times in the last hour, preemptions and host maintenance not counted."
JOBSET = {"job": "tpuscope", "namespace": "ml", "jobset": "llm"}

CASES = [
    # No progress since its start: past 600 s from minute 11, and the for: of 5m more.
    Case(AlertName.WORKLOAD_STALLED, "critical", "16m", stalling("0x20"), W, STALLED),
    Case(AlertName.WORKLOAD_STALLED, None, "15m", stalling("0x20")),  # still pending
    # Issue 39: its sidecars asked the TPU runtime at minute 10, and the worker whose cores sit elsewhere is named.
    Case(AlertName.WORKLOAD_STALLED, "critical", "16m", {**stalling("0x20"), **cores_at(*ODD_ONE_OUT)}, W, STALLED_ODD),
    # Two against two names nobody; so do cores that are all at one place.
    Case(
        AlertName.WORKLOAD_STALLED,
        "critical",
        "16m",
        {**stalling("0x20"), **cores_at("all-reduce.42", "fusion.7", "fusion.7", "all-reduce.42")},
        W,
        STALLED,
    ),
    Case(AlertName.WORKLOAD_STALLED, "critical", "16m", {**stalling("0x20"), **cores_at("all-reduce.42")}, W, STALLED),
    # Issue 51: the runtime's own hang detector (what GKE turns into MegascaleHangDetected) names its worker.
    Case(AlertName.WORKLOAD_STALLED, "critical", "16m", {**stalling("0x20"), **runtime_errors(1)}, W, STALLED_HANG),
    # Issue 54: every worker stuck pages at once (the sidecars waited their limit), naming the one elsewhere.
    Case(AlertName.WORKLOAD_HUNG, "critical", "8m", stuck_at(*INPUT_HANG), W, HUNG_ELSEWHERE),
    # Two against two names nobody, and says where both halves are.
    Case(
        AlertName.WORKLOAD_HUNG,
        "critical",
        "8m",
        stuck_at(Stuck("io", READING), Stuck("io", READING), Stuck(), Stuck()),
        W,
        f"{HUNG} No worker is elsewhere than most of its peers: 2 at step 41, io, at {READING}; 2 at step 41, sync, "
        f"at {WAITING}.",
    ),
    # All at one place names nobody either, and says where they are; before the first step, it says so.
    Case(
        AlertName.WORKLOAD_HUNG,
        "critical",
        "8m",
        stuck_at(*[Stuck()] * 4),
        W,
        f"{HUNG} No worker is elsewhere than most of its peers: 4 at step 41, sync, at {WAITING}.",
    ),
    Case(
        AlertName.WORKLOAD_HUNG,
        "critical",
        "8m",
        stuck_at(*[Stuck("compile", "compile (jax/_src/compiler.py:310)", step="")] * 2),
        W,
        f"{HUNG} No worker is elsewhere than most of its peers: 2 before their first step, compile, at "
        "compile (jax/_src/compiler.py:310).",
    ),
    # One worker not stuck (its step is slow, and its limit longer): no hang, however long the others wait.
    Case(AlertName.WORKLOAD_HUNG, None, "8m", stuck_at(*INPUT_HANG[:3], Stuck(stuck=0))),
    Case(AlertName.WORKLOAD_HUNG, None, "4m", stuck_at(*INPUT_HANG)),  # not yet: only worker 1 is stuck
    # A save from minute 30 that never ends pages as a stall does (from its last step, the save's beginning).
    Case(AlertName.WORKLOAD_STALLED, "critical", "46m", stalling("0+60x30 1800x20"), W, STALLED),
    Case(AlertName.WORKLOAD_STALLED, None, "10m", stalling("0+60x20")),  # stepping
    Case(AlertName.WORKLOAD_STALLED, None, "10m", stalling("0x20", processes="")),  # finished: no process left
    # Issue 21: a synchronous save from minute 30 to 42 paged at 41; 12 minutes fit in the 10 and the for: of 5.
    Case(AlertName.WORKLOAD_STALLED, None, "41m", stalling("0+60x30 1800x11 2520+60x8")),
    # A save from minute 30 to 40, then a 9-minute compile before the next step: each ending is progress.
    Case(
        AlertName.WORKLOAD_STALLED,
        None,
        "48m",
        stalling("0+60x30 1800x17 2940+60x5", progress="0+60x30 1800x8 2400x8 2940+60x5"),
    ),
    Case(
        AlertName.STEP_TIME_REGRESSION,
        "warning",
        "475m",
        {REGRESSION_STEPS: "0+60x480", REGRESSION_SUM: "0+60x420 25320+120x60"},
        W,
        "Workload w takes 2s a step, more than 1.3x its mean of the 6 hours before.",
    ),
    Case(AlertName.STEP_TIME_REGRESSION, None, "475m", {REGRESSION_STEPS: "0+60x480", REGRESSION_SUM: "0+60x480"}),
    Case(
        AlertName.INPUT_BOUND,
        "warning",
        "30m",
        phases(io=50, sync=0),
        {**W, "phase": "io"},
        "Workload w spends 50% of its step time waiting for input.",
    ),
    Case(AlertName.INPUT_BOUND, None, "30m", phases(io=10, sync=0)),
    Case(
        AlertName.SYNC_BOUND,
        "warning",
        "30m",
        phases(io=0, sync=50),
        {**W, "source": "host"},
        "Workload w spends 50% of its step time in collective sync, timed on the host.",
    ),
    Case(AlertName.SYNC_BOUND, None, "30m", phases(io=0, sync=20)),
    # Issue 22: a step jitted whole times no sync on the host; its device profiles show half of it waiting.
    Case(
        AlertName.SYNC_BOUND,
        "warning",
        "30m",
        {**phases(io=0, sync=0), **profiles((1, 1.25), (1, 1.25))},
        {**W, "source": "profile"},
        "Workload w spends 50% of its step time waiting on collectives that no compute hides, in its sampled "
        "device profiles.",
    ),
    Case(AlertName.SYNC_BOUND, None, "30m", phases(io=0, sync=0)),  # no profiles: nothing to say
    # Profiles, where there are, are the measure: the host's sync phase is not read beside them.
    Case(AlertName.SYNC_BOUND, None, "30m", {**phases(io=0, sync=50), **profiles((2, 0.25), (2, 0.25))}),
    # The last capture was taken at the start, and is stale from the 30th minute ...
    Case(
        AlertName.SYNC_BOUND,
        None,
        "60m",
        {**phases(io=0, sync=0, minutes=60), **profiles((1, 1.25), minutes=60, until=0)},
    ),
    # ... when the host-timed phases are the measure again.
    Case(
        AlertName.SYNC_BOUND,
        "warning",
        "60m",
        {**phases(io=0, sync=50, minutes=60), **profiles((2, 0.25), minutes=60, until=0)},
        {**W, "source": "host"},
        "Workload w spends 50% of its step time in collective sync, timed on the host.",
    ),
    # A finished job's profile gauges linger in its sidecars.
    Case(AlertName.SYNC_BOUND, None, "30m", {**phases(io=0, sync=0), **profiles((1, 1.25), running=False)}),
    # Issue 36: a profile that is a mean of one capture's 2 steps is too noisy to judge: the host's timing is the
    # measure until the sidecar averages enough steps. (The latest capture alone fired this.)
    Case(
        AlertName.SYNC_BOUND,
        None,
        "30m",
        {**phases(io=0, sync=0), **profiles((1, 1.25), (1, 1.25), steps=ONE_CAPTURE)},
    ),
    Case(
        AlertName.SYNC_BOUND,
        "warning",
        "30m",
        {**phases(io=0, sync=50), **profiles((2, 0.25), (2, 0.25), steps=ONE_CAPTURE)},
        {**W, "source": "host"},
        "Workload w spends 50% of its step time in collective sync, timed on the host.",
    ),
    # A sidecar too old to say how many steps its gauges hold is judged by them, as before.
    Case(
        AlertName.SYNC_BOUND,
        "warning",
        "30m",
        {**phases(io=0, sync=0), **profiles((1, 1.25), (1, 1.25), steps=None)},
        {**W, "source": "profile"},
        "Workload w spends 50% of its step time waiting on collectives that no compute hides, in its sampled "
        "device profiles.",
    ),
    # Issue 55: worker 2's input takes 0.3 s of each 1.25-second step where its peers' takes 0.05 s; they wait for it
    # at the collective (0.3 s against its 0.05 s), 0.25 s a step each beyond the least: 0.75 worker-seconds a
    # second, 15% of their steps, 3 chips of their 12 idle.
    # Chronic: the straggler for over 60% of the hour.
    Case(
        AlertName.STRAGGLER,
        "warning",
        "70m",
        lockstep({2: 0.25}, minutes=70),
        {**W, **HOST, **place(2), "source": "host"},
        "Worker 2 (h2:9478, slice 0) of workload w has been its straggler for most of the last hour: its peers "
        "waited for it at the collectives 3.00 chip-hours an hour (cause: input), 15% of their steps, timed on "
        "the host.",
    ),
    # The same from its start 30 minutes ago, the rules running for the hour before: not chronic yet.
    Case(AlertName.STRAGGLER, None, "90m", started(60, lockstep({2: 0.25}, minutes=30))),
    # A blip: worker 2's input stalls a whole minute once (at minute 30). Its peers waited for it 3 worker-minutes,
    # the straggler for 5 minutes of rates: never chronic.
    Case(AlertName.STRAGGLER, None, "70m", lockstep({}, minutes=70, blip=(2, 30, 60.0))),
    # Issue 22: one fused step times the same on every host, so the device profiles tell: worker 3's devices compute
    # twice as long as the others' and it arrives last at each collective: it hardly waits, the others wait for it.
    Case(
        AlertName.STRAGGLER,
        "warning",
        "70m",
        {**lockstep({}, minutes=70, sync=0.0), **profiles((1, 1), (1, 1), (1, 1), (2, 0.02), minutes=70)},
        {**W, **HOST, **place(3), "source": "profile"},
        "Worker 3 (h3:9478, slice 0) of workload w has been its straggler for most of the last hour: its peers "
        "waited for it at the collectives 11.76 chip-hours an hour (cause: compute), 73.5% of their steps, in the "
        "sampled device profiles.",
    ),
    Case(AlertName.STRAGGLER, None, "70m", lockstep({}, minutes=70, sync=0.0)),  # unprofiled: no sign of it
    # Issue 36: the same profiles, each a mean of one capture's 2 steps: not judged yet.
    Case(
        AlertName.STRAGGLER,
        None,
        "70m",
        {
            **lockstep({}, minutes=70, sync=0.0),
            **profiles((1, 1), (1, 1), (1, 1), (2, 0.02), minutes=70, steps=ONE_CAPTURE),
        },
    ),
    # More compute, but it waits at collectives as long as its peers: it holds nobody back.
    Case(
        AlertName.STRAGGLER,
        None,
        "70m",
        {**lockstep({}, minutes=70, sync=0.0), **profiles((1, 1), (1, 1), (1, 1), (1.5, 1), minutes=70)},
    ),
    # One slow capture: the sidecar's mean of its last 3 holds it for 3 periods (30 minutes), half the hour.
    Case(
        AlertName.STRAGGLER,
        None,
        "70m",
        {
            **lockstep({}, minutes=70, sync=0.0),
            **profiles((1, 1), (1, 1), (1, 1), (2, 0.02), minutes=70, held=range(20, 50)),
        },
    ),
    Case(
        AlertName.LOW_DUTY_CYCLE,
        "warning",
        "40m",
        {s(c.DUTY_CYCLE, **DEVICE): "0.1x40", s(c.WORKLOAD_PROCESSES, **W): "1x40"},
        W,
        "Workload w: the chips of 1 of its hosts were busy less than 50% of the time: h:9478 (10%).",
    ),
    Case(
        AlertName.LOW_DUTY_CYCLE,
        None,
        "40m",
        {s(c.DUTY_CYCLE, **DEVICE): "0.9x40", s(c.WORKLOAD_PROCESSES, **W): "1x40"},
    ),
    Case(AlertName.LOW_DUTY_CYCLE, None, "40m", {s(c.DUTY_CYCLE, **DEVICE): "0.1x40"}),  # no workload on the host
    Case(
        AlertName.LOW_MFU,
        "warning",
        "40m",
        {s(c.MFU, **W): "0.1x40", **RUNNING},
        W,
        "Workload w reaches 10% model FLOPs utilization.",
    ),
    Case(AlertName.LOW_MFU, None, "40m", {s(c.MFU, **W): "0.5x40", **RUNNING}),
    Case(AlertName.LOW_MFU, None, "40m", {s(c.MFU, **W): "0.1x40"}),  # finished: the gauge lingers in the sidecar
    Case(
        AlertName.COMPILE_TIME_HIGH,
        "warning",
        "70m",
        {s(c.COMPILE_DURATION, "sum", stage="backend", **W): "0+20x70"},
        W,
        "Workload w compiled for 20m 0s in the last hour.",
    ),
    Case(AlertName.COMPILE_TIME_HIGH, None, "70m", {s(c.COMPILE_DURATION, "sum", stage="backend", **W): "0+1x70"}),
    # 20 minutes of compiles long ago, and Prometheus down an hour back: old news, not a new series.
    Case(
        AlertName.COMPILE_TIME_HIGH,
        None,
        "100m",
        {s(c.COMPILE_DURATION, "sum", stage="backend", **W): values(1200, 100, gap=GAP), **sidecar(100, gap=GAP)},
    ),
    Case(
        AlertName.RECOMPILING,
        "warning",
        "90m",
        {
            s(c.COMPILE_DURATION, "count", stage="backend", **W): "0x60 1+1x30",
            s(c.STEPS, **W): "0+100x90",
            **sidecar(90),
        },
        W,
        "Workload w compiled 30 programs in 30 minutes, an hour after it began stepping.",
    ),
    Case(
        AlertName.RECOMPILING,
        None,
        "90m",  # compiles while it warms up: it only began stepping at 60m
        {
            s(c.COMPILE_DURATION, "count", stage="backend", **W): "0x60 1+1x30",
            s(c.STEPS, **W): "_x60 0+100x30",
            **sidecar(90),
        },
    ),
    # Restarted at 70m in a new pod: its new sidecar's compiles are the warm-up, though the workload (in the
    # old pod) was stepping an hour ago.
    Case(
        AlertName.RECOMPILING,
        None,
        "90m",
        {
            s(c.STEPS, **W): "0+100x70",
            s(c.COMPILE_DURATION, "count", stage="backend", **W): "1x70",
            **sidecar(70),
            s(c.STEPS, instance="new:9478", **W): "_x70 0+100x20",
            s(c.COMPILE_DURATION, "count", stage="backend", instance="new:9478", **W): "_x70 1+1x20",
            s(c.WORKLOAD_RESTARTS, reason="resumed", instance="new:9478", **W): "_x70 1x20",
            **sidecar(90, started=70, instance="new:9478"),
        },
    ),
    # Restarted at 70m under the same sidecar (a process restarted in place): its compiles are the warm-up.
    Case(
        AlertName.RECOMPILING,
        None,
        "90m",
        {
            s(c.STEPS, **W): "0+100x90",
            s(c.COMPILE_DURATION, "count", stage="backend", **W): "1x70 2+1x20",
            s(c.WORKLOAD_RESTARTS, reason="resumed", **W): "_x70 1x20",
            **sidecar(90),
        },
    ),
    Case(  # Prometheus down half an hour back: 5 compiles long ago are not new
        AlertName.RECOMPILING,
        None,
        "100m",
        {
            s(c.STEPS, **W): "0+100x100",
            s(c.COMPILE_DURATION, "count", stage="backend", **W): values(5, 100, gap=range(65, 74)),
            **sidecar(100, gap=range(65, 74)),
        },
    ),
    Case(
        AlertName.COMPILE_CACHE_HIT_RATIO_LOW,
        "warning",
        "70m",
        {
            s(c.COMPILE_CACHE_REQUESTS, result="hit", **W): "0+1x70",
            s(c.COMPILE_CACHE_REQUESTS, result="miss", **W): "0+9x70",
        },
        W,
        "Workload w hit the compilation cache for 10% of its look-ups in the last hour.",
    ),
    Case(  # every look-up a miss: no hit series exists at all
        AlertName.COMPILE_CACHE_HIT_RATIO_LOW,
        "warning",
        "70m",
        {s(c.COMPILE_CACHE_REQUESTS, result="miss", **W): "0+9x70"},
        W,
        "Workload w hit the compilation cache for 0% of its look-ups in the last hour.",
    ),
    Case(
        AlertName.COMPILE_CACHE_HIT_RATIO_LOW,
        None,
        "70m",
        {
            s(c.COMPILE_CACHE_REQUESTS, result="hit", **W): "0+9x70",
            s(c.COMPILE_CACHE_REQUESTS, result="miss", **W): "0+1x70",
        },
    ),
    Case(
        AlertName.MEMORY_SPILL,
        "warning",
        "20m",
        {s(c.MEMORY_SPILL, program="train_step", **W): "1048576x20", **RUNNING},
        {**W, "program": "train_step"},
        "Program train_step of workload w places 1MiB in host memory.",
    ),
    Case(AlertName.MEMORY_SPILL, None, "20m", {s(c.MEMORY_SPILL, program="train_step", **W): "0x20", **RUNNING}),
    Case(
        AlertName.DEVICE_MEMORY_NEAR_LIMIT,
        "warning",
        "20m",
        {
            s(c.DEVICE_MEMORY_USED, **DEVICE): "15e9x20",
            s(c.DEVICE_MEMORY_LIMIT, **DEVICE): "16e9x20",
            s(c.WORKLOAD_PROCESSES, **W): "1x20",
        },
        W,
        "Workload w: 1 of its hosts have a device using more than 90% of its memory (the fullest device of each): "
        "h:9478 (93.75%).",
    ),
    Case(
        AlertName.DEVICE_MEMORY_NEAR_LIMIT,
        None,
        "20m",
        {
            s(c.DEVICE_MEMORY_USED, **DEVICE): "8e9x20",
            s(c.DEVICE_MEMORY_LIMIT, **DEVICE): "16e9x20",
            s(c.WORKLOAD_PROCESSES, **W): "1x20",
        },
    ),
    Case(
        AlertName.CHECKPOINT_FAILING,
        "warning",
        "20m",
        {s(c.CHECKPOINT_DURATION, "count", operation="save", result="error", **W): "_x10 1x10", **sidecar(20)},
        W,
        "Workload w failed 1 checkpoint saves in the last 30 minutes.",
    ),
    Case(  # one failed save long ago, Prometheus down half an hour back
        AlertName.CHECKPOINT_FAILING,
        None,
        "100m",
        {
            s(c.CHECKPOINT_DURATION, "count", operation="save", result="error", **W): values(1, 100, gap=range(65, 74)),
            **sidecar(100, gap=range(65, 74)),
        },
    ),
    Case(
        AlertName.CHECKPOINT_FAILING,
        None,
        "20m",
        {s(c.CHECKPOINT_DURATION, "count", operation="save", result="ok", **W): "_x10 1x10"},
    ),
    Case(
        AlertName.CHECKPOINT_STALE,
        "critical",
        "75m",
        {s(c.CHECKPOINT_LAST_SUCCESS, **W): "0x75", s(c.WORKLOAD_PROCESSES, **W): "1x75"},
        W,
        "Workload w last saved a checkpoint 1h 15m 0s ago: that much work is lost if it fails now.",
    ),
    # Issue 53: older than the threshold, but not for 10 minutes yet (a job that saves every hour, late).
    Case(
        AlertName.CHECKPOINT_STALE,
        None,
        "68m",
        {s(c.CHECKPOINT_LAST_SUCCESS, **W): "0x68", s(c.WORKLOAD_PROCESSES, **W): "1x68"},
    ),
    Case(AlertName.CHECKPOINT_STALE, None, "70m", {s(c.CHECKPOINT_LAST_SUCCESS, **W): "0x70"}),  # finished
    Case(
        AlertName.CHECKPOINT_STALE, None, "70m", {s(c.CHECKPOINT_LAST_SUCCESS, **W): "0+600x7", **RUNNING}
    ),  # saved 10m ago
    Case(
        AlertName.CHECKPOINT_MISSING,
        "warning",
        "70m",
        {s(c.STEPS, **W): "0+10x70", **RUNNING},
        W,
        "Workload w has been stepping for 1 h without a good checkpoint: a failure loses all of it.",
    ),
    Case(
        AlertName.CHECKPOINT_MISSING,
        None,
        "70m",
        {s(c.STEPS, **W): "0+10x70", s(c.CHECKPOINT_LAST_SUCCESS, **W): "0x70", **RUNNING},
    ),
    Case(
        AlertName.CHECKPOINT_TIME_HIGH,
        "warning",
        "100m",
        {s(c.GOODPUT, category="checkpoint", **W): "0+6x100", s(c.GOODPUT_WALL, **W): "0+60x100"},
        W,
        "Workload w spends 10% of its wall time checkpointing.",
    ),
    Case(
        AlertName.CHECKPOINT_TIME_HIGH,
        None,
        "100m",
        {s(c.GOODPUT, category="checkpoint", **W): "0+1x100", s(c.GOODPUT_WALL, **W): "0+60x100"},
    ),
    # The fast pair can fire: a 10 % budget burns at 10x at most, so the workbook's 14.4x over 1 h could not
    # (it was clamped to 99 % bad); stretched to 7.2x over 2 h and 10 m it spends the same 2 % of the month's
    # budget, and pages on 80 % bad for two hours (the old rules, quiet: the 6 h pair needs 6 h of life).
    Case(
        AlertName.GOODPUT_BUDGET_BURN,
        "critical",
        "150m",
        goodput(productive=12, io_wait=48, minutes=150),
        W,
        "Workload w is burning its goodput error budget fast: 80% was bad over the last 2h or 6h, against a "
        "budget of 10.00%.",
    ),
    # Down, not booked as anything before: the downtime it books as it grows burns the budget.
    Case(
        AlertName.GOODPUT_BUDGET_BURN,
        "critical",
        "150m",
        goodput(productive=0, io_wait=60, minutes=150, category="downtime"),
        W,
        "Workload w is burning its goodput error budget fast: 100% was bad over the last 2h or 6h, against a "
        "budget of 10.00%.",
    ),
    # Young: its start-up is not judged over a window it did not live.
    Case(AlertName.GOODPUT_BUDGET_BURN, None, "40m", goodput(productive=0, io_wait=60, minutes=40)),
    # A clean finish after saving every 30 minutes: productive time is booked in lumps, but the SLO counts only
    # the badput booked as it happens (here 5 %) against the wall time, so no window reads all of it bad. (The
    # old ratio, 1 - productive / booked, paged 35 minutes after such a finish: no save in its hour.)
    Case(AlertName.GOODPUT_BUDGET_BURN, None, "335m", saving_every_30_minutes(until=300, then=335)),
    Case(AlertName.GOODPUT_BUDGET_BURN, None, "290m", saving_every_30_minutes(until=300, then=300)),
    Case(
        AlertName.GOODPUT_BUDGET_BURN,
        "warning",
        "1470m",
        goodput(productive=36, io_wait=24, minutes=1470),
        W,
        "Workload w is burning its goodput error budget steadily: 40% was bad over the last 1d or 3d, against a "
        "budget of 10.00%.",
    ),
    Case(AlertName.GOODPUT_BUDGET_BURN, None, "1470m", goodput(productive=57, io_wait=3, minutes=1470)),
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "40m",
        {s(c.WORKLOAD_DOWN_SINCE, **W): "_x10 600x30"},
        W,
        "Workload w has been down for 30m 0s: a process failed or vanished, or its pod went with its sidecar, and "
        "none has started since.",
    ),
    # Preempted, pod and sidecar gone at minute 10 (the last step then), nothing since: Prometheus alone says
    # it is down, from the worker's last step.
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "40m",
        {
            s(c.GOODPUT_WALL, **W): "0+60x10",
            s(c.LAST_STEP, **W): "0+60x10",
            **sidecar(10),
        },
        W,
        "Workload w has been down for 30m 0s: a process failed or vanished, or its pod went with its sidecar, and "
        "none has started since.",
    ),
    # The same pod gone after a clean end (its end time after its last step): finished, not down.
    Case(
        AlertName.WORKLOAD_DOWN,
        None,
        "40m",
        {
            s(c.GOODPUT_WALL, **W): "0+60x10",
            s(c.LAST_STEP, **W): "0+60x10",
            s(c.WORKLOAD_END_TIME, **W): "_x9 601x1",
            **sidecar(10),
        },
    ),
    # Down for 10 minutes, or back after 20 (the sidecar drops the series at the next start): quiet.
    Case(AlertName.WORKLOAD_DOWN, None, "20m", {s(c.WORKLOAD_DOWN_SINCE, **W): "_x10 600x10"}),
    Case(AlertName.WORKLOAD_DOWN, None, "40m", {s(c.WORKLOAD_DOWN_SINCE, **W): "_x10 600x20 _x10"}),
    Case(
        AlertName.WORKLOAD_FAILED,
        "warning",
        "10m",
        {s(c.WORKLOAD_FAILURES, reason="out_of_memory", **W): "_x5 1x5", **sidecar(10)},
        {**W, "reason": "out_of_memory"},
        f"Workload w failed in the last hour, reason out_of_memory (failures: 1). What to do: {RUNBOOKS}"
        "#failure-reason-out_of_memory",
    ),
    # One alert per reason: a preemption long ago, a process killed without a word (the OOM killer) now.
    Case(
        AlertName.WORKLOAD_FAILED,
        "warning",
        "90m",
        {
            s(c.WORKLOAD_FAILURES, reason="preemption", **W): "1x90",
            s(c.WORKLOAD_FAILURES, reason="vanished", **W): "_x85 1x5",
            **sidecar(90),
        },
        {**W, "reason": "vanished"},
        f"Workload w failed in the last hour, reason vanished (failures: 1). What to do: {RUNBOOKS}"
        "#failure-reason-vanished",
    ),
    Case(
        AlertName.WORKLOAD_FAILED, None, "90m", {s(c.WORKLOAD_FAILURES, reason="other", **W): "1x90", **sidecar(90)}
    ),  # 90 min ago
    Case(  # preempted and put back by the platform just now: no ticket (WorkloadDown pages if it stays down)
        AlertName.WORKLOAD_FAILED,
        None,
        "10m",
        {
            s(c.WORKLOAD_FAILURES, reason="preemption", **W): "_x5 1x5",
            s(c.WORKLOAD_FAILURES, reason="maintenance", **W): "_x5 1x5",
            **sidecar(10),
        },
    ),
    # Failed long ago; Prometheus was down an hour back: the series was there all along, not new.
    Case(
        AlertName.WORKLOAD_FAILED,
        None,
        "100m",
        {s(c.WORKLOAD_FAILURES, reason="other", **W): values(1, 100, gap=GAP), **sidecar(100, gap=GAP)},
    ),
    Case(  # ... but a failure after the gap counts
        AlertName.WORKLOAD_FAILED,
        "warning",
        "100m",
        {
            s(c.WORKLOAD_FAILURES, reason="other", **W): " ".join(values(1, 100, gap=GAP).split()[:81] + ["2"] * 20),
            **sidecar(100, gap=GAP),
        },
        {**W, "reason": "other"},
        f"Workload w failed in the last hour, reason other (failures: 1). What to do: {RUNBOOKS}#failure-reason-other",
    ),
    Case(
        AlertName.WORKLOAD_CRASH_LOOPING,
        "critical",
        "10m",
        {s(c.WORKLOAD_FAILURES, reason="other", **W): "_x5 1 2 3x5", **sidecar(10)},
        W,
        CRASH_LOOPING,
    ),
    # A 2-host JobSet with restartPolicy Never failed 3 times in 40 minutes: 3 generations of new pods, each
    # sidecar's counter born at 1.
    Case(
        AlertName.WORKLOAD_CRASH_LOOPING,
        "critical",
        "40m",
        generations(c.WORKLOAD_FAILURES, workers=2, every=10, until=40, reason="other", **W),
        W,
        CRASH_LOOPING,
    ),
    Case(
        AlertName.WORKLOAD_CRASH_LOOPING,
        None,
        "10m",
        {s(c.WORKLOAD_FAILURES, reason="other", **W): "_x5 1 2x5", **sidecar(10)},
    ),
    Case(
        AlertName.WORKLOAD_CRASH_LOOPING,
        None,
        "10m",
        {s(c.WORKLOAD_FAILURES, reason="preemption", **W): "_x5 1 2 3x5", **sidecar(10)},
    ),
    # One failure of a three-host job, seen by each host's sidecar: one failure, not three.
    Case(
        AlertName.WORKLOAD_CRASH_LOOPING,
        None,
        "10m",
        {
            k: v
            for i in range(3)
            for k, v in {
                s(c.WORKLOAD_FAILURES, reason="other", instance=f"h{i}:9478", worker=str(i), **W): "_x5 1x5",
                **sidecar(10, instance=f"h{i}:9478", worker=str(i)),
            }.items()
        },
    ),
    # Crash-looped days ago; Prometheus was down for 9 minutes an hour back: no new restart.
    Case(
        AlertName.WORKLOAD_CRASH_LOOPING,
        None,
        "100m",
        {s(c.WORKLOAD_FAILURES, reason="other", **W): values(3, 100, gap=GAP), **sidecar(100, gap=GAP)},
    ),
    Case(
        AlertName.COLLECTOR_DOWN,
        "warning",
        "10m",
        {s(c.COLLECTOR_UP, collector="libtpu"): "0x10", s(c.WORKLOAD_PROCESSES, **W): "1x10"},
        {**HOST, **PLACE, "collector": "libtpu"},
        "Collector libtpu of h:9478 has failed for 5 minutes.",
    ),
    Case(
        AlertName.COLLECTOR_DOWN,
        "warning",
        "10m",
        {s(c.COLLECTOR_UP, collector="host"): "0x10"},  # the host's own collector needs no job
        {**HOST, **PLACE, "collector": "host"},
        "Collector host of h:9478 has failed for 5 minutes.",
    ),
    Case(AlertName.COLLECTOR_DOWN, None, "10m", {s(c.COLLECTOR_UP, collector="libtpu"): "1x10", **RUNNING}),
    # No job on the host: the TPU runtime whose metrics libtpu reads lives in the job. Never had one ...
    Case(AlertName.COLLECTOR_DOWN, None, "10m", {s(c.COLLECTOR_UP, collector="libtpu"): "0x10"}),
    # ... or its job has finished.
    Case(
        AlertName.COLLECTOR_DOWN,
        None,
        "10m",
        {s(c.COLLECTOR_UP, collector="libtpu"): "0x10", s(c.WORKLOAD_PROCESSES, **W): "0x10"},
    ),
    # A 4-host JobSet lost its node pool: one ticket for the job, not four pages.
    Case(
        AlertName.EXPORTER_DOWN,
        "warning",
        "10m",
        {s("up", **JOBSET, instance=f"h{i}:9478", pod=f"llm-{i}"): "0x10" for i in range(4)},
        {"job": "tpuscope", "namespace": "ml", "jobset": "llm"},
        "100% of the tpuscope sidecars of JobSet llm in namespace ml have not been scraped for 5 minutes: the "
        "workloads on those hosts are unmonitored.",
    ),
    Case(  # 1 host of 20: within the share
        AlertName.EXPORTER_DOWN,
        None,
        "10m",
        {s("up", **JOBSET, instance=f"h{i}:9478", pod=f"llm-{i}"): "0x10" if i == 0 else "1x10" for i in range(20)},
    ),
    Case(AlertName.EXPORTER_DOWN, None, "10m", {s("up", **HOST): "1x10"}),
    Case(
        AlertName.EXPORTER_ABSENT,
        "warning",
        "20m",
        {
            s("kube_pod_init_container_status_running", namespace="ml", pod="llm-0", container="tpuscope"): "1x20",
            s("up", job="node", instance="n:9100"): "1x20",
        },
        {"namespace": "ml"},
        "1 pods of namespace ml run a tpuscope sidecar that no target of a job matching tpuscope.* scrapes: the "
        "scrape configuration or the PodMonitor lost them.",
    ),
    # An idle cluster: no job, so no sidecar to scrape.
    Case(AlertName.EXPORTER_ABSENT, None, "20m", {s("up", job="node", instance="n:9100"): "1x20"}),
    Case(
        AlertName.EXPORTER_ABSENT,
        None,
        "20m",
        {
            s("kube_pod_init_container_status_running", namespace="ml", pod="llm-0", container="tpuscope"): "1x20",
            s("up", **JOBSET, instance="h0:9478", pod="llm-0"): "1x20",
        },
    ),
    Case(
        AlertName.INGEST_LOSING_EVENTS,
        "warning",
        "20m",
        {s(c.INGEST_EVENTS, result="accepted"): "0+100x20", s(c.INGEST_EVENTS, result="dropped"): "0+10x20"},
        HOST,
        "The sidecar h:9478 lost 9.091% of its events (dropped or invalid): the step metrics undercount.",
    ),
    Case(
        AlertName.INGEST_LOSING_EVENTS,
        None,
        "20m",
        {s(c.INGEST_EVENTS, result="accepted"): "0+1000x20", s(c.INGEST_EVENTS, result="dropped"): "0+1x20"},
    ),
    Case(
        AlertName.HOST_CPU_SATURATED,
        "warning",
        "20m",
        {
            s(c.HOST_CPU_UTILIZATION, cpu="0"): "0.95x20",
            s(c.HOST_CPU_UTILIZATION, cpu="1"): "0.97x20",
            s(c.WORKLOAD_PROCESSES, **W): "1x20",
        },
        W,
        "Workload w: 1 of its hosts have their CPU more than 90% busy, too busy to feed their chips: h:9478 (96%).",
    ),
    Case(
        AlertName.HOST_CPU_SATURATED,
        None,
        "20m",
        {s(c.HOST_CPU_UTILIZATION, cpu="0"): "0.5x20", s(c.WORKLOAD_PROCESSES, **W): "1x20"},
    ),
    Case(
        AlertName.INFERENCE_LATENCY_BUDGET_BURN,
        "critical",
        "130m",  # older than the hour the fast pair looks at, its last 70 minutes half slow
        latency(slow_percent=50, minutes=130, good_before=60),
        W,
        "Workload w is burning its latency error budget fast: 50% was bad over the last 1h or 6h, against a "
        "budget of 1.00%.",
    ),
    # A new workload's slow first 10 minutes: every window is its whole life; an hour has not passed.
    Case(AlertName.INFERENCE_LATENCY_BUDGET_BURN, None, "10m", latency(slow_percent=50, minutes=10)),
    # Nearly idle: 30 slow requests of 60 in an hour are no outage.
    Case(
        AlertName.INFERENCE_LATENCY_BUDGET_BURN,
        None,
        "90m",
        latency(slow_percent=100, minutes=90, good_before=60, per_minute=1),
    ),
    Case(
        AlertName.INFERENCE_LATENCY_BUDGET_BURN,
        "warning",
        "1470m",
        latency(slow_percent=5, minutes=1470),
        W,
        "Workload w is burning its latency error budget steadily: 5% was bad over the last 1d or 3d, against a "
        "budget of 1.00%.",
    ),
    Case(AlertName.INFERENCE_LATENCY_BUDGET_BURN, None, "1470m", latency(slow_percent=0, minutes=1470)),
    # Issue 25: a compile that ran out of memory on both hosts of a job: one failure, not two.
    Case(
        AlertName.COMPILE_FAILING,
        "warning",
        "10m",
        {
            k: v
            for i in range(2)
            for k, v in {
                s(
                    c.COMPILE_FAILURES,
                    stage="backend",
                    reason="out_of_memory",
                    instance=f"h{i}:9478",
                    worker=str(i),
                    **W,
                ): "_x5 1x5",
                **sidecar(10, instance=f"h{i}:9478", worker=str(i)),
            }.items()
        },
        {**W, "stage": "backend", "reason": "out_of_memory"},
        "Workload w failed to compile 1 times in the last hour, at the backend stage, reason out_of_memory. What to "
        f"do: {RUNBOOKS}#compile-failure-reason-out_of_memory",
    ),
    Case(  # 90 minutes ago
        AlertName.COMPILE_FAILING,
        None,
        "90m",
        {s(c.COMPILE_FAILURES, stage="tracing", reason="invalid_program", **W): "1x90", **sidecar(90)},
    ),
    # A GPU at 75% of its maximum clock, too hot: the driver says so.
    Case(
        AlertName.DEVICE_THROTTLED,
        "warning",
        "15m",
        throttled(1.5e9, thermal=1),
        {**HOST, **PLACE, **GPU, "reason": "thermal"},
        "GPU 0 (h100) of h:9478 runs its SM clock at 75% of its maximum, held down for thermal reasons.",
    ),
    # A power brake the clock does not feel (at its maximum), a busy GPU at its software power cap (as designed),
    # an idle GPU's low clock with no reason: no ticket.
    Case(AlertName.DEVICE_THROTTLED, None, "15m", throttled(2e9, power_brake=1)),
    Case(AlertName.DEVICE_THROTTLED, None, "15m", throttled(1.5e9, power_cap=1)),
    Case(AlertName.DEVICE_THROTTLED, None, "15m", throttled(3e8)),
    # 2 GB of 64 available while a workload runs: page before the OOM killer acts.
    Case(
        AlertName.HOST_MEMORY_PRESSURE,
        "critical",
        "5m",
        {s(c.HOST_MEMORY_AVAILABLE): "2e9x10", s(c.HOST_MEMORY_TOTAL): "64e9x10", s(c.WORKLOAD_PROCESSES, **W): "1x10"},
        {**W, "signal": "available"},
        "A host of workload w has 3.125% of its memory available (the least of its hosts). The kernel's OOM killer "
        "will end the largest process, likely the training job.",
    ),
    # The same host with no workload on it: whatever fills its memory, no job of ours is at risk.
    Case(
        AlertName.HOST_MEMORY_PRESSURE,
        None,
        "5m",
        {s(c.HOST_MEMORY_AVAILABLE): "2e9x10", s(c.HOST_MEMORY_TOTAL): "64e9x10"},
    ),
    # Thrashing: swapping in 2 MiB/s while the job reads 500 pages a second back from disk.
    Case(
        AlertName.HOST_MEMORY_PRESSURE,
        "critical",
        "10m",
        {
            s(c.HOST_MEMORY_AVAILABLE): "20e9x10",
            s(c.HOST_MEMORY_TOTAL): "64e9x10",
            s(c.HOST_SWAP_IO, direction="in"): "0+125829120x10",
            s(c.JOB_MAJOR_PAGE_FAULTS, pid="42", **W): "0+30000x10",
            s(c.WORKLOAD_PROCESSES, **W): "1x10",
        },
        {**W, "signal": "thrashing"},
        "A host of workload w swaps in 2MiB/s (the most of its hosts) while its processes read more than 100 pages a "
        "second back from disk: their memory does not fit. The kernel's OOM killer will end the largest process, "
        "likely the training job.",
    ),
    # Swapping in while the job hardly faults: another process's memory, not the job's.
    Case(
        AlertName.HOST_MEMORY_PRESSURE,
        None,
        "10m",
        {
            s(c.HOST_MEMORY_AVAILABLE): "20e9x10",
            s(c.HOST_MEMORY_TOTAL): "64e9x10",
            s(c.HOST_SWAP_IO, direction="in"): "0+125829120x10",
            s(c.JOB_MAJOR_PAGE_FAULTS, pid="42", **W): "0+60x10",
            s(c.WORKLOAD_PROCESSES, **W): "1x10",
        },
    ),
    # 4 hours of device profiles, each worker waiting 0.3 s a step on collectives, then 0.9 s from minute 241.
    Case(
        AlertName.COLLECTIVE_LATENCY_SPIKE,
        "warning",
        "280m",
        collective_history(0.3, 0.9, at=240, minutes=280),
        {**W, "source": "profile"},
        "Workload w waits on collectives that no compute hides 3.0x as long a step as in the 6 hours before, in "
        "its sampled device profiles (a spike from 2x).",
    ),
    # The same jump 90 minutes into a workload's life: no baseline to judge it by yet.
    Case(AlertName.COLLECTIVE_LATENCY_SPIKE, None, "130m", collective_history(0.3, 0.9, at=90, minutes=130)),
    # Three times nothing: 0.06 s of a 2.5 s step is no collective problem.
    Case(AlertName.COLLECTIVE_LATENCY_SPIKE, None, "280m", collective_history(0.02, 0.06, at=240, minutes=280)),
    # A multislice job without profiles: its runtime's collective p99 ten times its own, from minute 241.
    Case(
        AlertName.COLLECTIVE_LATENCY_SPIKE,
        "warning",
        "280m",
        megascale(at=240, minutes=280),
        {**W, "source": "megascale"},
        "Workload w sees its multislice collectives (collective_end_to_end p99) take 10.0x as long as in the 6 hours "
        "before, on its slowest host (a spike from 2x).",
    ),
    # The same with device profiles whose collective wait did not change: what the step waits for is the measure.
    Case(
        AlertName.COLLECTIVE_LATENCY_SPIKE,
        None,
        "280m",
        {**megascale(at=240, minutes=280), **collective_history(0.3, 0.3, at=240, minutes=280)},
    ),
    # A model loaded 7 days and 2 hours ago, still served.
    Case(
        AlertName.MODEL_STALE,
        "warning",
        "70m",
        {s(c.MODEL_LOADED, version="v3", **W): "-607800x70", **RUNNING},
        {**W, "version": "v3"},
        "Workload w serves model version v3, loaded 7d 2h 0m 0s ago (stale from 7 days).",
    ),
    Case(AlertName.MODEL_STALE, None, "70m", {s(c.MODEL_LOADED, version="v4", **W): "-86400x70", **RUNNING}),
    Case(AlertName.MODEL_STALE, None, "70m", {s(c.MODEL_LOADED, version="v3", **W): "-607800x70"}),  # not served now
]
