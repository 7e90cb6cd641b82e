"""A small decoder-only transformer trained data-parallel, split into separately timed programs.

The real workload of ``tpuscope workload``. A TPU job runs a training step as one program, so its phases cannot
be timed apart from the host. To report honest ``compute`` and ``sync`` phases, this trainer also compiles the
step as three programs that each do one kind of work:

* ``grads``: forward and backward on each device's shard of the batch, no cross-device communication;
* ``all_reduce``: the gradient all-reduce (``lax.pmean`` over ``"data"``) alone;
* ``apply``: the optax (adam) update on each device from its copy of the mean gradient, no communication.

``fused_step`` is the same step as one program, to compare with the split timings. Pure JAX and optax (no flax):
parameters are a dict pytree.

Every public method that runs a program blocks until its result is ready: that makes host timings mean something,
and with many forced host-platform (CPU) devices, dispatching many steps of programs with collectives without
waiting can deadlock XLA's CPU collectives (it aborts after 40 s).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tpuscope.tracing.jax_costs import program_flops

AXIS = "data"  # the mesh axis the batch is split over

# jax's PartitionSpec, lax.pmean, block_until_ready and ShapeDtypeStruct are not annotated, so mypy --strict
# flags every call: they are called through the few typed names below, each with one ignore.
REPLICATED = P()  # type: ignore[no-untyped-call]
PROGRAMS = ("grads", "all_reduce", "apply", "fused")
SHARDED = P(AXIS)  # type: ignore[no-untyped-call]

_MASKED = -1e30  # the score of a masked (future) position: finite, so softmax and its gradient never see inf - inf

Params = dict[str, Any]  # the parameter pytree; see init_params for its layout
T = TypeVar("T")


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    seq_len: int = 64  # the default sequence length; batches of another length work (and recompile)
    batch_per_device: int = 4
    learning_rate: float = 3e-3

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads or self.d_model % 2:
            raise ValueError(f"d_model={self.d_model} must be even and divisible by n_heads={self.n_heads}")


class TrainState(NamedTuple):
    """Parameters and optimizer state, replicated on every device."""

    params: Any
    opt_state: Any


# --- The model: pure functions of a parameter pytree -------------------------------------------------------------


def init_params(config: ModelConfig, key: jax.Array) -> Params:
    """GPT-2 style initialization: N(0, 0.02), residual projections scaled down by depth."""
    d, f = config.d_model, config.d_ff
    residual_std = 0.02 / math.sqrt(2 * config.n_layers)  # keeps the residual stream's variance flat with depth
    keys = iter(jax.random.split(key, 2 + 4 * config.n_layers))

    def normal(shape: tuple[int, ...], std: float = 0.02) -> jax.Array:
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    def layer() -> dict[str, jax.Array]:
        return {
            "ln1_scale": jnp.ones((d,), jnp.float32),
            "ln1_bias": jnp.zeros((d,), jnp.float32),
            "qkv": normal((d, 3 * d)),
            "attn_out": normal((d, d), residual_std),
            "ln2_scale": jnp.ones((d,), jnp.float32),
            "ln2_bias": jnp.zeros((d,), jnp.float32),
            "ff_in": normal((d, f)),
            "ff_in_bias": jnp.zeros((f,), jnp.float32),
            "ff_out": normal((f, d), residual_std),
            "ff_out_bias": jnp.zeros((d,), jnp.float32),
        }

    return {
        "embed": normal((config.vocab, d)),
        "layers": [layer() for _ in range(config.n_layers)],
        "ln_final_scale": jnp.ones((d,), jnp.float32),
        "ln_final_bias": jnp.zeros((d,), jnp.float32),
        "unembed": normal((d, config.vocab)),
    }


def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale + bias


def _positions(length: int, d: int) -> jax.Array:
    """Sinusoidal position encodings: no parameters, so any sequence length works with the same weights."""
    pos = jnp.arange(length, dtype=jnp.float32)[:, None]
    freq = jnp.exp(-math.log(10000.0) * jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    angles = pos * freq  # (length, d/2)
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(length, d)


def _attention(p: Mapping[str, jax.Array], x: jax.Array, n_heads: int) -> jax.Array:
    """Causal multi-head self-attention over x of shape (batch, length, d)."""
    b, length, d = x.shape
    head_dim = d // n_heads
    q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
    q, k, v = (t.reshape(b, length, n_heads, head_dim) for t in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    scores = jnp.where(causal, scores, _MASKED)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    return out.reshape(b, length, d) @ p["attn_out"]


def _block(p: Mapping[str, jax.Array], x: jax.Array, n_heads: int) -> jax.Array:
    """A pre-LayerNorm transformer block."""
    x = x + _attention(p, _layer_norm(x, p["ln1_scale"], p["ln1_bias"]), n_heads)
    h = jax.nn.gelu(_layer_norm(x, p["ln2_scale"], p["ln2_bias"]) @ p["ff_in"] + p["ff_in_bias"])
    return x + h @ p["ff_out"] + p["ff_out_bias"]


def logits_fn(params: Params, tokens: jax.Array, config: ModelConfig) -> jax.Array:
    """Next-token logits of shape (batch, length, vocab) for int tokens of shape (batch, length)."""
    embed: jax.Array = params["embed"]
    unembed: jax.Array = params["unembed"]
    x = embed[tokens] + _positions(tokens.shape[1], config.d_model)
    for layer in params["layers"]:
        x = _block(layer, x, config.n_heads)
    return _layer_norm(x, params["ln_final_scale"], params["ln_final_bias"]) @ unembed


def loss_fn(params: Params, tokens: jax.Array, config: ModelConfig) -> jax.Array:
    """Mean next-token cross-entropy: position t predicts token t+1."""
    logits = logits_fn(params, tokens[:, :-1], config)
    losses: jax.Array = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
    return losses.mean()


# --- The trainer: the step as separately compiled programs ------------------------------------------------------


class DataParallelTrainer:
    """Data-parallel training over ``devices`` (all local devices by default) on a 1-D ``"data"`` mesh:
    ``grads`` -> ``all_reduce`` -> ``apply`` is one step as three programs, ``fused_step`` the same as one. Each
    program is jitted once here, so repeated calls with the same shapes hit the jit cache."""

    def __init__(
        self,
        config: ModelConfig = ModelConfig(),
        devices: Sequence[jax.Device] | None = None,
        seed: int = 0,
        straggling: bool = False,
    ):
        """``straggling``: the job has a straggler. Its fused program then takes each device's count of extra
        gradients of its shard (:meth:`set_extra_work`, 0 until then): a loop inside the program, so the wait
        the straggler causes its peers is at the collective, where a slow chip's would be. Every process of
        the job must say so, since they all run one program."""
        self.config = config
        self.seed = seed
        self.mesh = Mesh(np.array(list(devices) if devices is not None else jax.local_devices()), (AXIS,))
        self.n_devices = self.mesh.size
        self.global_batch = config.batch_per_device * self.n_devices
        # The rows this process feeds: all of them alone, its devices' share in a job of several (jax.distributed).
        self.local_batch = config.batch_per_device * len(self.mesh.local_devices)
        self.optimizer = optax.adam(config.learning_rate)
        self._replicated = NamedSharding(self.mesh, REPLICATED)
        self._batch_sharding = NamedSharding(self.mesh, SHARDED)
        self._init_state = jax.jit(self._make_init_state(), out_shardings=self._replicated)
        self._grads = jax.jit(self._make_grads())
        self._all_reduce = jax.jit(self._make_all_reduce())
        self._apply = jax.jit(self._make_apply())
        self._fused_step = jax.jit(self._make_fused_step(straggling))
        # What programs() reports for the fused step: the plain one. XLA's cost analysis counts a loop's body once
        # whatever its trip count, so the straggling program would report an extra gradient on every worker,
        # and a straggler's extra work is no model work anyway.
        self._plain_fused_step = jax.jit(self._make_fused_step(False)) if straggling else self._fused_step
        # The fused step's extra input where the job has a straggler: each device's count of extra gradients.
        self._extra_work = self._per_device(0) if straggling else None
        # Each device's factor on its gradients before the all-reduce: 1, NaN where the `nan` fault strikes.
        self._gradient_scale = self._per_device(1.0)

    # Each _make_* builds the function that gets jitted; its inner function's name is the ``fun_name`` jax reports
    # in its compile events and in profiles.
    #
    # grads, apply and fused_step use check_vma=False. With the check on, shard_map types the replicated
    # parameters as device-invariant, and differentiating them against a per-device loss inserts an implicit psum
    # into the backward pass: grads would communicate (and return the sum over devices, not each device's own
    # gradients), and fused_step's pmean would see already-summed gradients. apply also needs it to declare its
    # result replicated (out_specs P()), which holds because every device applies the same mean.
    #
    # Nothing is donated: callers may run the split and the fused step from one state (the tests do), and at this
    # size the extra copy of the state costs nothing worth measuring.

    def _make_init_state(self) -> Callable[[jax.Array], TrainState]:
        config, optimizer = self.config, self.optimizer

        def init_state(key: jax.Array) -> TrainState:
            params = init_params(config, key)
            return TrainState(params, optimizer.init(params))

        return init_state

    def _make_grads(self) -> Callable[[TrainState, jax.Array, jax.Array], tuple[Any, jax.Array, jax.Array]]:
        config = self.config

        def local_grads(params: Any, shard: jax.Array, scale: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
            loss, grads = jax.value_and_grad(loss_fn)(params, shard, config)
            grads = jax.tree.map(lambda g: g * scale[0], grads)  # 1, or NaN where a fault poisons this device
            norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
            # A leading axis of size 1 per device: shard_map concatenates them into the device axis.
            return jax.tree.map(lambda g: g[None], grads), loss[None], norm[None]

        sharded = jax.shard_map(
            local_grads,
            mesh=self.mesh,
            in_specs=(REPLICATED, SHARDED, SHARDED),
            out_specs=(SHARDED, SHARDED, SHARDED),
            check_vma=False,
        )

        def grads(state: TrainState, batch: jax.Array, scale: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
            return sharded(state.params, batch, scale)

        return grads

    def _make_all_reduce(self) -> Callable[[Any], Any]:
        sharded = jax.shard_map(_mean_over_devices, mesh=self.mesh, in_specs=SHARDED, out_specs=SHARDED)

        def all_reduce(per_shard_grads: Any) -> Any:
            return sharded(per_shard_grads)

        return all_reduce

    def _make_apply(self) -> Callable[[TrainState, Any], TrainState]:
        optimizer = self.optimizer

        def local_apply(state: TrainState, reduced: Any) -> TrainState:
            mean_grads = jax.tree.map(lambda g: g[0], reduced)  # this device's copy of the mean
            updates, opt_state = optimizer.update(mean_grads, state.opt_state, state.params)
            return TrainState(optax.apply_updates(state.params, updates), opt_state)

        sharded = jax.shard_map(
            local_apply, mesh=self.mesh, in_specs=(REPLICATED, SHARDED), out_specs=REPLICATED, check_vma=False
        )

        def apply(state: TrainState, reduced_grads: Any) -> TrainState:
            return sharded(state, reduced_grads)

        return apply

    def _make_fused_step(self, straggling: bool) -> Callable[..., tuple[TrainState, jax.Array]]:
        config, optimizer = self.config, self.optimizer

        def local_step(state: TrainState, shard: jax.Array, *extra: jax.Array) -> tuple[TrainState, jax.Array]:
            loss, grads = jax.value_and_grad(loss_fn)(state.params, shard, config)
            if extra:
                loss = loss + 0.0 * _extra_gradients(state.params, shard, extra[0][0], config)
            grads, loss = _mean_over_devices((grads, loss))
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            return TrainState(optax.apply_updates(state.params, updates), opt_state), loss

        sharded = jax.shard_map(
            local_step,
            mesh=self.mesh,
            in_specs=(REPLICATED, SHARDED, SHARDED) if straggling else (REPLICATED, SHARDED),
            out_specs=(REPLICATED, REPLICATED),
            check_vma=False,
        )

        def fused_step(state: TrainState, batch: jax.Array, *extra_work: jax.Array) -> tuple[TrainState, jax.Array]:
            return sharded(state, batch, *extra_work)

        return fused_step

    # --- Public API: each call runs one program and blocks until its result is on the devices --------------------

    def init_state(self) -> TrainState:
        """Fresh parameters and adam state, replicated on the mesh."""
        state: TrainState = self._init_state(jax.random.key(self.seed))
        return _ready(state)

    def put_batch(self, tokens: np.ndarray) -> jax.Array:
        """Host to device: int32 tokens of shape (local_batch, L), split over ``"data"`` on axis 0. Alone, that is
        the whole global batch; in a job of several processes each gives its own rows, for its own devices, and
        the global batch is theirs in process order."""
        tokens = np.asarray(tokens, dtype=np.int32)
        if tokens.ndim != 2 or tokens.shape[0] != self.local_batch or tokens.shape[1] < 2:
            raise ValueError(f"expected tokens of shape ({self.local_batch}, L >= 2), got {tokens.shape}")
        return self._from_this_process(tokens)

    def _from_this_process(self, rows: np.ndarray) -> jax.Array:
        """The array split over ``"data"`` whose rows on this process's devices are ``rows``: all of it when the
        process runs alone, its own part of the job's otherwise."""
        if len(self.mesh.local_devices) == self.n_devices:
            array: jax.Array = jax.device_put(rows, self._batch_sharding)
        else:
            array = jax.make_array_from_process_local_data(self._batch_sharding, rows)  # type: ignore[no-untyped-call]
        return _ready(array)

    def set_extra_work(self, count: int) -> None:
        """From the next fused step on, this process's devices each compute their shard's gradient ``count``
        more times (a trainer made with ``straggling=True``; the input changes, the program does not)."""
        if self._extra_work is None:
            raise ValueError("extra work needs a trainer made with straggling=True: every process runs its program")
        self._extra_work = self._per_device(count)

    def set_gradient_scale(self, factor: float) -> None:
        """From the next ``grads`` on, this process's devices multiply their gradients by ``factor`` before the
        all-reduce (NaN: a chip that corrupts its values, as silent data corruption does)."""
        self._gradient_scale = self._per_device(factor)

    def _per_device(self, value: float) -> jax.Array:
        """One ``value`` (int32 for an int, float32 for a float) for each device of this process, in the job's
        array of one per device."""
        dtype = np.int32 if isinstance(value, int) else np.float32
        return self._from_this_process(np.full(len(self.mesh.local_devices), value, dtype=dtype))

    def grads(self, state: TrainState, batch: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
        """Per-shard gradients (leading device axis on every leaf), per-shard losses and per-shard gradient norms
        before the all-reduce, each of shape (n_devices,)."""
        out: tuple[Any, jax.Array, jax.Array] = self._grads(state, batch, self._gradient_scale)
        return _ready(out)

    def all_reduce(self, per_shard_grads: Any) -> Any:
        """The mean of the per-shard gradients, on every device (the leading device axis is kept)."""
        return _ready(self._all_reduce(per_shard_grads))

    def apply(self, state: TrainState, reduced_grads: Any) -> TrainState:
        """The adam update from the all-reduced gradients; returns the new (replicated) state."""
        new_state: TrainState = self._apply(state, reduced_grads)
        return _ready(new_state)

    def fused_step(self, state: TrainState, batch: jax.Array) -> tuple[TrainState, jax.Array]:
        """grads + all-reduce + update as one program; returns the new state and the mean loss over shards."""
        out: tuple[TrainState, jax.Array] = self._fused_step(*self._fused_args(state, batch))
        return _ready(out)

    def _fused_args(self, state: TrainState, batch: jax.Array) -> tuple[Any, ...]:
        return (state, batch) if self._extra_work is None else (state, batch, self._extra_work)

    def programs(
        self, state: TrainState, batch: jax.Array, names: Collection[str] = PROGRAMS
    ) -> dict[str, jax.stages.Compiled]:
        """The compiled programs named (of :data:`PROGRAMS`) for this batch's shape, for ``cost_analysis()`` and
        ``memory_analysis()``: lowered from the jitted functions the methods call, so a program that already ran
        comes from the cache and nothing runs or recompiles. Ask only for the programs the step uses (the split
        ones, or ``fused``). A straggling trainer's ``fused`` is the plain step's program (see ``__init__``)."""
        compiled: dict[str, jax.stages.Compiled] = {}
        if {"grads", "all_reduce", "apply"} & set(names):
            compiled["grads"] = self._grads.lower(state, batch, self._gradient_scale).compile()
            per_shard_grads, *_ = _abstract_outputs(compiled["grads"])
            compiled["all_reduce"] = self._all_reduce.lower(per_shard_grads).compile()
            reduced_grads = _abstract_outputs(compiled["all_reduce"])
            compiled["apply"] = self._apply.lower(state, reduced_grads).compile()
        if "fused" in names:
            compiled["fused"] = self._plain_fused_step.lower(state, batch).compile()
        return {name: program for name, program in compiled.items() if name in names}

    def flops_per_step(self, state: TrainState, batch: jax.Array, fused: bool = False) -> float:
        """Model FLOPs of one step over all devices, for this batch's shape (see :meth:`step_flops`)."""
        return self.step_flops(self.programs(state, batch, step_programs(fused)))

    def step_flops(self, programs: Mapping[str, jax.stages.Compiled]) -> float:
        """Model FLOPs of one step over all devices from its compiled programs: ``grads`` + ``apply`` (the
        all-reduce is not model work), or the ``fused`` program's when that is what is given. XLA's cost_analysis
        describes the compiled module, and a shard_map'd program compiles to one SPMD module that every device runs
        on its own shard: its FLOPs are per device, so the total is that times the number of devices."""
        names = ("fused",) if "fused" in programs else ("grads", "apply")
        return sum(program_flops(programs[name]) for name in names) * self.n_devices

    def param_count(self) -> int:
        """The number of trainable parameters (computed from shapes; nothing is allocated)."""
        shapes = jax.eval_shape(lambda: init_params(self.config, jax.random.key(0)))
        return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))


def step_programs(fused: bool) -> tuple[str, ...]:
    """The programs a step runs: the fused one, or the three of the split step."""
    return ("fused",) if fused else ("grads", "all_reduce", "apply")


def _abstract_outputs(compiled: jax.stages.Compiled) -> Any:
    """The compiled program's outputs as ShapeDtypeStructs with their shardings, to lower the next program."""
    return jax.tree.map(
        lambda out, sharding: jax.ShapeDtypeStruct(out.shape, out.dtype, sharding=sharding),  # type: ignore[no-untyped-call]
        compiled.out_info,
        compiled.output_shardings,
    )


def _extra_gradients(params: Params, shard: jax.Array, count: jax.Array, config: ModelConfig) -> jax.Array:
    """A straggler's extra device work, inside the program: ``count`` more gradients of its shard, each of
    another batch (the tokens shifted by the loop's index, so that XLA cannot hoist the work out of the loop),
    summed to one scalar. The caller adds it times 0.0, which XLA keeps (for floats ``x * 0`` is not 0 when
    ``x`` is NaN or infinite), so the work is done and the step's result is unchanged."""

    def one_more(i: jax.Array, total: jax.Array) -> jax.Array:
        shifted = (shard + i) % config.vocab
        grads = jax.grad(loss_fn)(params, shifted, config)
        return total + sum((leaf.sum() for leaf in jax.tree.leaves(grads)), start=jnp.zeros((), jnp.float32))

    return jax.lax.fori_loop(0, count, one_more, jnp.zeros((), jnp.float32))  # type: ignore[no-any-return]


def _mean_over_devices(tree: Any) -> Any:
    """Inside shard_map: every leaf replaced by its mean over the ``"data"`` axis, in one all-reduce of the
    leaves flattened into one vector (as frameworks bucket gradients): one collective a step, where a leaf
    each made dozens, each paying the interconnect's latency (over gloo between processes, most of a step)."""
    flat, unflatten = ravel_pytree(tree)
    return unflatten(jax.lax.pmean(flat, AXIS))  # type: ignore[no-untyped-call]


def _ready(tree: T) -> T:
    """``jax.block_until_ready``, typed: waits until every array in ``tree`` is computed, then returns it."""
    return jax.block_until_ready(tree)  # type: ignore[no-untyped-call, no-any-return]
