from __future__ import annotations

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
