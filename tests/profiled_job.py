"""A fused data-parallel training job on 8 CPU devices that a Monitor profiles: tests/test_profiles.py runs it.

    python tests/profiled_job.py STEPS PERIOD --socket SIDECAR_SOCKET [--captures N] [--user-trace-at N ...]
        [--user-traces-during-captures N] [--workload NAME] [--straggle-jitter FIRST]

One jitted step (forward, backward, update) over a batch sharded across the devices, the parameters
replicated: XLA inserts the gradients' all-reduce inside the program, as in any data-parallel job. With
``--straggle-jitter`` one device does 0 to 80 extra matmul rounds a step, in a cycle of 5 steps, before the
all-reduce (a shard_map'd step whose trip count is an input): its peers' wait there varies by half or more from one
step to the next. It prints one JSON line: the profiles the Monitor sent, the captures it counted, each capture's steps
(begun inside its session, and whether annotated), and what each of the user's own traces left on disk.
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax
import jax.numpy as jnp
import msgspec
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tpuscope import events
from tpuscope.bench.perf import ProfileSink
from tpuscope.tracing import Hooks, Monitor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("period")
    parser.add_argument("--socket", required=True, help="the sidecar's: it parses the captures")
    # Step on past STEPS (up to 20 times as many) until this many captures have come back on a step: the sidecar
    # answers each a second or so after its steps, and a job that stops first never hears of it; the answer is
    # counted at once, and carried by the next step's event.
    parser.add_argument("--captures", type=int, default=0)
    parser.add_argument("--user-trace-at", type=int, action="append", default=[])
    # The user starts a trace at a step while a capture of the Monitor's is running, this many times.
    parser.add_argument("--user-traces-during-captures", type=int, default=0)
    parser.add_argument("--workload", default="profiled")
    parser.add_argument("--straggle-jitter", type=int, default=None, metavar="FIRST")
    args = parser.parse_args()

    mesh = Mesh(jax.devices(), ("data",))
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    key = jax.random.PRNGKey(0)
    params = {
        "w1": jax.device_put(jax.random.normal(key, (256, 512)) * 0.02, replicated),
        "w2": jax.device_put(jax.random.normal(key, (512, 256)) * 0.02, replicated),
    }
    batch = jax.device_put(jnp.ones((8 * 64, 256)), sharded)

    def loss(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - x) ** 2)

    @jax.jit
    def step(p: dict[str, jax.Array], x: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
        value, grads = jax.value_and_grad(loss)(p, x)
        return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), value

    if args.straggle_jitter is not None:
        step = jittery_step(mesh, loss, args.straggle_jitter)

    recorder = ProfileSink()
    user_traces: list[dict[str, object]] = []
    monitor = Monitor(
        args.workload, socket=args.socket, sinks=[recorder], traces=False, hooks=Hooks(profile_period=args.period)
    )
    during = args.user_traces_during_captures
    # By the step that asked for each capture: [step, annotated] for each step begun inside its session. Read inside
    # the step, after the profiler's step_started: the session may start between a look before it and the step.
    sessions: dict[int, list[tuple[int, bool]]] = {}
    for n in range(20 * args.steps):
        profiler = monitor._profiler  # a test may look inside: is a session of ours running?
        if n >= args.steps and (profiler is None or len(recorder.profiles) >= args.captures):
            break
        capture = profiler._capture if profiler is not None else None
        capturing = capture is not None and capture.session is not None
        if n in args.user_trace_at or (capturing and during > 0):
            during -= capturing
            directory = tempfile.mkdtemp(prefix="user-trace-")
            try:
                with jax.profiler.trace(directory), monitor.step(n):
                    params, value = step(params, batch)
                    float(value)
                files = [str(f) for f in Path(directory).rglob("*.xplane.pb")]
                user_traces.append({"step": n, "ok": True, "files": files, "during_capture": capturing})
            except Exception as e:
                user_traces.append({"step": n, "ok": False, "error": f"{type(e).__name__}: {e}"})
            continue
        with monitor.step(n) as timer:
            capture = profiler._capture if profiler is not None else None
            if capture is not None and capture.begun > len(steps := sessions.setdefault(capture.first, [])):
                steps.append((n, timer._annotation is not None))  # its session counted this step as begun
            params, value = step(params, batch)
            float(value)  # waits: the step ends when its work does
    monitor.close()
    # Printed at exit, once the interpreter has waited for the stops under way: each trace is in the spool by then.
    atexit.register(report, monitor, recorder, sessions, user_traces)


def report(monitor: Monitor, recorder: ProfileSink, sessions: dict[int, Any], user_traces: list[Any]) -> None:
    profiler = monitor._profiler
    print(
        json.dumps(
            {
                "profiles": msgspec.to_builtins(recorder.profiles),  # each a list, as its fields
                "fields": list(events.DeviceProfile.__struct_fields__),
                "captures": profiler.captures if profiler is not None else None,
                "handed_over": profiler.handed_over if profiler is not None else None,
                "every": profiler.every if profiler is not None else None,
                "sessions": {first: steps for first, steps in sessions.items() if steps},
                "user_traces": user_traces,
            }
        )
    )
    sys.stdout.flush()


STRAGGLER = 5  # the device that does the extra work
# Its rounds of extra work at each step, in a cycle of 5 (as a job whose batches vary in cost does): any 5 steps in a
# row, as a capture measures, hold one heavy step, one middling and three with none.
EXTRA_ROUNDS = (0, 80, 0, 0, 20)


def jittery_step(mesh: Mesh, loss: Any, first: int) -> Any:
    """The same step, but the straggler's device first does rounds of the forward's matmuls (:data:`EXTRA_ROUNDS`,
    from its ``first``): a loop inside the program, so its peers wait for it at the all-reduce."""
    spec, trips_sharding = P("data"), NamedSharding(mesh, P("data"))
    steps = itertools.count(first)

    def local(p: dict[str, jax.Array], x: jax.Array, trips: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
        value, grads = jax.value_and_grad(loss)(p, x)
        busy = jax.lax.fori_loop(0, trips[0], lambda _, a: jnp.tanh(a @ p["w1"]) @ p["w2"], x)
        grads = jax.lax.pmean(jax.tree.map(lambda g: g + 0 * jnp.mean(busy), grads), "data")
        return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), jax.lax.pmean(value, "data")

    sharded = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(P(), spec, spec), out_specs=(P(), P()), check_vma=False)
    )

    def step(p: dict[str, jax.Array], x: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
        trips = np.zeros(mesh.size, dtype=np.int32)
        trips[STRAGGLER] = EXTRA_ROUNDS[next(steps) % len(EXTRA_ROUNDS)]
        result: tuple[dict[str, jax.Array], jax.Array] = sharded(p, x, jax.device_put(trips, trips_sharding))
        return result

    return step


if __name__ == "__main__":
    main()
