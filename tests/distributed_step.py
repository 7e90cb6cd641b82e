"""One process of a real multi-process JAX job on this machine (tests/test_distributed.py runs it): CPU devices,
gloo collectives over loopback, the bench's trainer over every process's devices. Prints the fused step's loss.

    python tests/distributed_step.py PROCESS_ID PROCESSES COORDINATOR_PORT DEVICES_PER_PROCESS
"""

from __future__ import annotations

import os
import sys

process_id, processes, port, devices = (int(arg) for arg in sys.argv[1:5])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"

import jax  # noqa: E402  (after XLA_FLAGS: the CPU backend reads it once)
import numpy as np  # noqa: E402

from tpuscope.workload.model import DataParallelTrainer, ModelConfig  # noqa: E402

if processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=processes, process_id=process_id)
trainer = DataParallelTrainer(ModelConfig(), devices=jax.devices())
# The same global batch however it is split: this process's rows of it.
tokens = np.arange(trainer.global_batch * 33, dtype=np.int32).reshape(trainer.global_batch, 33) % 256
mine = tokens[process_id * trainer.local_batch : (process_id + 1) * trainer.local_batch]
state, loss = trainer.fused_step(trainer.init_state(), trainer.put_batch(mine))
state, loss = trainer.fused_step(state, trainer.put_batch(mine))
print(f"process {process_id} of {jax.process_count()}: {len(jax.devices())} devices, loss {float(loss)!r}", flush=True)
if processes > 1:
    jax.distributed.shutdown()
