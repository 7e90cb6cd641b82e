"""The instrumented JAX workload behind ``tpuscope workload``: a small transformer LM, trained data-parallel.

A step, as it is timed:

- io: wait for the next batch from the input pipeline, then copy it to the devices.
- compute: forward and backward on each device's shard (no communication).
- sync: the cross-device gradient all-reduce, as its own program.
- compute: the optimizer update, on each device, from the reduced gradients.

Every program is waited for before the next phase starts: this is what makes
the phases honest, and on 8 CPU devices it is also what keeps XLA's CPU
collectives from deadlocking. In ``--fused`` mode the step is one program, as
a production TPU job runs it: compute and collectives overlap inside it, so the
whole program is reported as compute, sync stays 0, and what the host does
around it is ``other``.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuscope.tracing import Monitor
from tpuscope.workload.faults import FAILING, Faults
from tpuscope.workload.hangs import Hangs

CPU_DEVICES_FLAG = "--xla_force_host_platform_device_count"
# The `spike` fault's factor on the reported loss: far past any noise of a training loss, the bench's late in its run
# too (a loss of a few hundredths that varies by a third from step to step).
SPIKE_FACTOR = 50.0


def ensure_cpu_devices(count: int) -> None:
    """Give JAX ``count`` CPU devices for data-parallel code (harmless on TPU and GPU hosts).

    Must run before jax is imported; a flag the user already set wins.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if CPU_DEVICES_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {CPU_DEVICES_FLAG}={count}".strip()


@dataclass(frozen=True)
class WorkloadOptions:
    steps: int = 200
    fused: bool = False
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    seq_len: int = 64
    batch_per_device: int = 4
    vocab: int = 256
    io_latency: float = 0.005  # seconds for the input pipeline to produce a batch
    checkpoint_every: int = 50
    eval_every: int = 0  # an eval of eval_batches batches after every N steps, marked as custom badput "eval"; 0: none
    eval_batches: int = 4
    async_checkpoint: bool = False
    run_dir: Path = Path("run/bench")
    compile_cache: Path | None = None
    calibrate: bool = False
    report_loss: bool = True  # each step's loss (and in the split step, each process's gradient norm) to s.loss
    faults: Faults = field(default_factory=lambda: Faults({}))


class UnsupportedHere(ValueError):
    """An option that cannot work on this machine; the message says why."""


class InjectedCrash(RuntimeError):
    """The ``crash`` fault."""


class CorruptRecord(ValueError):
    """The ``bad-data`` fault: a record the input pipeline's check refuses (a token outside the vocabulary)."""


class Workload:
    """Builds the model, data, checkpoints and reporting; :meth:`run` trains."""

    def __init__(self, options: WorkloadOptions, monitor: Monitor, log: Callable[[str], None] = print) -> None:
        import jax

        from tpuscope.tracing.jax_costs import accelerator_of, peak_flops_per_second
        from tpuscope.workload.checkpoints import Checkpointer
        from tpuscope.workload.data import TokenPipeline
        from tpuscope.workload.model import DataParallelTrainer, ModelConfig

        self.options = options
        self.monitor = monitor
        self.log = log
        self._stall_at: int | None = None  # the step whose input stalls (fault `stall`)
        self._straggle_from = 0  # the first step this worker straggles at (fault `straggler`)
        self._poison_at: int | None = None  # the step this worker's gradients go NaN at (fault `nan`)
        self._spiking = range(0)  # the steps whose reported loss is spiked (fault `spike`)
        self.report_loss = options.report_loss  # read at each step: the overhead benchmark turns it on and off
        self._fail_at: dict[str, int] = {}  # fault -> the step it ends the run at (the FAILING faults)
        faults = options.faults
        if "nan" in faults.anywhere and options.fused:
            raise UnsupportedHere(
                "--inject nan needs the split step (without --fused): its gradients before the all-reduce are a "
                "program's output there, poisoned on one worker's devices"
            )
        if "spill" in faults:
            raise UnsupportedHere(
                "--inject spill needs an accelerator: XLA on the CPU places nothing in host memory "
                "(compiled.memory_analysis() reports host_* sizes of 0), so there is no spill to show"
                if accelerator_of(jax.devices()[0]) == "cpu"
                else "--inject spill: host offload of activations is not built yet; memory_spill_bytes "
                "reports what XLA places in host memory on its own"
            )
        if options.compile_cache:
            _enable_compile_cache(options.compile_cache)
        monitor.watch_jax_compiles()
        self.devices = jax.devices()  # the job's: in a job of several processes, theirs too
        self.local_devices = jax.local_devices()  # the chips this process drives
        self.accelerator = accelerator_of(self.devices[0])
        self.peak, peak_source = peak_flops_per_second(self.local_devices, options.calibrate)
        # The chips this process drives (its host's): the sidecar's workload_devices, summed over workers.
        monitor.hardware(self.accelerator, len(self.local_devices), self.peak)
        config = ModelConfig(
            vocab=options.vocab,
            d_model=options.d_model,
            n_layers=options.layers,
            n_heads=options.heads,
            d_ff=4 * options.d_model,
            seq_len=options.seq_len,
            batch_per_device=options.batch_per_device,
        )
        # A straggler anywhere in a fused job: every process runs the program that can take extra work.
        straggling = options.fused and "straggler" in faults.anywhere
        self.trainer = DataParallelTrainer(config, self.devices, straggling=straggling)
        log(
            f"model: {self.trainer.param_count():,} parameters on {len(self.devices)} {self.accelerator} devices, "
            f"global batch {self.trainer.global_batch} x {options.seq_len} tokens, "
            f"{'fused' if options.fused else 'split'} step; peak {self.peak / 1e9:.1f} GFLOP/s ({peak_source})"
        )
        self.checkpoints = Checkpointer(
            options.run_dir / "checkpoints",
            monitor,
            options.checkpoint_every,
            options.async_checkpoint,
            fail="ckpt-fail" in faults,
        )
        latency = options.io_latency + (faults.get("slow-io") if "slow-io" in faults else 0.0)
        self.data = TokenPipeline(self.trainer.local_batch, options.vocab, latency=latency)  # this process's rows
        self._flops: dict[int, float] = {}
        self.resumed_from: int | None = None
        self._hangs = Hangs(faults, 0, options.steps, log)  # where the hang faults strike (set again by run)

    def run(self, progress: Callable[[int], None] | None = None, instrumented: Iterator[bool] | None = None) -> None:
        """Train to ``options.steps``, resuming from the latest checkpoint if there is one.

        ``instrumented`` (for the overhead benchmark) says, step by step, whether
        to time the step with the Monitor or run it bare.
        """
        options, faults = self.options, self.options.faults
        state = self.trainer.init_state()
        start = 0
        if (restored := self.checkpoints.restore_latest(state)) is not None:
            state, self.resumed_from = restored
            start = self.resumed_from + 1
            self.monitor.lifecycle("restart", reason="resumed")
            self.log(f"resumed from the checkpoint of step {self.resumed_from} in {self.checkpoints.directory}")
            if start >= options.steps:
                self.log(f"nothing to do: that is past --steps {options.steps}; remove the directory to start over")
        # The step each failing fault strikes at (-1: halfway), in a run that did not resume: the same command
        # run again resumes from the last checkpoint and finishes.
        self._fail_at = {
            name: options.steps // 2 if faults.get(name) < 0 else int(faults.get(name))
            for name in FAILING
            if name in faults and self.resumed_from is None
        }
        self._stall_at = (start + options.steps) // 2 if "stall" in faults else None
        self._straggle_from = start + (options.steps - start) // 3
        if "nan" in faults and self.resumed_from is None:
            self._poison_at = options.steps // 2 if faults.get("nan") < 0 else int(faults.get("nan"))
        if "spike" in faults:
            steps = int(faults.get("spike"))
            self._spiking = range(self._straggle_from, self._straggle_from + steps if steps > 0 else options.steps)
        self._hangs = hangs = Hangs(faults, start, options.steps, self.log)
        for n in range(start, options.steps):
            if n == self._fail_at.get("crash"):
                raise InjectedCrash(f"injected crash at step {n}")
            if n == self._straggle_from and options.fused and "straggler" in faults:
                # Its devices compute each shard's gradient `factor` times, inside the step's one program.
                extra = max(1, round(faults.get("straggler") - 1))
                self.trainer.set_extra_work(extra)
                self.log(f"straggler: from step {n} this worker's devices compute each gradient {extra + 1} times")
            timed = next(instrumented) if instrumented is not None else True
            with self.monitor.step(n) if timed else _bare_step() as step:
                try:
                    state = self._step(step, n, state, self._seq_len(n))
                except Exception as e:  # a failing fault's own error, wrapped so that bench says it was injected
                    if not (injected := [name for name, at in self._fail_at.items() if at == n]):
                        raise
                    raise InjectedCrash(f"injected {', '.join(injected)} at step {n}: {e}") from e
            hangs.between_steps(n, functools.partial(self._evaluate, state))
            if options.eval_every and (n + 1) % options.eval_every == 0:
                with self.monitor.badput("eval"):  # booked as its own badput, not as the time between steps
                    for _ in range(options.eval_batches):
                        self._evaluate(state)
            if self.checkpoints.due(n):
                self.checkpoints.save(n, state)
            if n % 10 == 0:
                self._report_memory()
            if progress:
                progress(n)
        if "slow-save" in faults and start < options.steps:  # the final save, on slow storage
            self.checkpoints.save(options.steps, state, delay=faults.get("slow-save"))

    def _step(self, step: Any, n: int, state: Any, seq_len: int) -> Any:
        """One training step, its phases timed on ``step`` (a StepTimer, or a bare stand-in)."""
        trainer = self.trainer
        faults = self.options.faults
        hangs = self._hangs
        with step.phase("io"):
            hangs.before_input(n)
            if n == self._straggle_from and "blip" in faults:  # one slow batch: its peers wait for it, once
                self.log(f"blip: step {n} waits {faults.get('blip'):g} s for its input")
                time.sleep(faults.get("blip"))
            if n == self._stall_at:  # the input pipeline hangs: no step ends for this long
                self.log(f"stall: no steps for {faults.get('stall'):g} s")
                time.sleep(faults.get("stall"))
            tokens = self.data.next(seq_len)
            if n == self._fail_at.get("bad-data"):  # a corrupt record: a token id past the vocabulary
                tokens = tokens.copy()
                tokens.flat[0] = self.options.vocab + 7
            _check_record(tokens, self.options.vocab)
            batch = trainer.put_batch(tokens)
        if n == self._fail_at.get("oom"):
            with step.phase("compute"):
                _allocate_too_much()
        if n == self._fail_at.get("compile-error"):
            with step.phase("compute"):
                _compile_unsupported()
        local = None  # this process's gradient norm before the all-reduce (the split step's)
        if self.options.fused:
            with step.phase("compute"):
                state, loss = trainer.fused_step(state, batch)
                hangs.slow_compute(n)
        else:
            with step.phase("compute"):
                started = time.perf_counter()
                if n == self._poison_at:  # this worker's chips corrupt one step's gradients
                    self.log(f"nan: step {n}'s gradients on this worker's devices are NaN")
                    trainer.set_gradient_scale(float("nan"))
                grads, loss, local = trainer.grads(state, batch)
                if n == self._poison_at:
                    trainer.set_gradient_scale(1.0)
                if "straggler" in faults and n >= self._straggle_from:  # this worker falls behind its peers
                    time.sleep((faults.get("straggler") - 1) * (time.perf_counter() - started))
                hangs.slow_compute(n)
            with step.phase("sync"):
                grads = trainer.all_reduce(grads)
            with step.phase("compute"):
                state = trainer.apply(state, grads)
        if self.report_loss:
            if n in self._spiking:  # the loss the job reports reads SPIKE_FACTOR times its value (every worker's)
                if n == self._spiking.start:
                    self.log(f"spike: from step {n} the reported loss is {SPIKE_FACTOR:g} times the loss")
                loss = loss * SPIKE_FACTOR
            step.loss(loss, local=local)
        hangs.after_compute(n)
        hangs.in_sync(n, step)
        if seq_len not in self._flops:  # a new shape: its programs were just compiled
            self._analyse(state, batch, seq_len)
        step.flops = self._flops[seq_len]
        return state

    def _evaluate(self, state: Any) -> float:
        """One program of an eval loop (``--eval-every``, and the ``eval`` fault's, unmarked): a batch's loss, as a
        job's eval computes it."""
        batch = self.trainer.put_batch(self.data.next(self.options.seq_len))
        _, loss, _ = self.trainer.grads(state, batch)
        return float(loss.mean())

    def _seq_len(self, n: int) -> int:
        """The batch's sequence length: fixed, or a new one every N steps under the ``recompile`` fault."""
        if "recompile" not in self.options.faults:
            return self.options.seq_len
        every = max(1, int(self.options.faults.get("recompile")))
        shrink = (n // every) % max(1, self.options.seq_len // 2)
        return self.options.seq_len - shrink

    def _analyse(self, state: Any, batch: Any, seq_len: int) -> None:
        """FLOPs and host-memory placement of this shape's programs (already compiled: no recompile)."""
        from tpuscope.workload.model import step_programs

        programs = self.trainer.programs(state, batch, step_programs(self.options.fused))
        for name, compiled in programs.items():
            analysis = compiled.memory_analysis()
            spill = sum(
                getattr(analysis, f"host_{kind}_size_in_bytes", 0) for kind in ("argument", "output", "temp", "alias")
            )
            self.monitor.program_memory(name, spill_bytes=int(spill))
        # This process's devices' share: the sidecars of a job of several add up their workers' FLOPs.
        self._flops[seq_len] = self.trainer.step_flops(programs) * len(self.local_devices) / len(self.devices)

    def _report_memory(self) -> None:
        stats = [(device, device.memory_stats()) for device in self.local_devices]
        if all(s is None for _, s in stats):  # the CPU backend keeps none: report the process instead
            import psutil

            self.monitor.device_memory(
                "host",
                self.accelerator,
                used_bytes=psutil.Process().memory_info().rss,
                limit_bytes=psutil.virtual_memory().total,
                source="process",
            )
            return
        # The device label is the chip's index on the host, as every collector names it (jax.Device.id is the
        # runtime's id: slice-wide on a multi-host TPU slice, docs/metrics.md).
        index = {d.id: n for n, d in enumerate(sorted(self.local_devices, key=lambda d: d.id))}
        for device, s in stats:
            if s:
                self.monitor.device_memory(
                    str(index[device.id]),
                    self.accelerator,
                    used_bytes=int(s.get("bytes_in_use", 0)),
                    limit_bytes=int(s.get("bytes_limit", 0)),
                    peak_bytes=int(s.get("peak_bytes_in_use", 0)),
                )

    def close(self) -> None:
        self.checkpoints.close()
        self.data.close()

    def __enter__(self) -> Workload:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _check_record(tokens: Any, vocab: int) -> None:
    """The input pipeline's check of a batch, as a real one validates what it read."""
    if (largest := int(tokens.max())) >= vocab:
        raise CorruptRecord(f"a record holds token id {largest}, outside the vocabulary of {vocab}")


def _allocate_too_much() -> None:
    """The ``oom`` fault: an allocation XLA refuses, as a batch or model too large for the devices is: 256 TiB,
    more than a 64-bit CPU's address space, which no overcommit setting of the kernel grants."""
    import jax.numpy as jnp

    jnp.zeros((2**46,), jnp.float32).block_until_ready()


def _compile_unsupported() -> None:
    """The ``compile-error`` fault: a program calling a custom call no backend implements, which XLA refuses
    to compile (as a kernel built for another platform, or an op the backend lacks, is)."""
    import jax
    import jax.numpy as jnp

    def unsupported(x: Any) -> Any:
        return jax.ffi.ffi_call("tpuscope_fault_unsupported_op", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)  # type: ignore[no-untyped-call]

    jax.jit(unsupported)(jnp.ones(8))


class _BareStep:
    """Stands in for a StepTimer when the overhead benchmark runs a step uninstrumented."""

    flops = 0.0

    def phase(self, name: str) -> AbstractContextManager[None]:
        return nullcontext()

    def loss(self, loss: Any, *, grad_norm: Any = None, local: Any = None) -> None:
        pass


@contextmanager
def _bare_step() -> Iterator[_BareStep]:
    yield _BareStep()


def _enable_compile_cache(directory: Path) -> None:
    import jax

    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory.resolve()))  # type: ignore[no-untyped-call]
    # Cache every program, however small or quick to compile: the benchmark's are both.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # type: ignore[no-untyped-call]
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)  # type: ignore[no-untyped-call]
