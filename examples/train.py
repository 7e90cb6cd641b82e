"""An MLP trained with optax.adam on synthetic data: one jitted step, Orbax checkpoints saved asynchronously.

The same loop is in two files: train_plain.py has no tpuscope, train.py is instrumented (diff the two).
Set TRAIN_STEPS (500), CHECKPOINT_EVERY (100) and CHECKPOINT_DIR (/tmp/mlp-example/checkpoints) to change
them; a second run resumes from the last checkpoint in CHECKPOINT_DIR. README: "Instrument a training loop".
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from tpuscope.tracing import Monitor

TRAIN_STEPS = int(os.environ.get("TRAIN_STEPS", "500"))
CHECKPOINT_EVERY = int(os.environ.get("CHECKPOINT_EVERY", "100"))
CHECKPOINT_DIR = Path(os.environ.get("CHECKPOINT_DIR", "/tmp/mlp-example/checkpoints")).resolve()
BATCH, FEATURES, HIDDEN, CLASSES = 128, 32, 256, 10

Params = list[tuple[jax.Array, jax.Array]]  # (weights, bias) of each layer
optimizer = optax.adam(1e-3)


def init_params(key: jax.Array, sizes: tuple[int, ...] = (FEATURES, HIDDEN, HIDDEN, CLASSES)) -> Params:
    keys = jax.random.split(key, len(sizes) - 1)
    return [
        (jax.random.normal(k, (n_in, n_out)) * jnp.sqrt(2 / n_in), jnp.zeros(n_out))
        for k, n_in, n_out in zip(keys, sizes[:-1], sizes[1:], strict=True)
    ]


def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    per_example: jax.Array = optax.softmax_cross_entropy_with_integer_labels(x @ w + b, y)
    return per_example.mean()


@jax.jit
def train_step(
    params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array
) -> tuple[Params, optax.OptState, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def synthetic_dataset(size: int = 8192, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and labels an MLP can learn: each label is the largest output of a fixed random linear map."""
    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((size, FEATURES), dtype=np.float32)
    labels = (inputs @ rng.standard_normal((FEATURES, CLASSES), dtype=np.float32)).argmax(axis=1)
    return inputs, labels.astype(np.int32)


def batch(inputs: np.ndarray, labels: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    start = n * BATCH % (len(inputs) - BATCH)
    return inputs[start : start + BATCH], labels[start : start + BATCH]


def main() -> None:
    inputs, labels = synthetic_dataset()
    params = init_params(jax.random.key(0))
    opt_state = optimizer.init(params)
    losses: list[float] = []
    options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=True)
    with Monitor("mlp") as mon, mon.orbax(ocp.CheckpointManager(CHECKPOINT_DIR, options=options)) as checkpoints:
        start = 0
        if (latest := checkpoints.latest_step()) is not None:  # resume where the last run saved
            state = checkpoints.restore(latest, args=ocp.args.StandardRestore([params, opt_state]))
            params, opt_state, start = state[0], state[1], latest + 1
        mon.flops_of(train_step, params, opt_state, *batch(inputs, labels, start))
        for n in range(start, TRAIN_STEPS):
            with mon.step(n) as s:
                x, y = jax.device_put(batch(inputs, labels, n))
                with s.phase("compute"):
                    params, opt_state, loss = train_step(params, opt_state, x, y)
                    s.loss(loss)  # pages on a NaN; never waits: read once the device has computed it
                    losses.append(float(loss))  # the loss curve; float() waits for the step's result
            if (n + 1) % CHECKPOINT_EVERY == 0:  # async: the save goes on while the next steps run
                checkpoints.save(n, args=ocp.args.StandardSave([params, opt_state]))
                print(f"step {n + 1}: loss {np.mean(losses[-CHECKPOINT_EVERY:]):.4f}", flush=True)


if __name__ == "__main__":
    main()
