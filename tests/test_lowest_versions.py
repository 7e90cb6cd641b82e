"""The sidecar on the lowest versions pyproject.toml allows of the libraries it leans on hardest.

CI installs what constraints.txt pins, the newest when it was locked; a user's environment may hold anything
pyproject.toml allows. So the floors of the sidecar's leaf dependencies (the exposition format's library, the wire
codec, YAML, bcrypt, psutil, rich, the TPU runtime's stubs) are installed beside the environment, ahead of it on
PYTHONPATH, and the tests of /metrics, the wire, the web config, the sidecar and the libtpu collector run on them,
real sidecar processes included (they inherit the path). OpenTelemetry and protobuf are left at the pinned versions:
their floors come as a family of packages that must move together.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parent.parent
# tpu-info: the libtpu collector's stubs (the `tpu` extra), whose floor is the first without import-time side
# effects; its tests run the collector against a fake runtime built on the same stubs.
FLOORED = ("prometheus-client", "msgspec", "pyyaml", "bcrypt", "psutil", "rich", "tpu-info")
TESTS = ("tests/test_exposition.py", "tests/test_sidecar.py", "tests/test_security.py", "tests/test_libtpu.py")


def floors() -> dict[str, str]:
    """Each of FLOORED at the lowest version pyproject.toml's dependencies (and the sidecar's extras) allow (its
    ``>=`` bound)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["tpu"]]
    bounds = dict(m.groups() for req in declared if (m := re.match(r"^([A-Za-z0-9._-]+)>=([0-9][0-9.]*)", req)))
    return {name: bounds[name] for name in FLOORED}


@pytest.mark.timeout(900)
def test_the_sidecar_passes_its_tests_on_the_lowest_versions_pyproject_allows(tmp_path: Path) -> None:
    lowest = tmp_path / "lowest"
    wanted = floors()
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
    install = subprocess.run(
        [*pip, "--only-binary=:all:", "--target", str(lowest), *(f"{name}=={v}" for name, v in wanted.items())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(lowest), os.environ.get("PYTHONPATH", "")]).rstrip(":")}

    # What the tests below will import is the floors, not the environment's versions.
    names = ", ".join(repr(name) for name in wanted)
    seen = subprocess.run(
        [sys.executable, "-c", f"from importlib.metadata import version; print([version(n) for n in ({names},)])"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert seen.returncode == 0, seen.stderr
    found = seen.stdout.strip().strip("[]").replace("'", "").split(", ")
    assert [Version(v) for v in found] == [Version(v) for v in wanted.values()], (found, wanted)

    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *TESTS],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=780,
    )
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-2000:]
    print(tests.stdout.strip().splitlines()[-1])
