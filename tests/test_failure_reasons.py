"""The mapping from an exception to its failure reason, reason by reason, for the failures this machine cannot
cause for real (a GPU driver, a busy TPU, a maintenance event's metadata) beside those it can
(tests/test_failures.py causes those in the JAX bench); the Monitor's exit path; JAX's cache-miss explanations
read into recompile causes; the SIGTERM handler beside a job's own and beside JAX's preemption notifier."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tpuscope import events, gce_metadata, reasons
from tpuscope.conventions import ALERT_PREFIX, AlertName
from tpuscope.tracing import Hooks, Monitor, Preempted, RecordSink, failure_reason, preemption, read_records
from tpuscope.tracing import failures as classify
from tpuscope.tracing.jax_compiles import recompile_cause


class DataLossError(Exception):
    """tf.data's error for a corrupt record, by its name (tpuscope imports no input pipeline)."""


def marked(exc: BaseException, reason: str) -> BaseException:
    classify.mark(exc, reason)
    return exc


def raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as e:
        return e


def jax_runtime_error(message: str) -> BaseException:
    from jax.errors import JaxRuntimeError

    return JaxRuntimeError(message)


def jax_tracing_error() -> BaseException:
    import jax
    import jax.numpy as jnp

    try:
        jax.jit(lambda x: x if x > 0 else -x)(jnp.ones(()))
    except Exception as e:
        return e
    raise AssertionError("a Python branch on a traced value traced")


CASES = [
    (MemoryError(), "out_of_memory"),
    (RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes."), "out_of_memory"),
    # A restore that ran out of memory is a memory problem first.
    (
        marked(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1 bytes."), "checkpoint_restore"),
        "out_of_memory",
    ),
    (marked(ValueError("DATA_LOSS: CRC-32C checksum verification failed"), "checkpoint_restore"), "checkpoint_restore"),
    (marked(ValueError("bad record"), "data_error"), "data_error"),
    (DataLossError("truncated record"), "data_error"),
    (NotImplementedError("MLIR translation rule for primitive 'foo' not found for platform cpu"), "compile_error"),
    (RuntimeError("Unable to initialize backend 'cuda': FAILED_PRECONDITION: No visible GPU devices."), "runtime_init"),
    (RuntimeError("TPU initialization failed: open(/dev/accel0): Device or resource busy"), "runtime_init"),
    (
        RuntimeError("The TPU is already in use by process with pid 812. Not attempting to load libtpu.so"),
        "runtime_init",
    ),
    (RuntimeError("jaxlib version 0.4.30 is newer than and incompatible with jax version 0.4.20"), "runtime_init"),
    (RuntimeError("CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"), "runtime_init"),
    (Preempted(), "preemption"),
    (Preempted("maintenance"), "maintenance"),
    (RuntimeError("CUDA_ERROR_OUT_OF_MEMORY: out of memory"), "out_of_memory"),
    (
        RuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm."),
        "out_of_memory",
    ),
    # Not every RESOURCE_EXHAUSTED is memory: gRPC says it of quotas; "failed to initialize" is not a runtime.
    (RuntimeError("RESOURCE_EXHAUSTED: Quota exceeded for quota metric 'Read requests'"), "other"),
    (RuntimeError("failed to initialize the optimizer state"), "other"),
    # A device failing the copy of a batch to it is the device's, though it was raised in the io phase.
    (marked(jax_runtime_error("UNAVAILABLE: TPU halted"), "data_error"), "other"),
    (ValueError("loss is NaN at step 1200"), "other"),
    (AssertionError(), "other"),
    # Wrapped on its way up (raise ... from), the cause still names it.
    (raised_from(RuntimeError("step 12 failed"), MemoryError()), "out_of_memory"),
    (
        raised_from(RuntimeError("restore failed"), marked(ValueError("bad bytes"), "checkpoint_restore")),
        "checkpoint_restore",
    ),
]


@pytest.mark.parametrize(("exc", "reason"), CASES, ids=[f"{type(e).__name__}-{r}" for e, r in CASES])
def test_each_exception_maps_to_its_reason(exc: BaseException, reason: str) -> None:
    assert failure_reason(exc) == reason
    assert reason in reasons.FAILURE_VALUES


def test_a_tracing_error_is_a_compile_error_at_the_tracing_stage() -> None:
    error = jax_tracing_error()
    assert failure_reason(error) == "compile_error"
    assert classify.compile_stage(error) == "tracing"
    assert classify.compile_failure_reason(error) == "invalid_program"
    # Counted once, however many exits it passes through.
    assert classify.uncounted_compile_failure(error) == ("tracing", "invalid_program")
    assert classify.uncounted_compile_failure(raised_from(RuntimeError("wrapped"), error)) is None


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("RESOURCE_EXHAUSTED: Out of memory while compiling", "out_of_memory"),
        ("UNIMPLEMENTED: custom call not supported", "unsupported"),
        ("INVALID_ARGUMENT: Binary op with incompatible shapes", "invalid_program"),
        ("INTERNAL: during compilation", "internal"),
        ("UNKNOWN: something", "other"),
    ],
)
def test_a_backend_compile_error_has_its_reason_from_the_status(message: str, reason: str) -> None:
    error = marked(RuntimeError(message), "compile_error")
    assert classify.compile_failure_reason(error) == reason
    assert reason in reasons.COMPILE_FAILURE_VALUES


def ended(tmp_path: Path, failed: bool | BaseException | str) -> events.Lifecycle:
    """The last lifecycle event of a Monitor closed with ``failed``."""
    path = tmp_path / "events.jsonl"
    path.unlink(missing_ok=True)
    monitor = Monitor(
        "w", socket=tmp_path / "none.sock", sinks=[RecordSink(path)], traces=False, hooks=Hooks(jax_compiles=False)
    )
    monitor.close(failed=failed)
    last = [e for _, e in read_records(path) if isinstance(e, events.Lifecycle)][-1]
    return last


@pytest.mark.parametrize(
    ("failed", "state", "reason"),
    [
        (False, "stop", "none"),
        (True, "failure", "other"),
        (ValueError("x"), "failure", "other"),
        (MemoryError(), "failure", "out_of_memory"),
        (SystemExit(0), "stop", "none"),
        (SystemExit(2), "failure", "other"),
        (KeyboardInterrupt(), "stop", "none"),
        ("preemption", "failure", "preemption"),  # a job that learnt of it itself (JAX's preemption sync point)
        ("no-such-reason", "failure", "other"),
    ],
)
def test_the_monitor_closes_with_the_reason(tmp_path: Path, failed: object, state: str, reason: str) -> None:
    last = ended(tmp_path, failed)  # type: ignore[arg-type]
    assert (last.state, last.reason) == (state, reason)


@pytest.mark.parametrize(
    ("explanation", "cause"),
    [
        # JAX's own wording (jax/_src/interpreters/partial_eval.py, explain and diff_tracing_cache_keys).
        (
            "TRACING CACHE MISS at train.py:40:\n  never seen function:\n    step id=1 defined at train.py:12",
            None,
        ),
        (
            "TRACING CACHE MISS at train.py:40 (<module>):\n  never seen function:\n    <lambda> id=2 defined at "
            "train.py:40\n  but seen another function defined on the same line; maybe the function is\n  being "
            "re-defined repeatedly, preventing caching?",
            "redefined_function",
        ),
        (
            "TRACING CACHE MISS at train.py:40:\n  for step defined at train.py:12\n  all previously seen cache keys "
            "differ. For the closest previous key:\n  different input types:\n  * at x, now f32[4] and before f32[3]",
            "input_types",
        ),
        ("...closest previous key:\n  different input pytree:\n  * at input path [0]", "input_structure"),
        ("...closest previous key:\n  Tracing context doesn't match, e.g. due to config", "tracing_context"),
        ("...closest previous key:\n  cache miss explanation unavailable", "other"),
    ],
)
def test_jax_explanations_read_into_causes(explanation: str, cause: str | None) -> None:
    assert recompile_cause(explanation) == cause
    assert cause is None or cause in reasons.RECOMPILE_VALUES


def test_a_sigterm_is_a_preemption_where_no_metadata_server_answers() -> None:
    assert preemption.sigterm_reason({}) == "preemption"  # not a Google VM, no GCE_METADATA_HOST
    assert preemption.sigterm_reason({gce_metadata.METADATA_HOST_ENV: "127.0.0.1:9"}) == "preemption"  # refused


def run_job(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess[str], list[events.Lifecycle]]:
    script = tmp_path / "job.py"
    script.write_text(
        "import os, signal, sys\nfrom tpuscope.tracing import Hooks, Monitor, RecordSink\n"
        f"record = RecordSink({str(tmp_path / 'events.jsonl')!r})\n" + textwrap.dedent(body)
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    lifecycle = [e for _, e in read_records(tmp_path / "events.jsonl") if isinstance(e, events.Lifecycle)]
    return run, lifecycle


def test_a_job_that_handles_sigterm_itself_keeps_its_handler_and_ends_as_preempted(tmp_path: Path) -> None:
    run, lifecycle = run_job(
        tmp_path,
        """
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))  # save, then leave: the job's own plan
        mon = Monitor(
            "w", socket="none.sock", sinks=[record], traces=False, hooks=Hooks(jax_compiles=False, sigterm=True)
        )
        os.kill(os.getpid(), signal.SIGTERM)
        while not stop:
            pass
        with mon.step(1):  # the job's handler decides: no Preempted at its next step
            pass
        print("saved and left cleanly", mon.preempted)
        mon.close()
        """,
    )
    assert run.returncode == 0, run.stderr
    assert "saved and left cleanly True" in run.stdout
    assert [(e.state, e.reason) for e in lifecycle] == [("start", "none"), ("failure", "preemption")]


def test_an_opted_in_sigterm_ends_the_job_at_its_next_step_with_143(tmp_path: Path) -> None:
    """The opt-in handler only sets the flag: the job goes on to the end of its step (a last save may read
    ``mon.preempted``), and the next step raises Preempted, once."""
    run, lifecycle = run_job(
        tmp_path,
        """
        mon = Monitor(
            "w", socket="none.sock", sinks=[record], traces=False, hooks=Hooks(jax_compiles=False, sigterm=True)
        )
        try:
            for n in range(10**9):
                with mon.step(n):
                    if n == 3:
                        os.kill(os.getpid(), signal.SIGTERM)
                        print("step 3 ends, preempted:", mon.preempted, flush=True)
        except BaseException as e:
            print("left as step", n, "began:", type(e).__name__, flush=True)
            with mon.step(n + 1):  # a last save's step: not interrupted again
                pass
            raise
        finally:
            print("finally ran")
        """,
    )
    assert run.returncode == preemption.SIGTERM_EXIT, run.stderr
    assert "step 3 ends, preempted: True" in run.stdout and "left as step 4 began: Preempted" in run.stdout
    assert "finally ran" in run.stdout
    assert [(e.state, e.reason) for e in lifecycle] == [("start", "none"), ("failure", "preemption")]


def test_jax_preemption_notifier_keeps_sigterm(tmp_path: Path) -> None:
    """In a jax.distributed job JAX's native handler owns SIGTERM (its preemption sync point): a Monitor made
    after it leaves it alone, opted in or not, where a Python handler of its own would silence JAX's."""
    run, _ = run_job(
        tmp_path,
        """
        import socket
        import jax
        from tpuscope.tracing.preemption import native_handler_installed
        free = socket.socket(); free.bind(("127.0.0.1", 0)); port = free.getsockname()[1]; free.close()
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=1, process_id=0)
        mon = Monitor(
            "w", socket="none.sock", sinks=[record], traces=False, hooks=Hooks(jax_compiles=False, sigterm=True)
        )
        print("native", native_handler_installed(signal.SIGTERM), "python", int(signal.getsignal(signal.SIGTERM)))
        mon.close()
        jax.distributed.shutdown()
        """,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "native True python 0" in run.stdout  # SIG_DFL as Python knows it: no handler of the Monitor's


def test_an_opted_in_monitor_made_before_jax_distributed_leaves_its_notifier_alone(tmp_path: Path) -> None:
    """tpuscope workload's order (each worker of --processes): the Monitor opts in, then jax.distributed takes
    SIGTERM natively. Neither the Monitor's uninstall (as it closes) nor a later opted-in Monitor puts a Python
    handler back in place of JAX's notifier."""
    run, _ = run_job(
        tmp_path,
        """
        import socket
        import jax
        from tpuscope.tracing.preemption import _sigaction_handler, sigterm
        free = socket.socket(); free.bind(("127.0.0.1", 0)); port = free.getsockname()[1]; free.close()
        first = Monitor(
            "w", socket="none.sock", sinks=[record], traces=False, hooks=Hooks(jax_compiles=False, sigterm=True)
        )
        python = _sigaction_handler(signal.SIGTERM)
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=1, process_id=0)
        notifier = _sigaction_handler(signal.SIGTERM)
        print("taken", notifier not in (python, 0, 1))
        first.close()
        sigterm.uninstall()
        second = Monitor(
            "w", socket="none.sock", sinks=[record], traces=False, hooks=Hooks(jax_compiles=False, sigterm=True)
        )
        print("kept", _sigaction_handler(signal.SIGTERM) == notifier, sigterm.installed)
        second.close()
        jax.distributed.shutdown()
        """,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "taken True" in run.stdout and "kept True False" in run.stdout


def test_the_detection_matrix_names_real_tests_and_alerts() -> None:
    """docs/failures.md: every test it cites exists, every alert it names is one of ours, every failure reason
    has its row."""
    root = Path(__file__).parent.parent
    matrix = (root / "docs" / "failures.md").read_text()
    cited = re.findall(r"`(tests/\w+\.py)::(\w+)`", matrix)
    assert len(cited) >= 15
    for path, name in cited:
        assert re.search(rf"^def {name}\(", (root / path).read_text(), re.MULTILINE), f"{path}::{name}"
    named = set(re.findall(rf"\b{ALERT_PREFIX}\w+", matrix))
    assert named <= {str(alert) for alert in AlertName}, named - {str(alert) for alert in AlertName}
    for reason in reasons.FAILURE_VALUES:
        assert f"| `{reason}` |" in matrix, reason


@pytest.mark.parametrize("sigterm", ["", ", sigterm=False"], ids=["default", "sigterm=False"])
def test_the_monitor_leaves_sigterm_as_it_was(tmp_path: Path, sigterm: str) -> None:
    run, lifecycle = run_job(
        tmp_path,
        f"""
        mon = Monitor("w", socket="none.sock", sinks=[record], traces=False, hooks=Hooks(jax_compiles=False{sigterm}))
        print("python", int(signal.getsignal(signal.SIGTERM)))
        os.kill(os.getpid(), signal.SIGTERM)  # the default: the process ends at once, saying nothing
        """,
    )
    assert run.returncode == -signal.SIGTERM and "python 0" in run.stdout, run.stderr
    assert [(e.state, e.reason) for e in lifecycle] == [("start", "none")]


def test_a_job_that_swallows_the_sigterm_still_ends_after_its_grace(tmp_path: Path) -> None:
    """With the opt-in handler and ``sigterm_grace``: a bare except that catches Preempted and carries on still
    ends, with SIGTERM's default action, once its grace is over; the preemption is sent first."""
    run, lifecycle = run_job(
        tmp_path,
        """
        import time
        mon = Monitor(
            "w",
            socket="none.sock",
            sinks=[record],
            traces=False,
            hooks=Hooks(jax_compiles=False, sigterm=True, sigterm_grace=5.0),
        )
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            with mon.step(1):
                pass
        except BaseException as e:
            print("swallowed", type(e).__name__, flush=True)
        time.sleep(60)
        """,
    )
    assert run.returncode == -signal.SIGTERM and "swallowed Preempted" in run.stdout, run.stderr
    assert [(e.state, e.reason) for e in lifecycle] == [("start", "none"), ("failure", "preemption")]


def test_jax_explanations_stop_after_their_budget(tmp_path: Path) -> None:
    """Each explanation costs more as a function's shapes grow: past EXPLAIN_BUDGET the setting goes back off,
    and the job's log stays clean throughout. The recompiles after it are still counted (cause unexplained):
    10 retraces, 10 recompile events."""
    run, _ = run_job(
        tmp_path,
        """
        import jax, jax.numpy as jnp
        from tpuscope.tracing import jax_compiles
        jax_compiles.EXPLAIN_BUDGET = 5
        got = []
        class Kept:
            def emit(self, event): got.append(type(event).__name__)
            def close(self): pass
        mon = Monitor("w", socket="none.sock", sinks=[record, Kept()], traces=False, hooks=Hooks(profile_period="off"))
        f = jax.jit(lambda x: x.sum())
        for n in range(1, 12):
            f(jnp.ones(n))
        print(f"recompiles {got.count('Recompile')}", "explaining", jax.config.jax_explain_cache_misses)
        mon.close()
        print("after close", jax.config.jax_explain_cache_misses)
        """,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "recompiles 10 explaining False" in run.stdout and "after close False" in run.stdout
    assert "CACHE MISS" not in run.stderr
