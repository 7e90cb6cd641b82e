"""Custom badput against the reference: Google's ml-goodput-measurement books the same real job's eval.

A real JAX job, marked as a job instrumented for both would be: its Monitor with ``mon.badput("eval")`` around an eval
between two steps, and the reference's own ``GoodputRecorder`` calls (job start and end, each step's start, the eval's
start and end). The reference's ``GoodputCalculator`` books them as it books any job; only its Cloud Logging log is an
in-memory one (:class:`InMemoryLog`). tpuscope's goodput, as the real sidecar serves it, is within 1 percentage point
of the reference's, and the eval's seconds within a few milliseconds of its ``CUSTOM_BADPUT_EVENTS['EVAL']``.

The job compiles its two programs before its loop, as a job whose compile the reference reads right must: the
reference infers start-up time from the first step's excess over the others, and counts a compile inside the eval as
the eval's (tpuscope measures compiles and books them as compile wherever they run; docs/goodput.md).
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from ml_goodput_measurement.src import goodput as goodput_reference

from tpuscope import catalog
from tpuscope.testing.waiting import scrape_until
from tpuscope.tracing import Monitor
from tpuscope.workload.sidecar import SidecarProcess

STEPS = 300
EVAL_AFTER = 149  # the eval runs between this step and the next
EVAL_BATCHES = 150


class InMemoryLog:
    """The reference's Cloud Logging log, kept in memory: what its ``_CloudLogger`` does for ``GoodputRecorder``
    (``write_cloud_logging_entry``, ``flush``) and ``GoodputCalculator`` (``read_cloud_logging_entries``), as
    ml_goodput_measurement/src/goodput.py of ml-goodput-measurement 0.2.3 defines that protocol
    (AI-Hypercomputer/ml-goodput-measurement at 57092cfcf1c9c0a2ef9e5c2311734fabb8b38152). Entries are read back in
    the order written, each timestamped when written, as Cloud Logging orders them (ASCENDING)."""

    def __init__(self) -> None:
        self.entries: list[tuple[datetime.datetime, str, dict[str, Any]]] = []

    def write_cloud_logging_entry(self, entry: dict[str, Any]) -> None:
        now = datetime.datetime.now(datetime.UTC)
        self.entries.append((now, str(len(self.entries)), dict(entry)))

    def flush(self) -> None:
        pass

    def read_cloud_logging_entries(
        self,
        start_time: datetime.datetime | None = None,
        end_time: datetime.datetime | None = None,
        last_entry_info: tuple[datetime.datetime, str] | None = None,
    ) -> tuple[list[dict[str, Any]], tuple[datetime.datetime | None, str | None]]:
        after = int(last_entry_info[1]) if last_entry_info else -1
        read = [
            (at, key, entry)
            for at, key, entry in self.entries
            if int(key) > after and (start_time is None or at >= start_time) and (end_time is None or at <= end_time)
        ]
        last = (read[-1][0], read[-1][1]) if read else (None, None)
        return [entry for _, _, entry in read], last


def test_a_marked_eval_books_as_the_reference_books_its_custom_badput(sidecar: SidecarProcess, short_tmp: Path) -> None:
    import jax
    import jax.numpy as jnp

    @jax.jit
    def train_step(w: jax.Array, x: jax.Array) -> jax.Array:
        return w - 1e-3 * jnp.tanh(x @ w) @ w.T

    @jax.jit
    def evaluate(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.mean(jnp.tanh(x @ w @ w.T @ w))

    key = jax.random.key(0)
    w, x = jax.random.normal(key, (512, 512)), jax.random.normal(key, (512, 512))
    log = InMemoryLog()
    reference = goodput_reference.GoodputRecorder("eval-job", "tpuscope-test", logging_enabled=True, cloud_logger=log)

    def now() -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)

    reference.record_job_start_time(now())
    with Monitor("reference", socket=sidecar.socket, traces=False) as mon:
        w, _ = jax.block_until_ready((train_step(w, x), evaluate(w, x)))  # both compiled before the loop
        for n in range(STEPS):
            with mon.step(n):
                reference.record_step_start_time(n, now())
                w = jax.block_until_ready(train_step(w, x))
            if n == EVAL_AFTER:
                reference.record_custom_badput_event_start_time(now(), "eval")
                with mon.badput("eval"):
                    for _ in range(EVAL_BATCHES):
                        jax.block_until_ready(evaluate(w, x))
                reference.record_custom_badput_event_end_time(now(), "eval")
    reference.record_job_end_time(now())

    scrape = scrape_until(
        sidecar.url,
        lambda s: (
            s.value(catalog.STEPS.name, workload="reference") == STEPS
            and not s.has(catalog.WORKLOAD_PROCESSES.name, workload="reference")
        ),
    )
    booked = {s.labels["category"]: s.value for s in scrape.find(catalog.GOODPUT.name, workload="reference")}
    wall = scrape.present(catalog.GOODPUT_WALL.name, workload="reference")
    ours = booked["productive"] / wall * 100

    calculator = goodput_reference.GoodputCalculator(
        "eval-job", "tpuscope-test", cloud_logger=log, cache_dir=str(short_tmp / "reference-cache")
    )
    theirs, _, last_step = calculator.get_job_goodput(include_badput_breakdown=True)
    badput = calculator.get_job_goodput_details()["badput_time"]
    their_eval = badput[goodput_reference.BadputType.CUSTOM_BADPUT_EVENTS]["EVAL"]
    print(
        f"goodput: tpuscope {ours:.2f} %, ml-goodput-measurement {theirs:.2f} %; "
        f"eval: tpuscope {booked['eval']:.4f} s, ml-goodput-measurement {their_eval:.4f} s; "
        f"wall: tpuscope {wall:.3f} s; tpuscope's categories {booked}"
    )
    assert last_step == STEPS - 1  # the job ended: it counts every step
    assert booked["eval"] == pytest.approx(their_eval, abs=0.005)
    assert booked["eval"] > 0.05 * wall  # an eval that matters to the figure
    assert ours == pytest.approx(theirs, abs=1.0)
    assert sum(booked.values()) == pytest.approx(wall, abs=0.02)
