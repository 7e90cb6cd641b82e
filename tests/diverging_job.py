"""A job that diverges and rolls back, as a careful training loop does: tests/test_training_values.py runs it.

    python tests/diverging_job.py CHECKPOINT_DIR --socket SIDECAR_SOCKET

A linear model trained with SGD on one CPU device, saved by Orbax every 10 steps (through ``mon.orbax``), its loss
reported each step with ``s.loss``. At step 25 a bad batch (an input of infinities) makes its parameters NaN. The
loop looks at its losses every 20 steps, as a job that logs them does: at step 39 it finds the NaN, restores the
last checkpoint saved before the first NaN (step 19) and trains on to step 60. It prints one JSON line: the
highest step it reached before the restore and the step it restored, whose difference is the truth the sidecar's
rolled-back steps must match.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from tpuscope.tracing import Hooks, Monitor

STEPS, SAVE_EVERY, LOOK_EVERY, BAD_BATCH = 60, 10, 20, 25


@jax.jit
def train_step(w: jax.Array, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    def loss_fn(w: jax.Array) -> jax.Array:
        return jnp.mean((x @ w - y) ** 2)

    loss, grad = jax.value_and_grad(loss_fn)(w)
    return w - 0.01 * grad, loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoints", type=Path)
    parser.add_argument("--socket", required=True)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    truth = rng.standard_normal((16, 1)).astype(np.float32)
    w = jnp.zeros((16, 1))
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    losses: dict[int, float] = {}
    rolled_back: dict[str, int] = {}
    with (
        Monitor("diverging", socket=args.socket, traces=False, hooks=Hooks(profile_period="off")) as mon,
        mon.orbax(ocp.CheckpointManager(args.checkpoints.resolve(), options=options)) as checkpoints,
    ):
        n = 0
        while n < STEPS:
            x = rng.standard_normal((32, 16)).astype(np.float32)
            if n == BAD_BATCH and not rolled_back:
                x[0, 0] = np.inf  # a corrupt record: every parameter is NaN after this step
            with mon.step(n) as s:
                w, loss = train_step(w, x, x @ truth)
                s.loss(loss)
                losses[n] = float(loss)
            if (n + 1) % SAVE_EVERY == 0:
                checkpoints.save(n, args=ocp.args.StandardSave({"w": w}))
            if (n + 1) % LOOK_EVERY == 0 and not all(math.isfinite(v) for v in losses.values()):
                first_nan = min(step for step, v in losses.items() if not math.isfinite(v))
                good = max(step for step in checkpoints.all_steps() if step < first_nan)
                w = checkpoints.restore(good, args=ocp.args.StandardRestore({"w": w}))["w"]
                rolled_back = {"highest": n, "restored": good}
                losses = {step: v for step, v in losses.items() if step <= good}
                n = good
            n += 1
    print(json.dumps(rolled_back), flush=True)


if __name__ == "__main__":
    main()
