"""Every change the in-job library makes to the job's process, in one table, each with its switch.

A library in someone else's training job is a guest: the job's signals, profiler, JAX config, loggers and
device synchronisation belong to the job (OpenTelemetry's API makes the same promise: an instrumented library
installs nothing until the application asks). So each process-wide change the Monitor can make is listed in
:data:`HOOKS` with what it changes, its default, and why that default is safe. A change that alters how the
job runs, stops, logs or profiles is off unless the job asks for it (``sigterm``); the ones on by default only
observe, and each is proven harmless by a test that runs a real job with and without tpuscope and compares
(tests/test_job_safety_*.py, named in the table).

Each switch is a field of :class:`Hooks` of the hook's name (``Monitor(hooks=Hooks(sigterm=True))``) and an
environment variable; the field wins, and ``TPUSCOPE_HOOKS=off`` (or ``Monitor(hooks=False)``) turns every one of
them off at once, for a job that wants tpuscope to do nothing but send the events it is given. docs/hooks.md is
generated from this table.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("tpuscope")

# The one switch over them all.
ALL_ENV = "TPUSCOPE_HOOKS"
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


@dataclass(frozen=True)
class Hook:
    """One process-wide change: ``name`` is also its :class:`Hooks` field, ``env`` the variable that sets it."""

    name: str
    env: str
    default: bool
    changes: str  # what it does to the process
    why: str  # why this default, and what proves it harmless
    proof: str = ""  # the tests that run a real job with and without it (files, ", " between two)


SIGTERM = Hook(
    "sigterm",
    "TPUSCOPE_SIGTERM",
    False,
    "installs a Python SIGTERM handler that only sets a flag (`mon.preempted`); the next `mon.step()` raises "
    "`Preempted` (exit 143) at the step boundary; a handler the job installed first is called too",
    "a Python handler runs only between bytecodes, so it would keep a job that waits in a device call from "
    "ending, and it is inherited by forked workers: the job's signals are the job's. Without it the sidecar "
    "books preemption and maintenance from the metadata server (docs/failures.md)",
    "tests/test_job_safety_signals.py",
)
SIGTERM_GRACE = Hook(
    "sigterm_grace",
    "TPUSCOPE_SIGTERM_GRACE",
    False,
    "a duration (`25s`; at least 5 s), not a switch: with `sigterm`, ends the job with SIGTERM's default action "
    "that long after the first SIGTERM, armed by a thread that reads the signal wakeup fd (chained to one the job "
    "set, as asyncio's) rather than waiting for the main thread; the preemption is sent first",
    "no watchdog unless asked: none may be shorter than the pod's terminationGracePeriodSeconds, which only "
    "the job's owner knows",
    "tests/test_job_safety_signals.py",
)
JAX_COMPILES = Hook(
    "jax_compiles",
    "TPUSCOPE_JAX_COMPILES",
    True,
    "registers `jax.monitoring` listeners (compile stages, cache look-ups, traces: a function traced again is "
    "a recompile, whatever the job's log levels) and one XLA runtime-error handler (a failed backend compile), "
    "once per process, shared by every Monitor",
    "JAX calls its listeners and the handler returns None: the job's compiles and errors are unchanged",
    "tests/test_job_safety_compiles.py",
)
EXPLAIN_RECOMPILES = Hook(
    "explain_recompiles",
    "TPUSCOPE_EXPLAIN_RECOMPILES",
    True,
    "turns `jax_explain_cache_misses` on, only where the job left it at its default (not in the environment, "
    "False), for a budget of explanations (`jax_compiles.EXPLAIN_BUDGET`); hooks that setting's updates to hand "
    "it back at the job's own `jax.config.update`; filters (first, before the job's) JAX's explanation and cache "
    "loggers: an explanation is read and dropped (JAX logs none without the setting), and a cache record the "
    "setting raised to WARNING is put back at DEBUG, kept only where the logger is enabled for DEBUG; restores the "
    "setting only if it is still tpuscope's",
    "the job's log and config read as without it, record for record and level for level (cache on or off, the "
    "job at DEBUG, INFO or WARNING); the explanations name why a function was traced again (without them a "
    "recompile's cause reads `unexplained`)",
    "tests/test_job_safety_compiles.py",
)
PROFILES = Hook(
    "profiles",
    "TPUSCOPE_PROFILES",
    True,
    "samples a device profile of a few steps every `profile_period` (10 min) with JAX's one profiler "
    "session, started on a thread of its own; each session ends with its `stop()` (never dropped unstopped: its "
    "destructor holds the GIL) on a thread the interpreter waits for at exit (`tpuscope-profile-stop`, at the "
    "lowest CPU priority once the trace stops recording), which writes the trace into the sidecar's spool; the "
    "sidecar parses and serves it. While a profiler lives, JAX's profiler lock "
    "(`jax._src.profiler._profile_state.lock`) is wrapped so that any `start_trace`, `stop_trace` or `trace()` of "
    "the job's first ends a capture and waits only until the native profiler has let it go (given back once the "
    "last profiler is closed and its last stop done, and in a forked child); never captures while PGLE is on; a "
    "capture ends when the job leaves the step loop",
    "the only way to split a fused step into compute and collective; bounded in time, memory and cost, "
    "and the job's own traces come first; `close()` returns at once, a finished job exits cleanly (a stop under "
    "way delays its exit by that stop, never aborts it; a killed job does not wait), and what was captured is "
    "served even if the job ended first",
    "tests/test_job_safety_profiles.py, tests/test_job_safety_captures.py",
)
EXCEPTHOOK = Hook(
    "excepthook",
    "TPUSCOPE_EXCEPTHOOK",
    True,
    "chains `sys.excepthook` to note the exception that ends the job, then calls the previous hook",
    "an unclosed Monitor's exit reads a crash as a failure, not a clean stop; the traceback is printed as before",
    "tests/test_monitor.py",
)
CLOSE_AT_EXIT = Hook(
    "close_at_exit",
    "TPUSCOPE_CLOSE_AT_EXIT",
    True,
    "registers an exit handler that closes an unclosed Monitor (its stop or failure event)",
    "a job that never calls close() still says how it ended; bounded (2 s at most for spans)",
    "tests/test_monitor.py",
)
HANG_WATCH = Hook(
    "hang_watch",
    "TPUSCOPE_HANG_WATCH",
    True,
    "keeps the process's position (step, phase, since when) in a 64-byte file the sidecar maps, in a directory "
    "beside its socket, written with a store to memory at each step and phase boundary (no system call), and "
    "starts one daemon thread (`tpuscope-position`) that sleeps on a connection to the sidecar and, only when the "
    "sidecar suspects a hang, writes every thread's Python stacks beside the record; the thread ends when the "
    "Monitor closes",
    "what makes a hang diagnosable at all: which worker, where, at which line, while every thread of the job is "
    "blocked. It runs, stops and profiles as without it, and costs a step a few stores (docs/bench.md)",
    "tests/test_job_safety_hangs.py",
)
EXIT_ON_HANG = Hook(
    "exit_on_hang",
    "TPUSCOPE_EXIT_ON_HANG",
    False,
    "with `hang_watch`, once the sidecar has judged the process hung and logged its stacks, ends it: the Monitor "
    "reports a failure of reason `hang`, then the process exits with status 75 (EX_TEMPFAIL), so that a JobSet's "
    "failure policy restarts the job",
    "ending a process is the job's owner's decision: a hang verdict can be wrong for a job whose steps or "
    "phases outgrow what it has shown so far",
    "tests/test_hang_watch.py",
)

HOOKS = (
    SIGTERM,
    SIGTERM_GRACE,
    JAX_COMPILES,
    EXPLAIN_RECOMPILES,
    PROFILES,
    EXCEPTHOOK,
    CLOSE_AT_EXIT,
    HANG_WATCH,
    EXIT_ON_HANG,
)


@dataclass(frozen=True)
class Hooks:
    """The Monitor's process-wide changes, one field per hook of :data:`HOOKS`: ``Monitor(hooks=Hooks(...))``.

    A switch left None reads its variable, then ``every``, then ``TPUSCOPE_HOOKS``, then its default
    (:func:`enabled`): ``every=False`` turns off every hook that neither its own field nor its variable turns on,
    as ``Monitor(hooks=False)`` does. Two fields are durations, not switches: ``sigterm_grace`` (the SIGTERM
    watchdog, none unless given; tracing/preemption.py) and ``profile_period`` (how often a device profile is
    sampled, in seconds, a duration such as ``"10m"``, or ``"off"``; default ``$TPUSCOPE_PROFILE_PERIOD``, else
    tracing/profile_sampler.py's).
    """

    sigterm: bool | None = None
    sigterm_grace: float | str | None = None
    jax_compiles: bool | None = None
    explain_recompiles: bool | None = None
    profiles: bool | None = None
    profile_period: float | str | None = None
    excepthook: bool | None = None
    close_at_exit: bool | None = None
    hang_watch: bool | None = None
    exit_on_hang: bool | None = None
    every: bool | None = None

    def on(self, hook: Hook) -> bool:
        """Whether ``hook`` is on for the Monitor given these switches."""
        switch: bool | None = getattr(self, hook.name)
        return enabled(hook, switch, self.every)


def enabled(
    hook: Hook, argument: bool | None, every: bool | None = None, environ: Mapping[str, str] = os.environ
) -> bool:
    """Whether ``hook`` is on: its :class:`Hooks` field if given, else its variable, else ``every`` (False turns
    it off), else ``TPUSCOPE_HOOKS``, else its default. A value a variable cannot mean is said at once and passed
    over."""
    if argument is not None:
        return bool(argument)
    if (own := _flag(hook.env, environ)) is not None:
        return own
    if every is False or _flag(ALL_ENV, environ) is False:
        return False
    return hook.default


def _flag(variable: str, environ: Mapping[str, str]) -> bool | None:
    raw = environ.get(variable, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    if raw:
        log.warning(
            "tpuscope: %s=%r is none of %s or %s: passed over", variable, raw, "/".join(_TRUE), "/".join(_FALSE)
        )
    return None


def markdown() -> str:
    """docs/hooks.md: the table, with the master switch."""
    lines = [
        "# What the in-job library changes in the job's process",
        "",
        "<!-- Generated from tpuscope/tracing/hooks.py by `tpuscope generate`; do not edit. -->",
        "",
        re.sub(r":\w+:`([^`]+)`", r"`\1`", (__doc__ or "").split("\n\n", 1)[1]).replace("``", "`").strip(),
        "",
        "| switch (`Hooks` field) | variable | default | what it changes | why | proven harmless by |",
        "|---|---|---|---|---|---|",
    ]
    for hook in HOOKS:
        default = "on" if hook.default else "off"
        lines.append(f"| `{hook.name}` | `{hook.env}` | {default} | {hook.changes} | {hook.why} | `{hook.proof}` |")
    lines += [
        "",
        f"`{ALL_ENV}=off` or `Monitor(hooks=False)` turns all of them off; a field or a hook's own variable "
        f"still turns one back on. The variables take 1/true/on/yes or 0/false/off/no, but "
        f"`{SIGTERM_GRACE.env}`, a duration.",
        "",
        "Besides these, `tpuscope.tracing` registers `os.register_at_fork` hooks (at import, and when `sigterm` "
        "is installed) that put back in a forked child (a data loader's worker) what the parent's Monitors "
        "changed: the child forgets the parent's Monitors, so it never speaks for the parent nor keeps the "
        "parent's connection to the sidecar open; it gets the job's own SIGTERM disposition and wakeup fd, and "
        "JAX's own profiler lock.",
        "",
    ]
    return "\n".join(lines)
