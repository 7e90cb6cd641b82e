"""JAX's settings and loggers stay the job's, and one compile watcher serves every Monitor of a process (issue 34,
repros 08 and 09 in ../shared/repros/job-safety/): each test runs a real JAX job on the CPU with and without
tpuscope, or with one Monitor and with two, and compares what the job sees and what tpuscope reports."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tpuscope import events
from tpuscope.reasons import UNEXPLAINED
from tpuscope.tracing import read_records
from tpuscope.tracing.jax_compiles import EXPLAIN_ENV

# Each job's first lines: jax imported, and a Monitor of its own record that has seen jax (its watcher subscribed).
PREAMBLE = """
import json, logging, os, sys
import jax, jax.numpy as jnp
from tpuscope.tracing import Hooks, Monitor, RecordSink
HERE = os.path.dirname(os.path.abspath(__file__))
def monitor(name, **options):
    mon = Monitor(
        name,
        socket=os.path.join(HERE, "none.sock"),
        sinks=[RecordSink(os.path.join(HERE, name + ".jsonl"))],
        traces=False,
        hooks=Hooks(profile_period="off", **options),
    )
    with mon.step(0):
        pass
    return mon
def option():
    return jax.config.jax_explain_cache_misses
"""
EXPLANATION = "TRACING CACHE MISS"


@dataclass
class Job:
    """What a job printed last (a JSON object), the explanations in its log, and what each Monitor recorded."""

    result: dict[str, Any]
    explanations: int
    stderr: str
    directory: Path

    def events(self, monitor: str) -> list[events.AnyEvent]:
        path = self.directory / f"{monitor}.jsonl"
        return [event for _, event in read_records(path)] if path.exists() else []

    def causes(self, monitor: str) -> list[str]:
        return [e.cause for e in self.events(monitor) if isinstance(e, events.Recompile)]

    def compiles(self, monitor: str) -> int:
        return sum(isinstance(e, events.Compile) for e in self.events(monitor))


def run_job(directory: Path, body: str, *args: str, env: dict[str, str] | None = None) -> Job:
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "job.py"
    script.write_text(PREAMBLE + textwrap.dedent(body))
    environment = {k: v for k, v in os.environ.items() if k != EXPLAIN_ENV} | (env or {})
    run = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300, env=environment
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return Job(result, sum(EXPLANATION in line for line in run.stderr.splitlines()), run.stderr, directory)


ASKS = """
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message).60s")
monitored, when = sys.argv[1] == "monitor", sys.argv[2]
if when == "before":
    jax.config.update("jax_explain_cache_misses", True)
if monitored:
    mon = monitor("job")
if when == "after":
    jax.config.update("jax_explain_cache_misses", True)  # while debugging a recompile, from a flag
f = jax.jit(lambda x: x * 2)
for n in (1, 2, 3):
    f(jnp.ones(n))  # a first trace, then two retraces: JAX explains each at WARNING
if monitored:
    mon.close()
print(json.dumps({"option": option()}))
"""


@pytest.mark.parametrize("when", ["after", "before", "env"])
def test_a_job_that_asks_for_explanations_sees_them_as_without_tpuscope(tmp_path: Path, when: str) -> None:
    """08: the job turns the setting on after its Monitor exists (or before it, or from the environment): its log
    shows JAX's explanations as without tpuscope, and the setting is still on after the Monitor's close."""
    env = {EXPLAIN_ENV: "1"} if when == "env" else {}
    plain = run_job(tmp_path / "plain", ASKS, "plain", when, env=env)
    monitored = run_job(tmp_path / "monitored", ASKS, "monitor", when, env=env)
    assert plain.explanations == 3 and plain.result["option"] is True, plain.stderr[-2000:]
    assert monitored.explanations == plain.explanations, monitored.stderr[-2000:]
    assert monitored.result["option"] is True
    assert monitored.causes("job") == ["input_types", "input_types"]  # tpuscope reads them too


UNTOUCHED = """
mon = monitor("job") if sys.argv[1] == "monitor" else None
during = option()
f = jax.jit(lambda x: x * 2)
for n in (1, 2, 3):
    f(jnp.ones(n))
if mon:
    mon.close()
print(json.dumps({"during": during, "after": option()}))
"""


def test_a_setting_the_job_left_untouched_is_borrowed_and_given_back(tmp_path: Path) -> None:
    """Untouched, the setting is on while the Monitor is open, for the causes, and off again after; the job's log
    is as without tpuscope (no explanation in it)."""
    plain = run_job(tmp_path / "plain", UNTOUCHED, "plain")
    monitored = run_job(tmp_path / "monitored", UNTOUCHED, "monitor")
    assert plain.result == {"during": False, "after": False}
    assert monitored.result == {"during": True, "after": False}
    assert monitored.explanations == plain.explanations == 0, monitored.stderr[-2000:]
    assert monitored.causes("job") == ["input_types", "input_types"]


def test_a_setting_from_the_environment_is_left_as_it_is(tmp_path: Path) -> None:
    """``JAX_EXPLAIN_CACHE_MISSES=0`` is the job's choice even though it is JAX's default: the Monitor leaves it
    off, and still counts the recompiles, without their cause."""
    monitored = run_job(tmp_path, UNTOUCHED, "monitor", env={EXPLAIN_ENV: "0"})
    assert monitored.result == {"during": False, "after": False}
    assert monitored.explanations == 0
    assert monitored.causes("job") == [UNEXPLAINED, UNEXPLAINED]


QUIET = """
if sys.argv[2] == "logger":
    logging.getLogger("jax").setLevel(logging.ERROR)  # the job silences JAX's log noise
else:
    logging.disable(logging.WARNING)
mon = monitor("job") if sys.argv[1] == "monitor" else None
f = jax.jit(lambda x: x * 2)
for n in (1, 2, 3):
    f(jnp.ones(n))  # two recompiles
if mon:
    mon.close()
print(json.dumps({"option": option()}))
"""


@pytest.mark.parametrize("quieted", ["logger", "disable"])
def test_recompiles_are_counted_whatever_the_jobs_log_levels(tmp_path: Path, quieted: str) -> None:
    """08: a job that quiets JAX (its logger at ERROR, or ``logging.disable``) hides JAX's explanations from a
    logging filter too; the recompiles are still counted, the cause unexplained where JAX's was not seen."""
    plain = run_job(tmp_path / "plain", QUIET, "plain", quieted)
    monitored = run_job(tmp_path / "monitored", QUIET, "monitor", quieted)
    assert monitored.explanations == plain.explanations == 0
    assert monitored.result == plain.result == {"option": False}
    causes = monitored.causes("job")
    assert len(causes) == 2 and set(causes) <= {UNEXPLAINED, "input_types"}, causes


NAMES = """
if sys.argv[1] == "quiet":
    logging.getLogger("jax").setLevel(logging.ERROR)
mon = monitor("job")
add = jax.jit(lambda x: x + 1)
sub = jax.jit(lambda x: x - 1)  # another function of the same name, <lambda>
add(jnp.ones(2))
sub(jnp.ones(2))
jnp.sum(jnp.ones(3))
jnp.sum(jnp.ones(4))  # JAX's own jitted function, and its eager primitives, traced again: not the job's
for _ in range(3):
    jax.jit(lambda x: x * 3)(jnp.ones(2))  # a lambda jitted in a loop: traced again each time
mon.close()
print(json.dumps({}))
"""


def test_recompiles_without_explanations_are_the_ones_jax_explains(tmp_path: Path) -> None:
    """Without JAX's explanations the watcher tells functions apart by object and code, not by name: two lambdas
    are no recompile, nor JAX's own functions traced for new shapes; a lambda jitted in a loop is, as JAX says."""
    explained = run_job(tmp_path / "explained", NAMES, "explained")
    quiet = run_job(tmp_path / "quiet", NAMES, "quiet")
    assert explained.causes("job") == ["redefined_function", "redefined_function"]
    assert quiet.causes("job") == [UNEXPLAINED, UNEXPLAINED]


TWO = """
two = sys.argv[1] == "two"
lib = monitor("lib") if two else None  # a trainer library's, made first, at its import
user = monitor("user")

@jax.jit
def step(x):
    return jnp.tanh(x @ x.T) @ x

x = jnp.ones((64, 64)) / 64
for n in range(1, 20):
    with user.step(n):
        if lib:
            with lib.step(n):
                x = step(x).block_until_ready()
        else:
            x = step(x).block_until_ready()
f = jax.jit(lambda y: y + 1)
f(jnp.ones(3))
during = option()
if lib:
    lib.close()  # the library is done with its part
for size in (4, 5):
    f(jnp.ones(size))  # two recompiles, after the library's Monitor closed
user.close()
print(json.dumps({"during": during, "after": option()}))
"""


def test_two_monitors_in_one_process_report_each_compile_once(tmp_path: Path) -> None:
    """09: with a library's Monitor and the user's in one process, each compile is reported once (to the
    earliest Monitor still open), and after the library's closes the user's still gets the recompiles, with their
    cause: the library's close did not take the explanations away."""
    one = run_job(tmp_path / "one", TWO, "one")
    two = run_job(tmp_path / "two", TWO, "two")
    assert one.compiles("user") > 0
    assert two.compiles("lib") + two.compiles("user") == one.compiles("user")
    assert two.causes("user") == one.causes("user") == ["input_types", "input_types"]
    assert two.causes("lib") == []
    assert two.result == one.result == {"during": True, "after": False}
    assert two.explanations == one.explanations == 0


SUBSCRIBERS = """
from tpuscope.tracing import jax_compiles
first = monitor("first", jax_compiles=False)
second = monitor("second", jax_compiles=False)
seen = {"quiet": jax_compiles.subscribe(first, explain=False)}
seen["alone without explanations"] = option()
jax_compiles.subscribe(second)
seen["with one that asks"] = option()
f = jax.jit(lambda x: x * 2)
for n in (1, 2):
    f(jnp.ones(n))  # to the first: explained, as the second asked
with jax_compiles.ignoring():
    f(jnp.ones(5))  # tpuscope's own: not reported
jax_compiles.unsubscribe(second)
seen["after it left"] = option()
f(jnp.ones(3))  # to the first, unexplained
jax_compiles.unsubscribe(first)
f(jnp.ones(4))  # to no one
print(json.dumps(seen))
"""


def test_explanations_are_on_while_a_subscriber_asks_and_events_go_to_the_earliest(tmp_path: Path) -> None:
    """The API the Monitor uses: a subscriber that wants no explanations does not turn them on; they are on while
    one that wants them is subscribed; every event goes to the earliest subscriber; ``ignoring()`` leaves out
    this thread's compiles; nothing is reported once all have left."""
    job = run_job(tmp_path, SUBSCRIBERS)
    assert job.result == {
        "quiet": True,
        "alone without explanations": False,
        "with one that asks": True,
        "after it left": False,
    }
    assert job.causes("first") == ["input_types", UNEXPLAINED]
    assert job.events("second") and not job.causes("second") and job.compiles("second") == 0
    compiled = [e.function for e in job.events("first") if isinstance(e, events.Compile) and e.stage == "tracing"]
    assert compiled.count("<lambda>") == 3, compiled  # shapes 1, 2 and 3; not 5 (ignored) nor 4 (no one)


BUDGET = """
from tpuscope.tracing import jax_compiles
jax_compiles.EXPLAIN_BUDGET = 5
mon = monitor("job")
f = jax.jit(lambda x: x.sum())
for n in range(1, 12):
    f(jnp.ones(n))  # ten recompiles
during = option()
mon.close()
print(json.dumps({"during": during, "after": option()}))
"""


def test_explanations_stop_after_their_budget_and_recompiles_are_still_counted(tmp_path: Path) -> None:
    """Each explanation costs more as a function's shapes grow: past EXPLAIN_BUDGET the setting goes back off,
    the later recompiles are counted unexplained, and the job's log stays clean throughout."""
    job = run_job(tmp_path, BUDGET)
    assert job.result == {"during": False, "after": False}
    assert job.causes("job") == ["input_types"] * 5 + [UNEXPLAINED] * 5
    assert job.explanations == 0 and "CACHE MISS" not in job.stderr


LOGS = """
logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(name)s: %(message)s")
if sys.argv[2] == "cache":  # a fresh cache each run: every program is a miss, then written
    jax.config.update("jax_compilation_cache_dir", os.path.join(HERE, "cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
jax.devices()  # the backend's set-up records, before the Monitor's
mon = monitor("job") if sys.argv[1] == "monitor" else None
job = logging.getLogger("job")
f = jax.jit(lambda x: x * 2)
for phase, level in enumerate((logging.WARNING, logging.INFO, logging.DEBUG)):
    logging.getLogger().setLevel(level)
    print("PHASE", logging.getLevelName(level), file=sys.stderr, flush=True)
    for size in (2 * phase + 1, 2 * phase + 2):
        f(jnp.ones(size)).block_until_ready()  # a first trace, then five recompiles
        for say in (job.debug, job.info, job.warning):
            say("step")  # the job's own records
if mon:
    mon.close()
print(json.dumps({}))
"""
# The loggers compared: JAX's and the job's own (tpuscope's are its own business, not the job's).
JOBS_LOGGERS = re.compile(r"^LOG (\w+) (jax[\w.]*|job): ")


def log_levels(stderr: str) -> dict[str, collections.Counter[str]]:
    """Per phase of LOGS (the job's root level), how many records of each level each compared logger printed."""
    phases: dict[str, collections.Counter[str]] = {"set-up": collections.Counter()}
    phase = "set-up"
    for line in stderr.splitlines():
        if line.startswith("PHASE "):
            phase = line.split()[1]
            phases[phase] = collections.Counter()
        elif match := JOBS_LOGGERS.match(line):
            phases[phase][f"{match[1]} {match[2]}"] += 1
    return phases


@pytest.mark.parametrize("cache", ["cache", "no cache"])
def test_the_jobs_log_is_as_without_tpuscope_at_every_level(tmp_path: Path, cache: str) -> None:
    """Issue 52, N3 and N7: the setting the watcher borrows raises the persistent cache's records to WARNING and
    adds JAX's explanations; with and without the Monitor, the job's log has the same records, of the same levels,
    from the same loggers, with its root logger at WARNING, INFO and DEBUG; and the Monitor counted the
    recompiles with their cause."""
    plain = run_job(tmp_path / "plain", LOGS, "plain", cache)
    monitored = run_job(tmp_path / "monitored", LOGS, "monitor", cache)
    expected, seen = log_levels(plain.stderr), log_levels(monitored.stderr)
    assert list(expected) == ["set-up", "WARNING", "INFO", "DEBUG"], plain.stderr[-2000:]
    none: collections.Counter[str] = collections.Counter()
    diff = {
        phase: (levels - seen.get(phase, none), seen.get(phase, none) - levels) for phase, levels in expected.items()
    }
    assert seen == expected, f"per phase, records only without the Monitor, and only with it: {diff}"
    written = "LOG DEBUG jax._src.compilation_cache: Writing jit__lambda to persistent compilation cache"
    assert (written in plain.stderr) == (cache == "cache")  # at DEBUG only: the records the setting raises
    assert monitored.explanations == plain.explanations == 0
    assert monitored.causes("job") == ["input_types"] * 5
