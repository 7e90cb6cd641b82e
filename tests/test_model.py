"""The data-parallel transformer of ``tpuscope workload``, on 8 forced CPU devices (real JAX, no mocks)."""

from __future__ import annotations

import os
import time

# Before jax is imported: XLA reads the flag once, when the CPU backend starts. tests/conftest.py sets it too,
# for the case where another test module imports jax first. Appended, so other XLA flags a developer set survive.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from tpuscope.tracing.jax_costs import program_flops
from tpuscope.workload.model import DataParallelTrainer, ModelConfig, TrainState

N_DEVICES = 8


@pytest.fixture(scope="module")
def trainer() -> DataParallelTrainer:
    # The CPU devices explicitly: on a machine with an accelerator, jax's default devices are not the 8 forced ones.
    devices = jax.devices("cpu")
    if len(devices) != N_DEVICES:
        pytest.fail(
            f"{len(devices)} CPU devices: jax started before XLA_FLAGS=--xla_force_host_platform_device_count=8 "
            "was set (tests/conftest.py must set it)"
        )
    return DataParallelTrainer(ModelConfig(), devices=devices)


@pytest.fixture(scope="module")
def state(trainer: DataParallelTrainer) -> TrainState:
    return trainer.init_state()


def tokens(trainer: DataParallelTrainer, length: int | None = None, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (trainer.global_batch, length or trainer.config.seq_len)
    return rng.integers(0, trainer.config.vocab, shape, dtype=np.int32)


def split_step(trainer: DataParallelTrainer, state: TrainState, batch: jax.Array) -> tuple[TrainState, jax.Array]:
    per_shard, losses, _ = trainer.grads(state, batch)
    return trainer.apply(state, trainer.all_reduce(per_shard)), losses


@contextmanager
def backend_compiles() -> Iterator[list[str]]:
    """The ``fun_name`` of every XLA compile inside the block, from jax's own monitoring events."""
    names: list[str] = []

    def listener(event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            names.append(str(kwargs.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def assert_trees_close(a: Any, b: Any, rtol: float, atol: float) -> None:
    assert str(jax.tree.structure(a)) == str(jax.tree.structure(b))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def test_trains_on_eight_devices(trainer: DataParallelTrainer) -> None:
    assert trainer.n_devices == N_DEVICES
    assert len(set(trainer.mesh.devices.flat)) == N_DEVICES
    assert trainer.mesh.axis_names == ("data",)
    assert trainer.global_batch == trainer.config.batch_per_device * N_DEVICES


def test_put_batch_shards_the_batch_over_devices(trainer: DataParallelTrainer) -> None:
    host = tokens(trainer)
    batch = trainer.put_batch(host)
    assert batch.dtype == np.int32
    assert batch.shape == host.shape
    shards = sorted(batch.addressable_shards, key=lambda s: s.index[0].start or 0)
    assert len(shards) == N_DEVICES
    assert {s.data.shape for s in shards} == {(trainer.config.batch_per_device, trainer.config.seq_len)}
    np.testing.assert_array_equal(np.asarray(batch), host)
    with pytest.raises(ValueError):
        trainer.put_batch(host[:-1])


def test_split_step_matches_fused_step(trainer: DataParallelTrainer, state: TrainState) -> None:
    batch = trainer.put_batch(tokens(trainer))
    split_state, losses = split_step(trainer, state, batch)
    fused_state, fused_loss = trainer.fused_step(state, batch)

    assert losses.shape == (N_DEVICES,)
    assert fused_loss.shape == ()
    np.testing.assert_allclose(float(fused_loss), float(np.mean(losses)), rtol=1e-5)
    assert_trees_close(split_state.params, fused_state.params, rtol=1e-4, atol=1e-6)
    assert_trees_close(split_state.opt_state, fused_state.opt_state, rtol=1e-4, atol=1e-7)
    # The step moved the parameters, so the comparison above is not between two unchanged copies of ``state``.
    before, after = jax.tree.leaves(state.params), jax.tree.leaves(split_state.params)
    assert all(not np.allclose(a, b) for a, b in zip(before, after, strict=True))
    # The new state stays replicated on the mesh, ready for the next step.
    for leaf in jax.tree.leaves(split_state.params):
        assert leaf.sharding.is_fully_replicated
        assert len(leaf.sharding.device_set) == N_DEVICES


def test_loss_decreases_over_split_steps(trainer: DataParallelTrainer, state: TrainState) -> None:
    batch = trainer.put_batch(tokens(trainer, seed=1))  # one fixed batch, repeated: the model can memorize it
    history = []
    for _ in range(30):
        state, losses = split_step(trainer, state, batch)
        history.append(float(np.mean(losses)))
    assert all(np.isfinite(history))
    assert history[0] == pytest.approx(np.log(trainer.config.vocab), rel=0.05)  # uniform guess at the start
    assert history[-1] < history[0] - 0.5, history  # 5.56 -> 4.17 on CPU: memorizing, not noise
    assert np.mean(history[-5:]) < np.mean(history[:5]), history


def test_grads_differ_per_shard_and_all_reduce_averages_them(trainer: DataParallelTrainer, state: TrainState) -> None:
    batch = trainer.put_batch(tokens(trainer, seed=2))
    per_shard, losses, _ = trainer.grads(state, batch)
    reduced = trainer.all_reduce(per_shard)

    for shard_leaf, mean_leaf, param in zip(
        jax.tree.leaves(per_shard), jax.tree.leaves(reduced), jax.tree.leaves(state.params), strict=True
    ):
        shard_grads, mean_grads = np.asarray(shard_leaf), np.asarray(mean_leaf)
        assert shard_grads.shape == mean_grads.shape == (N_DEVICES, *param.shape)
        assert isinstance(shard_leaf.sharding, NamedSharding)
        assert shard_leaf.sharding.spec[0] == "data"
        # Every device holds the same mean ...
        for device in range(1, N_DEVICES):
            np.testing.assert_array_equal(mean_grads[device], mean_grads[0])
        # ... which is the mean of the per-shard gradients.
        np.testing.assert_allclose(mean_grads[0], shard_grads.mean(axis=0), rtol=1e-5, atol=1e-8)
    # Different data on each device gives different gradients: grads did not already reduce them.
    embed = np.asarray(per_shard["embed"])
    assert not np.allclose(embed[0], embed[1])
    assert len(set(np.asarray(losses).tolist())) > 1


def test_only_all_reduce_and_fused_communicate(trainer: DataParallelTrainer, state: TrainState) -> None:
    programs = trainer.programs(state, trainer.put_batch(tokens(trainer)))
    # The optimized HLO of each program: a cross-device reduction shows up as an all-reduce instruction.
    collectives = {name: "all-reduce" in (program.as_text() or "") for name, program in programs.items()}
    assert collectives == {"grads": False, "all_reduce": True, "apply": False, "fused": True}


def test_programs_report_flops(trainer: DataParallelTrainer, state: TrainState) -> None:
    batch = trainer.put_batch(tokens(trainer))
    programs = trainer.programs(state, batch)
    assert set(programs) == {"grads", "all_reduce", "apply", "fused"}
    assert all(isinstance(p, jax.stages.Compiled) for p in programs.values())
    assert program_flops(programs["grads"]) > 0
    assert program_flops(programs["fused"]) > 0
    assert programs["grads"].memory_analysis() is not None

    # cost_analysis counts one device's share: the grads program of 8 devices is close to the textbook
    # 6 * params * tokens-per-device (forward + backward matmuls), plus attention, and not 8 times that.
    tokens_per_device = trainer.config.batch_per_device * (trainer.config.seq_len - 1)
    textbook = 6 * trainer.param_count() * tokens_per_device
    assert 0.8 * textbook < program_flops(programs["grads"]) < 1.5 * textbook

    total = trainer.flops_per_step(state, batch)
    per_device = program_flops(programs["grads"]) + program_flops(programs["apply"])
    assert total == pytest.approx(per_device * N_DEVICES)


def test_programs_reuse_the_jit_cache(trainer: DataParallelTrainer, state: TrainState) -> None:
    """programs() lowers the very jitted functions the methods run, so it compiles nothing new."""
    batch = trainer.put_batch(tokens(trainer))
    split_step(trainer, state, batch)
    trainer.fused_step(state, batch)
    with backend_compiles() as compiled:
        trainer.programs(state, batch)
        split_step(trainer, state, batch)
    assert compiled == []


def test_other_sequence_length_recompiles_and_trains(trainer: DataParallelTrainer, state: TrainState) -> None:
    length = trainer.config.seq_len // 2 + 1
    with backend_compiles() as compiled:
        batch = trainer.put_batch(tokens(trainer, length=length, seed=3))
        new_state, losses = split_step(trainer, state, batch)
    assert batch.shape == (trainer.global_batch, length)
    # grads compiles anew; all_reduce and apply may not: their inputs (gradients, state) do not depend on L.
    assert "jit(grads)" in compiled, compiled
    assert losses.shape == (N_DEVICES,)
    assert np.all(np.isfinite(np.asarray(losses)))
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in jax.tree.leaves(new_state.params))
    _, fused_loss = trainer.fused_step(state, batch)
    assert np.isfinite(float(fused_loss))


def test_param_count_matches_the_state(trainer: DataParallelTrainer, state: TrainState) -> None:
    assert trainer.param_count() == sum(leaf.size for leaf in jax.tree.leaves(state.params))
    c = trainer.config
    per_layer = 4 * c.d_model * c.d_model + 2 * c.d_model * c.d_ff + c.d_ff + 5 * c.d_model
    assert trainer.param_count() == 2 * c.vocab * c.d_model + c.n_layers * per_layer + 2 * c.d_model


def test_a_straggling_program_gives_the_same_step_and_its_extra_work_is_real(
    trainer: DataParallelTrainer, state: TrainState
) -> None:
    """The straggler's program (issue 24) computes each shard's gradient again inside a loop whose trip count is
    an input: the step's result is the plain program's, bit for bit, and the extra work is done, not optimized
    away (the loop is in the compiled program and the step takes longer with it)."""
    straggling = DataParallelTrainer(ModelConfig(), devices=trainer.mesh.devices.tolist(), straggling=True)
    batch = trainer.put_batch(tokens(trainer))
    plain_state, plain_loss = trainer.fused_step(state, batch)
    for count in (0, 6):
        straggling.set_extra_work(count)
        slow_state, slow_loss = straggling.fused_step(state, batch)
        assert float(slow_loss) == float(plain_loss), count
        assert_trees_close(slow_state.params, plain_state.params, rtol=0, atol=0)
    assert "while" in straggling._fused_step.lower(state, batch, straggling._extra_work).compile().as_text()
    # Its FLOPs are the plain step's: XLA counts a loop's body once whatever its trip count, and extra work is no
    # model work.
    assert straggling.flops_per_step(state, batch, fused=True) == trainer.flops_per_step(state, batch, fused=True)

    def best_of(count: int) -> float:
        straggling.set_extra_work(count)
        straggling.fused_step(state, batch)  # the first run with a new input: nothing recompiles, but warm up
        times = []
        for _ in range(5):
            started = time.perf_counter()
            straggling.fused_step(state, batch)
            times.append(time.perf_counter() - started)
        return min(times)

    assert best_of(6) > 2 * best_of(0)
    with pytest.raises(ValueError, match="straggling=True"):
        trainer.set_extra_work(1)
