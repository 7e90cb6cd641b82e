"""A hung job diagnosed: one trial of each of ``tpuscope bench hangs``' ways, side by side (issue 54).

Each trial is a real 4-process ``jax.distributed`` job on the CPU (gloo), a sidecar per process and a real
Prometheus on the generated rules; worker 1 hangs at step 20: its input blocks in a read, it spins in Python in
its metrics code, or it skips the barrier its peers enter. TpuscopeWorkloadHung must name worker 1 alone, with
its phase and top frames, within 2 minutes of the hang; then every process and sidecar is killed, and the
sidecars' logs must still give each worker's stacks and the verdict.

The suite runs the pipeline quicker than deployed (a 10 s floor, scrapes and rules every 2 s) to fit its time;
``make hang-trials`` runs 10 trials of each way at the deployed speed (a 60 s floor, 15 s scrapes, 30 s rules) and
the clean runs that must not page, and prints the figures (docs/failures.md, "A hung job").
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tpuscope.bench import hangs

pytestmark = [pytest.mark.long, pytest.mark.alone]  # 12 JAX processes, 12 sidecars and 3 Prometheus at a time

# A 10 s floor (the bench's steps take tens of milliseconds here), scrapes and rules every 2 s, a model of one layer.
SUITE_SPEED = hangs.Speed(hang_after="10s", scrape="2s", evaluation="2s", model=("--layers=1", "--d-model=32"))


@pytest.mark.timeout(420)
def test_each_way_of_hanging_names_the_hung_worker_and_survives_in_the_logs(short_tmp: Path) -> None:
    with ThreadPoolExecutor(len(hangs.WAYS)) as pool:
        results = list(pool.map(hangs.trial, hangs.WAYS, [short_tmp / way for way in hangs.WAYS], [SUITE_SPEED] * 3))
    for result in results:
        assert not result.error, result
        assert result.seconds_to_alert is not None and result.seconds_to_alert <= hangs.WITHIN_SECONDS, result
        assert result.named == [str(hangs.HUNG)], result  # worker 1 alone
        assert result.phase_and_frames, result.description
        # After every process and sidecar was killed: the verdict and each worker's stacks, from the logs.
        assert result.logs_verdict == [str(hangs.HUNG)], result
        assert result.logs_stacks == hangs.PROCESSES, result
        assert result.ok, result
