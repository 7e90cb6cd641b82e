"""``s.loss(...)``: the step's loss, gradient norm and local value reach the sidecar without the Monitor ever waiting
for the device (issue 56), and the sidecar serves what they say."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from recorder import Recorder

from tpuscope import catalog, events
from tpuscope.exporter.training_health import LossBaseline
from tpuscope.testing.waiting import scrape_until
from tpuscope.tracing import Monitor
from tpuscope.tracing.training_values import MAX_PENDING, PendingValues
from tpuscope.workload.sidecar import SidecarProcess


class Computing:
    """A value the device is still computing, as far as the Monitor can tell: ``is_ready()`` says no until
    :meth:`finish`. Any read before then (``float()``, ``np.asarray``, ``block_until_ready``: a device sync) fails
    the test."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.done = False
        self.reads_before_ready: list[str] = []

    def is_ready(self) -> bool:
        return self.done

    def finish(self) -> None:
        self.done = True

    def _read(self, how: str) -> Any:
        if not self.done:
            self.reads_before_ready.append(how)
        return np.float32(self.value)

    def __float__(self) -> float:
        return float(self._read("float"))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self._read("asarray"), dtype=dtype)

    def block_until_ready(self) -> Computing:
        self._read("block_until_ready")
        return self


def monitor(tmp: Path) -> tuple[Monitor, Recorder]:
    recorder = Recorder()
    mon = Monitor("values", socket=tmp / "nobody.sock", sinks=[recorder], traces=False, hooks=False)
    return mon, recorder


def sent(recorder: Recorder) -> list[events.StepValues]:
    """The values the Monitor sent: on the steps that read them, and at its close."""
    return [v for e in recorder.events if isinstance(e, events.Step | events.TrainingValues) for v in e.values]


def unread(recorder: Recorder) -> list[int]:
    """The counts of values dropped unread, as each event said them."""
    return [e.unread for e in recorder.events if isinstance(e, events.Step | events.TrainingValues) and e.unread]


def test_a_value_still_computing_is_never_read_and_is_sent_at_the_first_step_end_after_it_is_ready(
    short_tmp: Path,
) -> None:
    mon, recorder = monitor(short_tmp)
    loss = Computing(2.5)
    with mon.step(0) as s:
        s.loss(loss)
    for n in range(1, 4):
        with mon.step(n):
            pass
    assert sent(recorder) == [], "nothing sent while the value computes"
    loss.finish()
    with mon.step(4):
        pass
    mon.close()
    assert loss.reads_before_ready == [], "the Monitor waited for the device"
    assert sent(recorder) == [events.StepValues(0, loss=2.5)]
    (carrier,) = [e for e in recorder.events if isinstance(e, events.Step) and e.values]
    assert carrier.step == 4, "the first step to end after the value was ready carries it"


def test_a_real_jax_step_is_not_waited_for(short_tmp: Path) -> None:
    """A program that runs for most of a second: the step that reports its result ends long before the result is
    computed, and the value arrives once it is. A Monitor that read the value at s.loss() or at the step's end
    would make the step last as long as the program."""

    @jax.jit
    def slow(a: jax.Array) -> jax.Array:
        for _ in range(4):
            a = jnp.tanh(a @ a)
        return a.mean()

    a = jnp.ones((1000, 1000)) / 1000
    slow(a).block_until_ready()  # compiled
    started = time.perf_counter()
    slow(a).block_until_ready()
    program = time.perf_counter() - started

    mon, recorder = monitor(short_tmp)
    started = time.perf_counter()
    with mon.step(0) as s:
        loss = slow(a)
        s.loss(loss)
    step = time.perf_counter() - started
    computing_at_the_step_end = not loss.is_ready()
    loss.block_until_ready()  # the job's own wait, later
    with mon.step(1):
        pass
    mon.close()
    print(f"\nthe program {program * 1e3:.0f} ms, the step that reported its result {step * 1e3:.1f} ms")
    assert computing_at_the_step_end, "the program was done when the step ended: the Monitor waited for it"
    assert step < program / 4, (step, program)
    (values,) = sent(recorder)
    assert values.step == 0 and values.loss == pytest.approx(float(loss))


def test_a_value_never_ready_is_dropped_and_counted_and_the_rest_still_read(short_tmp: Path) -> None:
    mon, recorder = monitor(short_tmp)
    hung = Computing(1.0)
    with mon.step(0) as s:
        s.loss(hung)
    for n in range(1, MAX_PENDING + 1):  # the steps after it report values that are ready
        with mon.step(n) as s:
            s.loss(float(n))
    # The oldest waited MAX_PENDING steps behind it: dropped, and the values queued behind it read.
    assert [v.step for v in sent(recorder)] == list(range(1, MAX_PENDING + 1))
    assert unread(recorder) == [1]
    still = Computing(1.0)
    with mon.step(MAX_PENDING + 1) as s:
        s.loss(still)
    mon.close()  # still computing when the Monitor closes: not waited for, counted
    assert recorder.events[-2] == events.TrainingValues("values", (), unread=1), "the last word, before the stop"
    assert hung.reads_before_ready == [] and still.reads_before_ready == []


def test_numbers_arrays_and_non_finite_values_read_as_the_wire_carries_them() -> None:
    pending = PendingValues()
    pending.give(7, np.float32(1.5), 3, jnp.array([1.0, math.inf, 2.0]))
    pending.give(8, float("nan"), None, jnp.array([1.0, 4.0]))
    first, second = pending.ready()
    assert (first.loss, first.grad_norm, first.local) == (1.5, 3.0, "inf")
    assert (second.loss, second.grad_norm, second.local) == ("nan", None, 4.0)  # the largest of several
    step = events.Step("w", 9, 1.0, values=(first, second))
    decoded = events.decode(events.encode(step))
    assert isinstance(decoded, events.Step) and math.isnan(dict(decoded.values[1].values())["loss"])
    assert events.from_record(events.to_record(step, 0.0))[1] == step, "a recording keeps the NaN too"


def test_a_value_sharded_over_devices_reads_this_process_shards() -> None:
    """Each device's local gradient norm, one element per device: one non-finite makes the process's value so."""
    devices = jax.devices()
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    norms = np.ones(len(devices), dtype=np.float32)
    norms[len(devices) - 1] = np.nan
    local = jax.device_put(norms, NamedSharding(mesh, PartitionSpec("data")))
    pending = PendingValues()
    pending.give(0, 1.0, None, local)
    (values,) = pending.ready()
    assert values.local == "nan"


def test_the_sidecar_serves_the_loss_its_non_finite_count_onset_and_spike(sidecar: SidecarProcess) -> None:
    mon = Monitor("health", socket=sidecar.socket, traces=False, hooks=False)
    rng = np.random.default_rng(0)
    for n in range(60):
        with mon.step(n) as s:
            loss = 2.0 + 0.01 * rng.standard_normal() if n < 50 else 20.0  # a spike from step 50
            s.loss(loss, grad_norm=1.0, local=math.nan if n >= 55 else 1.0)
    mon.close()
    w = {"workload": "health"}
    got = scrape_until(sidecar.url, lambda m: m.value(catalog.TRAINING_VALUE.name, value="local", **w) is not None)
    got = scrape_until(sidecar.url, lambda m: m.value(catalog.TRAINING_NONFINITE.name, value="local", **w) == 5)
    assert got.value(catalog.TRAINING_VALUE.name, value="loss", **w) == 20.0
    assert got.value(catalog.TRAINING_NONFINITE.name, value="loss", **w) == 0, "created at 0 with the first loss"
    assert got.value(catalog.TRAINING_NONFINITE_ONSET.name, value="local", **w) == 55
    deviation = got.value(catalog.LOSS_DEVIATION.name, **w)
    assert deviation is not None and deviation > 100 * catalog.LOSS_SPIKE_DEVIATION, deviation
    assert got.value(catalog.TRAINING_VALUES_UNREAD.name, **w) == 0


def test_a_run_that_diverges_and_rolls_back_books_the_steps_it_threw_away(
    sidecar: SidecarProcess, short_tmp: Path
) -> None:
    """tests/diverging_job.py: a NaN at step 25, found at step 39, step 19 restored. The steps between (20 to 39)
    were run for nothing: the sidecar counts them within a step of the job's own count, and books the productive
    time the saves at 29 and 39 had made durable as rolled back."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    job = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parent / "diverging_job.py"),
            str(short_tmp / "ckpt"),
            "--socket",
            str(sidecar.socket),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    truth = json.loads(job.stdout.strip().splitlines()[-1])
    thrown_away = truth["highest"] - truth["restored"]
    w = {"workload": "diverging"}
    got = scrape_until(sidecar.url, lambda m: m.value(catalog.WORKLOAD_END_TIME.name, **w) is not None)
    booked = got.value(catalog.GOODPUT_ROLLED_BACK_STEPS.name, **w)
    print(f"\nthe job threw away {thrown_away} steps ({truth}); the sidecar booked {booked}")
    assert booked is not None and abs(booked - thrown_away) <= 1, (booked, truth)
    assert (got.value(catalog.GOODPUT_ROLLED_BACK.name, **w) or 0) > 0, "the saves after the NaN had made steps durable"
    assert (got.value(catalog.TRAINING_NONFINITE.name, value="loss", **w) or 0) >= 1


def test_a_noisy_spike_that_dips_under_the_bound_is_never_taken_for_the_new_normal() -> None:
    """A loss around 1 that jumps to around 2 for good, one reading in ten of them back at 1: the baseline stays the
    loss before the jump, so the spike reads as one to its end; ten calm readings in a row end it."""
    rng = np.random.default_rng(0)
    baseline = LossBaseline()
    for _ in range(catalog.LOSS_BASELINE_STEPS):
        baseline.deviation(1.0 + 0.01 * rng.standard_normal())
    spiked = [baseline.deviation((1.0 if n % 10 == 9 else 2.0) + 0.01 * rng.standard_normal()) for n in range(1000)]
    assert all(d is not None for d in spiked)
    assert sum(d > catalog.LOSS_SPIKE_DEVIATION for d in spiked if d is not None) == 900, "each 2 read as a spike"
    calm = [baseline.deviation(1.0 + 0.01 * rng.standard_normal()) for _ in range(20)]
    assert all(d is not None and abs(d) < catalog.LOSS_SPIKE_DEVIATION for d in calm)
