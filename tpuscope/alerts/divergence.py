"""Alerts on what the job's own numbers say (Monitor's ``s.loss(...)``): a loss gone non-finite, the worker whose
value before the reduction went first, a loss spike that does not come down.

- A non-finite loss or gradient norm pages: the run burns every chip from that step on, and no framework stops it
  by default. Once per workload, whichever value and however many workers (the all-reduce spreads it to all).
- Silent data corruption, a bad chip, shows first on its own worker: its value before the reduction (``local``)
  goes non-finite while its peers' are finite, and the step after, every worker's loss is. The worker whose local
  value went first, alone, with peers that report theirs, gets a ticket of its own: suspect its hardware.
- A spike (the loss many robust standard deviations above its recent baseline, tpuscope.exporter.training_health)
  that has not come down in ``loss_spike_seconds`` makes a ticket; one that recovers is the noise of training.
"""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope import durations
from tpuscope.alerts.rules import Alert
from tpuscope.conventions import AlertName, DashboardUID
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import WORKER, WORKLOAD, grown, series

LOCAL, NOT_LOCAL = 'value="local"', 'value!="local"'
# How long after its last non-finite value a workload still pages, and a first worker is still named: a job that
# keeps stepping on NaN keeps both; one restored or stopped lets them resolve after this.
RECENT = "5m"


def first_to_go() -> str:
    """Each worker whose local value went non-finite at the earliest step of its workload's recent onsets, alone,
    its value that step: its peers' local values were finite at that step (or went later). With its node: the
    bad-host ledger keeps it (tpuscope.alerts.nodes)."""
    onset = series(c.TRAINING_NONFINITE_ONSET, LOCAL)
    recent = f"({onset} and {grown(series(c.TRAINING_NONFINITE, LOCAL), RECENT)} > 0)"
    earliest = f"{recent} == on ({WORKLOAD}) group_left () min by ({WORKLOAD}) ({recent})"
    alone = f"count by ({WORKLOAD}) ({earliest}) == 1"
    peers = f"count by ({WORKLOAD}) ({series(c.TRAINING_VALUE, LOCAL)}) > 1"
    named = f"{earliest} and on ({WORKLOAD}) {alone} and on ({WORKLOAD}) {peers}"
    return f"max by ({WORKLOAD}, {WORKER}, instance, node) ({named})"


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
    spike_for = durations.prometheus_seconds(t.loss_spike_seconds)
    deviation = series(c.LOSS_DEVIATION)
    nonfinite = f"sum by ({WORKLOAD}) ({grown(series(c.TRAINING_NONFINITE, NOT_LOCAL), RECENT)}) > 0"
    return [
        Alert(
            AlertName.LOSS_NON_FINITE,
            "critical",
            nonfinite,
            "A workload's loss went NaN or infinite.",
            "Workload {{ $labels.workload }} reported {{ $value }} non-finite losses or gradient norms in the last "
            f"{RECENT}: every step from here on is lost. Stop it, and restore the last checkpoint before the first "
            "non-finite step.",
            DashboardUID.JOB,
            runbook="The job reports its loss (and gradient norm) each step with `s.loss(...)`; one of them read NaN "
            "or infinite, on some worker, in the last 5 minutes. One page per workload, whichever value and "
            "however many workers: the all-reduce makes every worker's loss non-finite a step after one worker's "
            f"gradient is. While the job keeps stepping, it keeps firing. {AlertName.NON_FINITE_FIRST_WORKER} names "
            "the worker that went first where the job reports its value before the reduction (`local=`): if it "
            "fires, suspect that worker's chips; if it does not (every worker went at the same step), suspect the "
            "code, the data or the learning rate. The Job debug dashboard's Training health row shows the loss and "
            "the step each worker went at (`tpuscope_training_nonfinite_onset_step`). Stop the job, or let it "
            "restore an earlier checkpoint: the steps between that checkpoint and the highest step reached are "
            "booked as lost goodput (`tpuscope_goodput_rolled_back_steps_total`, docs/goodput.md).",
        ),
        Alert(
            AlertName.NON_FINITE_FIRST_WORKER,
            "warning",
            first_to_go(),
            "One worker's value went non-finite before its peers': suspect its hardware.",
            "Worker {{ $labels.worker }} of slice {{ $labels.slice }} ({{ $labels.instance }}) of workload "
            "{{ $labels.workload }} went non-finite first, at step {{ $value }}, its value before the reduction, "
            "while its peers' were finite: suspect silent data corruption on its chips.",
            DashboardUID.JOB,
            "1m",
            runbook="Every worker reports its own value before the reduction (`s.loss(loss, local=...)`: its share "
            "of the loss, or its gradient's norm, before the all-reduce). This worker's went NaN or infinite at a "
            "step where every peer's was still finite: the value it fed the all-reduce was bad before any other, "
            "which a chip's silent data corruption does and a bug in the code or data rarely does (those hit "
            "every worker at once, or follow the data, not the host). It needs at least two workers reporting "
            "their local values, and one first alone; a tie names nobody. It waits a minute for the peers' "
            "readings of the same step, which arrive a little later. What to do: note the node, run the "
            "accelerator's diagnostics on it (on TPU, the health checks of the TPU VM; on GPU, DCGM's diagnostics), "
            "cordon it if they fail, and restart the job from a checkpoint before the step named. Once is "
            "evidence, twice on one host is a pattern.",
        ),
        Alert(
            AlertName.LOSS_SPIKE,
            "warning",
            # The window is the persistence: every reading in it was a spike, from a series that was there before.
            f"max by ({WORKLOAD}) (min_over_time({deviation}[{spike_for}]) > {c.LOSS_SPIKE_DEVIATION:g}"
            f" and {deviation} offset {spike_for})",
            "A workload's loss spiked and has not come down.",
            'Workload {{ $labels.workload }}\'s loss has stayed at least {{ $value | printf "%.0f" }} robust '
            f"standard deviations above its recent baseline for {durations.human(t.loss_spike_seconds)}.",
            DashboardUID.JOB,
            runbook="The sidecar keeps a baseline of the loss: the median and MAD of its latest "
            f"{c.LOSS_BASELINE_STEPS} finite values that were not spikes. A loss more than "
            f"{c.LOSS_SPIKE_DEVIATION:g} robust standard deviations (1.4826 MADs) above the median is a spike "
            "(`tpuscope_training_loss_deviation`), kept out of the baseline. A spike that comes down within "
            "`loss_spike_seconds` is the noise of training and no alert; one that has not is a run that diverged "
            "without a NaN, or settled at a worse loss: look at the loss curve on the Job debug dashboard, the "
            "learning rate schedule and the data at that step, and restore a checkpoint before it if the run will "
            "not recover. A loss that legitimately moves to a new level (a new data mixture) reads as a spike "
            "until the job restarts; silence the ticket for the run.",
        ),
    ]
