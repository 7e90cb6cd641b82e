"""Alerts on how a training workload steps: hung, stalled, slower than its baseline, waiting on input or on
collectives, held back by a straggler, leaving its chips idle or far from their peak, its collectives slower
than their own baseline."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope import durations, positions
from tpuscope.alerts import stragglers
from tpuscope.alerts.rules import (
    HOSTS_NAMED,
    THE_ALERTS_WORKLOAD,
    Alert,
    HostsOfWorkload,
    query_of_the_alerts_workload,
    running,
    workload_on_host,
)
from tpuscope.conventions import (
    COLLECTIVE_P99,
    CORE_ELSEWHERE,
    HANG_ELSEWHERE,
    HANG_POSITION,
    HANG_POSITION_WORKERS,
    PHASE_SHARE,
    PROFILE_FRESH_SECONDS,
    PROFILE_MEDIAN,
    PROFILE_SHARE,
    RUNTIME_ERROR_WORKERS,
    SOURCE,
    STEP_MEAN,
    STRAGGLER,
    STRAGGLER_CHRONIC,
    STRAGGLER_HISTORY,
    STRAGGLER_SHARE,
    AlertName,
    DashboardUID,
)
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import TARGET, WORKLOAD, series


def from_profiles_else_host(profiled: str, host: str, otherwise: str = "host") -> str:
    """``profiled`` for the workloads with fresh device profiles, ``host`` for the others; never both for one.
    ``otherwise``: the source label of the second."""
    profiles = stragglers.labelled(profiled, SOURCE, "profile")
    return f"{profiles} or {stragglers.labelled(f'{host} unless on ({WORKLOAD}) {PROFILE_SHARE}', SOURCE, otherwise)}"


# A collective measure now (its median over the last 30 minutes: three device-profile captures at the default
# period, so that one odd capture cannot fire the alert alone) against its own past (its median over the 6 hours
# before), judged once it has 3 hours of past at least, as TpuscopeStepTimeRegression judges the step time.
NOW = durations.prometheus(PROFILE_FRESH_SECONDS * 1000)  # three of the job's default capture periods
BASELINE, BASELINE_OFFSET, HISTORY = "6h", NOW, "3h30m"
EXPOSED = 'part="exposed_collective"'


def against_baseline(recorded: str) -> str:
    """A recorded series' median over :data:`NOW` divided by its median over the :data:`BASELINE` before, where it
    existed :data:`HISTORY` ago."""
    return (
        f"quantile_over_time(0.5, {recorded}[{NOW}])"
        f" / quantile_over_time(0.5, {recorded}[{BASELINE}] offset {BASELINE_OFFSET})"
        f" and {recorded} offset {HISTORY}"
    )


def collective_spike(config: GeneratorConfig) -> str:
    """A workload's exposed collective time per step (its workers' median, from fresh device profiles) against its
    baseline, while exposed collectives are a fair share of its step; for a workload without profiles, the
    multislice runtime's collective p99 of its slowest host against that host's baseline."""
    t = config.thresholds
    profiled = (
        f"max by ({WORKLOAD}) ({against_baseline(f'{PROFILE_MEDIAN}{{{EXPOSED}}}')}) > {t.collective_spike_factor:g}"
        f" and on ({WORKLOAD}) max by ({WORKLOAD}) ({PROFILE_SHARE}{{{EXPOSED}}}) > {t.collective_spike_min_share:g}"
    )
    megascale = (
        f"max by ({WORKLOAD}) (({against_baseline(COLLECTIVE_P99)})"
        f" * on (job, instance) group_left (workload) {workload_on_host()}) > {t.collective_spike_factor:g}"
    )
    return from_profiles_else_host(profiled, megascale, otherwise="megascale")


# The worker of a stalled workload whose TPU cores sit elsewhere than most of its peers' (recording.core_state_rules),
# as the stall's description names it: a Go template that queries the recorded series of the alert's workload.
OF_THE_WORKLOAD = ", ".join(THE_ALERTS_WORKLOAD)
# The straggler's cause and its peers' share of their steps spent waiting for it (tpuscope.alerts.stragglers).
STRAGGLER_OF_WORKLOAD = (
    f"{{{{ range {query_of_the_alerts_workload(f'{STRAGGLER}{{{OF_THE_WORKLOAD}}}')} }}}} (cause: "
    "{{ .Labels.cause }}){{ end }}"
    f"{{{{ range {query_of_the_alerts_workload(f'{STRAGGLER_SHARE}{{{OF_THE_WORKLOAD}}}')} }}}}, "
    "{{ .Value | humanizePercentage }} of their steps{{ end }}"
)
CORE_ELSEWHERE_OF_WORKLOAD = (
    f"{{{{ range {query_of_the_alerts_workload(f'{CORE_ELSEWHERE}{{{OF_THE_WORKLOAD}}}')} }}}}"
    " Worker {{ .Labels.worker }} (slice {{ .Labels.slice }}, {{ .Labels.instance }}) has had its TPU cores at HLO "
    "{{ .Labels.hlo_location }} of program {{ .Labels.fingerprint }} for {{ .Value | humanizeDuration }}, where "
    "most of its peers' are not: the others likely wait for it.{{ end }}"
)
# The workers whose TPU runtime reports a megascale hang or a slice error (recording.core_state_rules).
RUNTIME_ERROR_OF_WORKLOAD = (
    f"{{{{ range {query_of_the_alerts_workload(f'{RUNTIME_ERROR_WORKERS}{{{OF_THE_WORKLOAD}}}')} }}}}"
    " The TPU runtime of worker {{ .Labels.worker }} (slice {{ .Labels.slice }}, {{ .Labels.instance }}) reports "
    "{{ .Labels.reason }}.{{ end }}"
)


def at_step(sample: str, step: str = "step", before: str = "before its first step") -> str:
    """Template text of the step of a stuck position (``sample``: a query's sample): ``step`` and its number, or
    ``before`` where it has none (the job had taken no step yet)."""
    return f"{{{{ with {sample}.Labels.step }}}}{step} {{{{ . }}}}{{{{ else }}}}{before}{{{{ end }}}}"


# Where a hung workload's workers are stuck (recording.hang_rules): each worker elsewhere than most of its peers,
# with its top frames; where none is (all at one place, or a tie), each position with how many workers are there
# and the frames of one of them.
HANG_POSITIONS = (
    f"topk by ({WORKLOAD}, step, phase) (1, {HANG_POSITION}{{{OF_THE_WORKLOAD}}}"
    f" * on ({WORKLOAD}, step, phase) group_left () {HANG_POSITION_WORKERS})"
)
HANG_ELSEWHERE_OF_WORKLOAD = (
    f"{{{{ with {query_of_the_alerts_workload(f'{HANG_ELSEWHERE}{{{OF_THE_WORKLOAD}}}')} }}}}"
    '{{ range $w := . | sortByLabel "worker" }}'
    " Worker {{ $w.Labels.worker }} (slice {{ $w.Labels.slice }}, {{ $w.Labels.instance }}) is elsewhere than its "
    f"peers: {at_step('$w')}, {{{{ $w.Labels.phase }}}}, at {{{{ $w.Labels.frames }}}}: the others likely wait "
    "for it.{{ end }}{{ else }} No worker is elsewhere than most of its peers:"
    f'{{{{ range $i, $p := {query_of_the_alerts_workload(HANG_POSITIONS)} | sortByLabel "phase" }}}}'
    f"{{{{ if $i }}}};{{{{ end }}}} {{{{ $p.Value }}}} {at_step('$p', 'at step', 'before their first step')}, "
    "{{ $p.Labels.phase }}, at {{ $p.Labels.frames }}{{ end }}.{{ end }}"
)


def by_source(profile: str, host: str) -> str:
    """Description text that depends on the firing expression's source."""
    return f'{{{{ if eq $labels.{SOURCE} "profile" }}}}{profile}{{{{ else }}}}{host}{{{{ end }}}}'


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
    stall_for = durations.prometheus_seconds(t.stall_seconds / 2)
    idle = HostsOfWorkload(f"avg by ({TARGET}) ({series(c.DUTY_CYCLE)}) < {t.duty_cycle_low:g}", worst="bottomk")
    return [
        Alert(
            AlertName.WORKLOAD_STALLED,
            "critical",
            f"time() - max by ({WORKLOAD}) ({series(c.LAST_PROGRESS)}) > {t.stall_seconds:g} {running()}",
            "A workload has stopped making progress.",
            "Workload {{ $labels.workload }} has completed no step for {{ $value | humanizeDuration }}, nor any "
            "checkpoint or compile stage (counted from the last of them, or from its start), while its processes "
            "are still connected." + CORE_ELSEWHERE_OF_WORKLOAD + RUNTIME_ERROR_OF_WORKLOAD,
            DashboardUID.JOB,
            # The job sends nothing while it saves or compiles, so a save or compile that begins at a step is
            # timed from that step: waiting half the threshold again lets one last 1.5x the threshold, and a hung
            # one still pages that long after it began.
            stall_for,
            "A hung collective (one host down or stuck), a dead input pipeline, a deadlock, or a checkpoint save "
            "or restore or a compile that never ends. Progress is a step, the workload's start, a checkpoint save "
            "or restore ending (failed or not) or a compile stage ending; it pages "
            f"{durations.human(t.stall_seconds + durations.parse(stall_for))} after the last progress: if the job's "
            "saves or compiles take that long, raise stall_seconds. On TPU hosts whose runtime serves its "
            "metrics, each sidecar asks the runtime, once the workload has made no progress for "
            f"{durations.human(t.stall_seconds)} (the sidecar's own setting), where each core is: "
            f"`{c.CORE_STATE.name}` (the program's fingerprint and the HLO location) and "
            f"`{c.CORE_LOCATION_AGE.name}` (how long it has been there). In a hung multi-host job every worker's "
            "cores wait at the same collective but one's: the description names a worker whose cores sit "
            "elsewhere than most of its peers' (a tie names nobody). It also names the workers whose runtime's own "
            f"detectors report a hang of a multislice collective or a slice error (`{c.TPU_RUNTIME_ERROR.name}`, what "
            "GKE turns into the node conditions MegascaleHangDetected and SliceErrorDetected): a slice error is a "
            "hardware or ICI failure, a case for the platform. Start with the worker named: its logs, its input, "
            "its host (`tpuscope top` there shows its cores). Otherwise check the job's logs on every worker, the "
            "On-call dashboard's sidecars and collectors, and the last kept trace.",
        ),
        Alert(
            AlertName.WORKLOAD_HUNG,
            "critical",
            # Every worker reporting says its processes are stuck; the value, the least time any of them has been
            # where it is stuck: how long the whole workload has not moved.
            f"min by ({WORKLOAD}) ({series(c.POSITION_AGE)} and on (job, instance, {c.Label.WORKLOAD}, {c.Label.PHASE})"
            f" {series(c.STUCK_POSITION)}) and on ({WORKLOAD}) (min by ({WORKLOAD}) ({series(c.STUCK)}) == 1)",
            "Every worker of a workload is stuck: the job hangs.",
            "Workload {{ $labels.workload }} hangs: every worker has stayed where it is past its limit, none has "
            "moved for {{ $value | humanizeDuration }}, and their sidecars have logged their Python stacks."
            + HANG_ELSEWHERE_OF_WORKLOAD
            + CORE_ELSEWHERE_OF_WORKLOAD
            + RUNTIME_ERROR_OF_WORKLOAD,
            DashboardUID.JOB,
            # No for: of its own. The sidecars waited each process's limit before calling it stuck, and logged its
            # stacks; waiting again would only delay the page that names the worker (within two minutes of the
            # hang at the default hang_seconds, a 15 s scrape and a 30 s evaluation).
            "0m",
            "Each sidecar reads where its job's processes are every second, from a record the Monitor keeps in "
            "shared memory (so it reads it while every thread of the job is blocked): the step, and where in it "
            "(`phase`: io, compute, sync or other; `step`, in a step between phases; `outside`, between steps or "
            "in code the job does not mark, such as an eval loop; `compile`; `checkpoint_save`, "
            f"`checkpoint_restore`). `{c.POSITION_AGE.name}` says how long a process has been there, "
            f"`{c.POSITION_LIMIT.name}` how long it may stay: in a step, {t.hang_seconds:g} s (hang_seconds) or "
            f"{t.hang_step_factor:g}x the longest of the workload's recent steps (hang_step_factor), whichever is "
            "longer; compiling, in a checkpoint or between steps, the stall threshold "
            f"({durations.human(t.stall_seconds)}, the sidecar's core_state_after), as these take as long as they "
            "take. Past its limit a process is stuck: the sidecar asks it for its Python stacks and logs them, one "
            "JSON line per stuck process on its stderr (`kubectl logs POD -c tpuscope`; Cloud Logging keeps them "
            "after the pod is gone), then serves "
            f"`{c.STUCK.name}` 1 and `{c.STUCK_POSITION.name}` (the step, the phase and the top frames). The "
            "workload hangs when every worker is stuck, and this pages at once: the sidecars waited the limit "
            f"already. It comes before {AlertName.WORKLOAD_STALLED} (minutes before, for a hang in a step), which it "
            "keeps quiet. The description "
            "names the worker stuck at another step or phase than most of its peers (a tie, or all of them at one "
            "place, names nobody: it says where they are instead): in a synchronous job the others wait for it at "
            "a collective. Start with that worker; its phase says where to look: io, the input pipeline (a "
            "reader blocked on storage, a dead loader worker); compute, a device program or a host callback that "
            "does not return; sync, a collective whose peer is gone or stuck (on TPU the description adds its "
            "cores' HLO location, which a stuck workload's sidecars ask the runtime for at once, and the "
            "runtime's own hang and slice-error detectors); checkpoint_save or checkpoint_restore, the storage; "
            "compile, the compiler; outside, the job's own code between steps. The whole stacks of every thread "
            "are in the sidecars' logs: `tpuscope hangs LOGFILE...` reads them and names the worker elsewhere, as "
            "this alert does. With the Monitor's exit_on_hang, the sidecar tells a stuck process to end a minute "
            f"after its stacks are logged (exit status {positions.EXIT_STATUS}, failure reason hang), so that a "
            "JobSet whose failure policy restarts the job restarts a hung one from its last checkpoint; a hang that "
            "recurs at the same place is a bug in the job or its data.",
        ),
        Alert(
            AlertName.STEP_TIME_REGRESSION,
            "warning",
            # A baseline of 3 hours at least: the recorded mean existed 3 h before the last 30 minutes. (A
            # count of samples would depend on the evaluation interval: 180 is 3 h at 1 m, 90 minutes at 30 s.)
            f"{STEP_MEAN} > {t.step_regression_factor:g} * avg_over_time({STEP_MEAN}[6h] offset 30m)"
            f" and {STEP_MEAN} offset 3h30m",
            "A workload's steps are slower than its own baseline.",
            "Workload {{ $labels.workload }} takes {{ $value | humanizeDuration }} a step, more than "
            f"{t.step_regression_factor:g}x its mean of the 6 hours before.",
            DashboardUID.JOB,
            "30m",
            "Compare the phase breakdown before and after: io (input), sync (collectives, a straggler), compute "
            "(a new program, throttled chips).",
        ),
        Alert(
            AlertName.INPUT_BOUND,
            "warning",
            f'{PHASE_SHARE}{{phase="io"}} > {t.io_share:g}',
            "A workload waits for its input.",
            "Workload {{ $labels.workload }} spends {{ $value | humanizePercentage }} of its step time waiting for "
            "input.",
            DashboardUID.JOB,
            "15m",
            "Add input workers, prefetch more batches, move decoding off the training host, check the storage.",
        ),
        Alert(
            AlertName.SYNC_BOUND,
            "warning",
            from_profiles_else_host(
                f'max by ({WORKLOAD}) ({PROFILE_SHARE}{{part="exposed_collective"}}) > {t.sync_share:g}',
                f'max by ({WORKLOAD}) ({PHASE_SHARE}{{phase="sync"}}) > {t.sync_share:g}',
            ),
            "A workload spends much of its steps in collectives.",
            "Workload {{ $labels.workload }} spends {{ $value | humanizePercentage }} of its step time "
            + by_source(
                "waiting on collectives that no compute hides, in its sampled device profiles",
                "in collective sync, timed on the host",
            )
            + ".",
            DashboardUID.JOB,
            "15m",
            "The share comes from the workload's device profiles where it has fresh ones (the `source` label says "
            "`profile`): the collective time no compute overlaps, each worker's mean over the steps of its last "
            f"{c.PROFILE_MEAN_CAPTURES} fresh captures ({t.profile_min_steps:g} steps at least), averaged over the "
            "workers; otherwise from its "
            'host-timed sync phase (`source="host"`), which reads 0 for a step jitted whole, where collectives run '
            f"inside the program. Look for a straggler first ({AlertName.STRAGGLER}); then the interconnect, the "
            "sharding, and what keeps the compiler from overlapping the collectives with compute.",
        ),
        Alert(
            AlertName.STRAGGLER,
            "warning",
            # Chronic: named in most of the last hour (tpuscope.alerts.stragglers), and in the last 5 minutes (a
            # profile gone stale names no one); one series a worker whatever its cause, so that a cause that changes
            # opens no second ticket.
            f"{stragglers.cost_per_hour()} and on ({stragglers.WORKER}) {STRAGGLER_CHRONIC} > {t.straggler_chronic:g}"
            f" and on ({stragglers.WORKER}) count_over_time({STRAGGLER}[5m])",
            "One worker holds the rest of its workload back, chronically.",
            "Worker {{ $labels.worker }} ({{ $labels.instance }}, slice {{ $labels.slice }}) of workload "
            "{{ $labels.workload }} has been its straggler for most of the last hour: its peers waited for it at "
            'the collectives {{ printf "%.2f" $value }} chip-hours an hour'
            + STRAGGLER_OF_WORKLOAD
            + ", "
            + by_source("in the sampled device profiles", "timed on the host")
            + ".",
            DashboardUID.JOB,
            "5m",
            "Start from the cost and the cause. The cost is the chips kept idle: each worker's wait at the "
            "collectives per step beyond its workload's least-waiting worker's, times its steps a second and its "
            'chips (its host-timed sync phase where the workload times one, `source="host"`, else its profiled '
            f'exposed collective time, `source="profile"`). The straggler is the least-waiting worker once its '
            f"peers wait for it over {t.straggler_share:.0%} of their steps, and chronic once it has been so in "
            f"over {t.straggler_chronic:.0%} of the last {STRAGGLER_HISTORY}: a blip (one slow step, one slow "
            "capture) never is. The cause says where its extra time goes, against its workload's median worker: "
            "`compute` (its devices compute longer: a slow or throttled chip, a different program; cordon the "
            "node and restart elsewhere), `input` (its input phase: its data loader, its storage, its share of "
            "the dataset), `host` (its devices idle on their host: dispatch, callbacks, a busy CPU; see the "
            "host's CPU), `unknown` (none explains half its lag). The waiting is booked as the goodput category "
            "`straggler` (docs/goodput.md).",
        ),
        Alert(
            AlertName.LOW_DUTY_CYCLE,
            "warning",
            idle.expr(),
            "A workload's chips are mostly idle on some of its hosts.",
            "Workload {{ $labels.workload }}: the chips of {{ $value }} of its hosts were busy less than "
            f"{t.duty_cycle_low:.0%} of the time:" + idle.named() + ".",
            DashboardUID.FLEET,
            "30m",
            "Paid-for chips waiting: on input, on the host, on a straggler. See the workload's phase breakdown. One "
            "ticket per workload, whatever the hosts (the description names the idlest "
            f"{HOSTS_NAMED}, each with its chips' mean duty cycle; the Job debug dashboard shows them all).",
        ),
        Alert(
            AlertName.LOW_MFU,
            "warning",
            f"avg by ({WORKLOAD}) ({series(c.MFU)}) < {t.mfu_low:g} {running()}",
            "A workload uses a small share of its chips' peak FLOP/s.",
            "Workload {{ $labels.workload }} reaches {{ $value | humanizePercentage }} model FLOPs utilization.",
            DashboardUID.JOB,
            "30m",
            "Profile the step: fusion, padding, small batches, host-bound phases.",
        ),
        Alert(
            AlertName.COLLECTIVE_LATENCY_SPIKE,
            "warning",
            collective_spike(config),
            "A workload's collectives are much slower than its own baseline.",
            "Workload {{ $labels.workload }} "
            + by_source(
                'waits on collectives that no compute hides {{ printf "%.1f" $value }}x as long a step as in '
                "the 6 hours before, in its sampled device profiles",
                'sees its multislice collectives (collective_end_to_end p99) take {{ printf "%.1f" $value }}x '
                "as long as in the 6 hours before, on its slowest host",
            )
            + f" (a spike from {t.collective_spike_factor:g}x).",
            DashboardUID.JOB,
            "10m",
            "The workload's collective time against its own past, so that a job that always spends much of its "
            "step in collectives is not flagged and one whose collectives got slower is. Where it has fresh "
            'device profiles (`source="profile"`): its workers\' median exposed collective time per step '
            "(collectives no compute hides), its median over the last 30 minutes (three captures at the default "
            "10-minute period: one odd capture cannot fire it) against its median over the 6 hours before, once "
            "it has 3.5 hours of profiles, and only while exposed collectives take more than "
            f"{t.collective_spike_min_share:.0%} of its step. Otherwise, in a multislice job "
            '(`source="megascale"`), the TPU runtime\'s collective_end_to_end latency p99 of its slowest host, '
            "judged alike (the runtime does not say what share of the step it is). Every worker slower together: "
            "the interconnect (ICI links, the DCN between slices, a congested network), a change of sharding or "
            f"of the collectives' sizes. One worker's peers waiting for it: a straggler ({AlertName.STRAGGLER}). "
            "Compare the Job debug dashboard's device profile before and after; check the network's health.",
        ),
    ]
