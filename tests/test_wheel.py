"""The built wheel, installed into a fresh venv that has never seen the checkout, runs the user's commands.

Every other test imports the project installed editable, so a file the wheel leaves out (package data, the
fake NVML's C source) would pass them all. Here ``python -m build`` builds the sdist and the wheel from it,
out of a copy of the checkout's files as git sees them (the build's scratch directories stay out of the
shared tree); a new venv without system site-packages installs the wheel with the dashboards and report
extras and no JAX; then, from a directory that holds no ``tpuscope`` package: ``--version``, ``serve``
scraped while the JAX-free bench feeds it and records its events, ``report`` on that recording, and
``generate --check`` against a copy of the committed generated files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tpuscope import catalog, generate
from tpuscope.testing.waiting import scrape_until
from tpuscope.workload.sidecar import SidecarProcess

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tpuscope"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
EXTRAS = "dashboards,report"
WORKLOAD = "wheel"
STEPS = 30
# The committed files `tpuscope generate --check` compares, and the folders they lie in.
GENERATED = sorted(generate.ARTIFACTS)
GENERATED_DIRS = sorted({Path(name).parts[0] for name in GENERATED})
# A build and a fresh venv's install of some 45 packages: over a minute beside the suite's other workers.
pytestmark = pytest.mark.long


@dataclass(frozen=True)
class Installed:
    """The fresh venv with the wheel in it, and how to run its commands away from the checkout."""

    venv: Path
    wheel: Path
    home: Path  # an empty working directory: nothing in it can be imported as tpuscope
    env: dict[str, str]

    def command(self, *args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / PACKAGE), *args],
            cwd=cwd or self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def python(self, code: str) -> str:
        run = subprocess.run(
            [str(self.venv / "bin" / "python"), "-c", code],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()


def checkout_files(*under: str) -> list[str]:
    """The checkout's files as a fresh clone with these edits would hold them: tracked or new, never ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *under],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    names = {name for name in listed.stdout.decode().split("\0") if name}
    return sorted(name for name in names if (ROOT / name).is_file())  # a tracked file deleted here is not copied


def copy_files(names: list[str], destination: Path) -> None:
    for name in names:
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)


def build_wheel(directory: Path) -> Path:
    """``python -m build``: the sdist, then the wheel built from the sdist, so both must hold the package."""
    source = directory / "source"
    copy_files(checkout_files(), source)
    out = directory / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)], capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return wheel


def clean_env(venv: Path) -> dict[str, str]:
    """This environment with the venv's commands first and nothing pointing Python at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def install(wheel: Path, venv: Path) -> None:
    # A venv made by .venv's interpreter stands on the base Python alone: none of .venv's packages, no checkout.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[{EXTRAS}]"],
        env=clean_env(venv),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]


@pytest.fixture(scope="module")
def installed(module_tmp: Path) -> Iterator[Installed]:
    started = time.monotonic()
    wheel = build_wheel(module_tmp)
    built = time.monotonic()
    venv = module_tmp / "venv"
    install(wheel, venv)
    print(
        f"\nwheel {wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB, built in {built - started:.1f} s; "
        f"fresh venv with [{EXTRAS}] installed in {time.monotonic() - built:.1f} s"
    )
    home = module_tmp / "home"
    home.mkdir()
    yield Installed(venv, wheel, home, clean_env(venv))


def test_the_wheel_holds_every_file_of_the_package(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        packed = {name for name in wheel.namelist() if name.startswith(f"{PACKAGE}/")}
    missing = set(checkout_files(PACKAGE)) - packed
    assert not missing, f"not in the wheel (pyproject.toml, [tool.setuptools.package-data]): {sorted(missing)}"


def test_the_venv_runs_the_wheel_not_the_checkout_and_has_no_jax(installed: Installed) -> None:
    where = Path(installed.python(f"import {PACKAGE}; print({PACKAGE}.__file__)"))
    assert where.is_relative_to(installed.venv), where
    assert installed.python("import importlib.util; print(importlib.util.find_spec('jax'))") == "None"
    version = installed.command("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"{PACKAGE} {VERSION}"


def test_serve_is_scraped_and_report_reads_the_recording(installed: Installed, short_tmp: Path) -> None:
    socket = short_tmp / "events.sock"
    recording = short_tmp / "events.jsonl"
    sidecar = SidecarProcess(
        socket, env=installed.env, inherit_env=False, command=(str(installed.venv / "bin" / PACKAGE),),
        cwd=installed.home, timeout=30,
    )  # fmt: skip
    try:
        bench = installed.command(
            "workload", "--synthetic", f"--workload={WORKLOAD}", f"--steps={STEPS}", "--step-time=0.005",
            "--checkpoint-every=10", f"--socket={socket}", f"--record={recording}", f"--run-dir={short_tmp / 'run'}",
        )  # fmt: skip
        assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
        scrape = scrape_until(sidecar.url, lambda s: (s.value(catalog.STEPS.name, workload=WORKLOAD) or 0) >= STEPS)
        assert scrape.value(catalog.STEPS.name, workload=WORKLOAD) == STEPS, sidecar.log()[-2000:]
    finally:
        sidecar.stop()
    out = short_tmp / "report"
    report = installed.command("report", f"--recording={recording}", f"--out={out}")
    assert report.returncode == 0, report.stderr
    assert f"wrote {out / 'index.html'}" in report.stdout
    assert json.loads((out / "report.json").read_text())["totals"]["step_count"] == STEPS
    assert len(list(out.glob("*.png"))) >= 5, "the report extra's matplotlib drew no charts"


def test_generate_check_passes_on_the_committed_files_and_fails_on_a_changed_one(
    installed: Installed, short_tmp: Path
) -> None:
    tree = short_tmp / "generated"
    names = checkout_files(*GENERATED_DIRS)
    copy_files(names, tree)
    assert not (tree / PACKAGE).exists()
    check = installed.command("generate", "--check", cwd=tree)
    assert check.returncode == 0, check.stderr
    edited = GENERATED[0]
    assert edited in names, f"{edited} is generated but not committed"
    (tree / edited).write_text((tree / edited).read_text() + "\n")
    changed = installed.command("generate", "--check", cwd=tree)
    assert changed.returncode == 1 and f"stale: {edited}" in changed.stderr, changed.stderr
