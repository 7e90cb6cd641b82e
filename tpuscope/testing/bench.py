"""The demo workload (``tpuscope workload``) and the benchmarks (``tpuscope bench NAME``) as processes, for the tests
and tpuscope's own benchmarks: one way to build their command line, run it and read a benchmark's JSON report.

Each runs as a process of its own, as a user runs it: a test then sees its exit status, its output and its
effect on a sidecar exactly as a job's would be seen. Options are written ``--name=value``, so that a value
beginning with a dash cannot be read as another option."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuscope.testing.lines import Lines

TIMEOUT_SECONDS = 300.0  # a JAX workload run of the tests' sizes takes under a minute; a hung one fails the test


def command(*flags: str, **options: object) -> list[str]:
    """``python -m tpuscope workload``, or ``python -m tpuscope bench NAME`` when ``flags`` begin with a benchmark's
    name (``perf``); each of ``options`` as ``--name=value`` (``run_dir`` as ``--run-dir``), then ``flags`` as given
    (repeated options such as ``--inject=...``)."""
    written = [f"--{name.replace('_', '-')}={value}" for name, value in options.items()]
    if flags and not flags[0].startswith("-"):
        return [sys.executable, "-m", "tpuscope", "bench", flags[0], *written, *flags[1:]]
    return [sys.executable, "-m", "tpuscope", "workload", *written, *flags]


def run(
    *flags: str, timeout: float = TIMEOUT_SECONDS, env: Mapping[str, str] | None = None, **options: object
) -> subprocess.CompletedProcess[str]:
    """Run the workload or a benchmark (see :func:`command`) to its end, its output captured; ``env`` adds to this
    process's."""
    return subprocess.run(
        command(*flags, **options), capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def report(benchmark: str, *flags: str, directory: Path, timeout: float) -> dict[str, Any]:
    """Run ``tpuscope bench BENCHMARK FLAGS``, which must exit 0, and return its JSON report (``--json``). The
    printed table goes to the caller's output, for whoever reads it."""
    out_json = directory / f"{benchmark}.json"
    done = run(benchmark, *flags, timeout=timeout, json=out_json)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    parsed: dict[str, Any] = json.loads(out_json.read_text())
    return parsed


class Running:
    """A ``command`` (:func:`command`) running in its own process group, its output kept line by line with
    when each arrived. ``env`` adds to this process's environment, less the tests' XLA_FLAGS (8 in-process devices),
    which would win over ``--cpu-devices``."""

    def __init__(self, command: list[str], env: Mapping[str, str] | None = None) -> None:
        environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        environment.update(PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment,
            start_new_session=True,
        )
        self.lines = Lines(self.proc.stdout)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self.lines.join()
        return code

    def kill(self) -> None:
        """SIGKILL the whole group (every worker of ``--processes``), then wait for it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.wait(30)
