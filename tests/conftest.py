from __future__ import annotations

import os

# The JAX tests need 8 CPU devices; XLA reads this once, when jax first starts its CPU backend.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import shutil
import subprocess
import tempfile

# Spans from the tests' Monitors go to a scratch file, not into the working tree (tests that
# check spans set their own destination).
os.environ.setdefault("TPUSCOPE_SPANS_FILE", os.path.join(tempfile.mkdtemp(prefix="ts-spans-"), "spans.jsonl"))
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tpuscope.exporter import config
from tpuscope.tracing import profile_sampler as device_profiles
from tpuscope.workload.sidecar import SidecarProcess

# The environment of a job and of its sidecar, for a test that needs a device profile captured and parsed while the
# job runs: the job's profiler thread and the sidecar's parser at nice 0, not their default 19. Beside processes that
# keep the CPU busy (a loaded CI machine), work at the lowest priority may not finish in the job's life, and its
# priority is not what such a test is about (test_profiles checks both). Each process reads only its own variable.
PROFILE_PROMPTLY = {
    next(o.env for o in config.OPTIONS if o.name == "profile_parser_nice"): "0",
    device_profiles.NICE_ENV: "0",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files marked ``long`` first, the rest in their order (see the marker in pyproject.toml)."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # a stable sort


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: Unix socket paths must stay under 108 bytes, pytest's tmp_path can exceed that."""
    path = Path(tempfile.mkdtemp(prefix="ts-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def module_tmp() -> Iterator[Path]:
    """A short directory shared by one test module (several workload runs against one sidecar)."""
    path = Path(tempfile.mkdtemp(prefix="ts-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def module_sidecar(module_tmp: Path) -> Iterator[SidecarProcess]:
    """A real ``tpuscope serve`` shared by one test module's workload runs, parsing their profiles promptly."""
    with SidecarProcess(module_tmp / "events.sock", env=PROFILE_PROMPTLY) as process:
        yield process


@pytest.fixture
def sidecar(short_tmp: Path) -> Iterator[SidecarProcess]:
    """A real ``tpuscope serve`` process on loopback with its own socket."""
    with SidecarProcess(short_tmp / "events.sock") as process:
        yield process


def sockets(pid: int, kind: str) -> list[Any]:
    """A process's sockets of ``kind`` ("unix", "tcp"): psutil's ``net_connections``, called ``connections`` before
    psutil 6.0 (the lowest psutil pyproject allows, 5.9.4, has only that name; tests/test_lowest_versions.py)."""
    process = psutil.Process(pid)
    listed = getattr(process, "net_connections", None) or process.connections
    return list(listed(kind))


def require(binary: str) -> str:
    """The path of a tool the tests need; a missing one fails the test (it is never skipped)."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} is not installed: `make test` installs Debian's prometheus package")
    return path


@pytest.fixture(scope="session")
def fake_nvml_lib() -> Iterator[Path]:
    """The fake libnvidia-ml.so.1 (tpuscope/testing/fake_nvml.c), built once with gcc for the session."""
    from tpuscope.testing import fake_nvml

    path = Path(tempfile.mkdtemp(prefix="ts-nvml-"))
    yield fake_nvml.build(path)
    shutil.rmtree(path, ignore_errors=True)


def assert_promtool_checks_rules(groups: list[dict[str, Any]], directory: Path) -> None:
    """``groups``, written as a rules file, pass ``promtool check rules`` with every lint fatal, all of them read."""
    import yaml

    extracted = directory / "rules.yaml"
    extracted.write_text(yaml.safe_dump({"groups": groups}))
    out = subprocess.run(
        [require("promtool"), "check", "rules", "--lint=all", "--lint-fatal", str(extracted)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in out.stdout


def variation(values: list[float]) -> float:
    """The coefficient of variation: the standard deviation over the mean."""
    return statistics.pstdev(values) / statistics.fmean(values)
