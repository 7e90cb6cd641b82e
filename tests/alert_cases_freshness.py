"""promtool cases for how long a device profile counts (issue 35): three of the periods its job exports, or, from a
job too old to export one, 30 minutes.

A job that captures every hour must not have its straggler resolve and re-open each hour: its last capture is still
fresh 50 minutes on. The cases profile once, at minute 0, and look later. tests/alert_cases.py appends them to its
cases.
"""

from __future__ import annotations

from alert_cases import HOST, PROFILED_STEP, Case, W, lockstep, phases, place, profiles, s

from tpuscope import catalog as c
from tpuscope.conventions import AlertName

HOURLY = 3600.0  # seconds: a job's profile_period="1h"
# Worker 3's devices compute twice as long as its peers' and it hardly waits at collectives: the straggler.
STRAGGLING = ((1.0, 1.0), (1.0, 1.0), (1.0, 1.0), (2.0, 0.02))
STRAGGLER_LABELS = {**W, **HOST, **place(3), "source": "profile"}
STRAGGLER_SAYS = (
    "Worker 3 (h3:9478, slice 0) of workload w has been its straggler for most of the last hour: its peers waited for "
    "it at the collectives 11.76 chip-hours an hour (cause: compute), 73.5% of their steps, in the sampled device "
    "profiles."
)
# Half of each step waiting on collectives that no compute hides, on every worker.
WAITING = ((1.0, PROFILED_STEP / 2), (1.0, PROFILED_STEP / 2))


def profiled_once(
    *parts: tuple[float, float], minutes: int, period: float | None, periodless: tuple[int, ...] = ()
) -> dict[str, str]:
    """Device profiles of workload w's workers as :func:`alert_cases.profiles` has them, captured at minute 0 and
    never again, each worker's job exporting ``period`` seconds (None: no worker exports one, an older job) but
    the workers in ``periodless``."""
    result = profiles(*parts, minutes=minutes, until=0)
    if period is not None:
        for index in range(len(parts)):
            if index not in periodless:
                result[s(c.PROFILE_PERIOD, **place(index))] = f"{period:g}x{minutes}"
    return result


def straggling(minutes: int, period: float | None, periodless: tuple[int, ...] = ()) -> dict[str, str]:
    """Four workers whose host timers see no straggler (a step jitted whole), and whose profile shows worker 3."""
    return {
        **lockstep({}, minutes=minutes, sync=0.0),
        **profiled_once(*STRAGGLING, minutes=minutes, period=period, periodless=periodless),
    }


def sync_bound(minutes: int, period: float | None, fires: bool) -> Case:
    """TpuscopeSyncBound at ``minutes`` after a capture at minute 0 that says half of each step waits, from a job
    exporting ``period`` (None: too old to): firing as the profile says, or quiet (the host timers say nothing)."""
    series = {**phases(io=0, sync=0, minutes=minutes), **profiled_once(*WAITING, minutes=minutes, period=period)}
    if not fires:
        return Case(AlertName.SYNC_BOUND, None, f"{minutes}m", series)
    return Case(
        AlertName.SYNC_BOUND,
        "warning",
        f"{minutes}m",
        series,
        {**W, "source": "profile"},
        "Workload w spends 50% of its step time waiting on collectives that no compute hides, in its sampled "
        "device profiles.",
    )


CASES = [
    # 70 minutes after an hourly job's capture, it is fresh: the straggler it shows is still named (and chronic).
    Case(AlertName.STRAGGLER, "warning", "70m", straggling(70, HOURLY), STRAGGLER_LABELS, STRAGGLER_SAYS),
    # Three hours and ten minutes on, past three of its periods: stale, and the host timers see no straggler.
    Case(AlertName.STRAGGLER, None, "190m", straggling(190, HOURLY)),
    # A job too old to export its period: fresh for 30 minutes, as before ...
    sync_bound(25, None, fires=True),
    # ... and no longer 50 minutes on: its host timers (0 s of sync) say nothing.
    sync_bound(50, None, fires=False),
    # Nor is a straggler it showed for those 30 minutes chronic.
    Case(AlertName.STRAGGLER, None, "50m", straggling(50, None)),
    # Worker by worker: the straggler's own job exports no period (its peers' do), so its capture is stale at 50
    # minutes, and the three fresh peers show no straggler.
    Case(AlertName.STRAGGLER, None, "50m", straggling(50, HOURLY, periodless=(3,))),
    # SyncBound reads the fresh profiles too: an hourly job's capture still says it waits, where its host timers
    # (0 s of sync in a step jitted whole) cannot.
    sync_bound(50, HOURLY, fires=True),
    sync_bound(190, HOURLY, fires=False),
]
