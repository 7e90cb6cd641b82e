from __future__ import annotations

import os

# The JAX tests need 8 CPU devices; XLA reads this once, when jax first starts its CPU backend.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuscope.exporter.child import SidecarProcess


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
    with SidecarProcess(module_tmp / "events.sock") as process:
        yield process


@pytest.fixture
def sidecar(short_tmp: Path) -> Iterator[SidecarProcess]:
    """A real ``tpuscope serve`` process on loopback with its own socket."""
    with SidecarProcess(short_tmp / "events.sock") as process:
        yield process


def require(binary: str) -> str:
    """The path of a tool the tests need; a missing one fails the test (it is never skipped)."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} is not installed: `make test` installs Debian's prometheus package")
    return path
