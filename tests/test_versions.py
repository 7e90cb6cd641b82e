"""The versions CI installs are the ones constraints.txt pins (the Makefile installs with it), so an upstream
release changes nothing until `make lock` takes it, and the tests ran on what the lock says."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)$")


def canonical(name: str) -> str:
    """A distribution's name as package indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    lines = [line.strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    found = [PIN.match(line) for line in lines if line and not line.startswith("#")]
    assert all(found), [line for line, m in zip(lines, found, strict=False) if not m]
    return {canonical(m.group(1)): m.group(2) for m in found if m}


def test_every_package_this_environment_holds_is_pinned_at_its_version() -> None:
    pinned = pins()
    assert canonical("prometheus-client") in pinned and canonical("jax") in pinned  # the file is the real one
    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}
    installed.pop("tpuscope")  # the checkout itself, installed editable
    unpinned = sorted(name for name in installed if name not in pinned)
    assert not unpinned, f"installed but not in constraints.txt (run make lock): {unpinned}"
    moved = {
        name: (version, pinned[name])
        for name, version in installed.items()
        if Version(pinned[name]) != Version(version)
    }
    assert not moved, f"installed at another version than constraints.txt pins (installed, pinned): {moved}"


def test_every_dependency_pyproject_declares_is_pinned() -> None:
    """A dependency added to pyproject.toml without `make lock` would install at whatever is newest."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    declared += [req for extra in project["optional-dependencies"].values() for req in extra]
    names = {canonical(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0]) for req in declared}
    missing = sorted(names - set(pins()))
    assert not missing, f"declared in pyproject.toml but not pinned in constraints.txt (run make lock): {missing}"
