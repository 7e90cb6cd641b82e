"""The rooms of the package: the import contracts hold, each can fail, and the light commands stay light."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACT_TABLES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
CONTRACTS = [c["name"] for c in CONTRACT_TABLES]
SHARED_CONTRACT = "The shared modules belong to no room"
SHARED = next(c for c in CONTRACT_TABLES if c["name"] == SHARED_CONTRACT)["source_modules"]
# Modules a reader's or --version's start must not load: gRPC (the libtpu collector's), the OpenTelemetry SDK.
HEAVY = re.compile(r"^(grpc|opentelemetry\.sdk)(\.|$)")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # The package is found on PYTHONPATH first, so a copy under `root` is what gets analysed.
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--config", root / "pyproject.toml"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_contracts_hold() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in CONTRACTS:
        assert f"{name} KEPT" in result.stdout


# One forbidden import a contract exists to stop: (the module that gains it, the module it imports).
BREACHES = {
    "The in-job library imports no sidecar, generator, reader or workload code": (
        "tracing/sinks.py",
        "tpuscope.exporter.daemon",
    ),
    "The sidecar imports no in-job, generator, reader or workload code": ("exporter/http.py", "tpuscope.tracing"),
    "The readers import no sidecar, in-job or generator code": ("top.py", "tpuscope.exporter.config"),
    "The generators import no sidecar, in-job or reader code": ("dashboards/panels.py", "tpuscope.report"),
    "The generate command imports no sidecar code": (
        "generate.py",
        "tpuscope.exporter.aggregator",
    ),
    "The workload reaches the sidecar only as a process and through the wire schema": (
        "workload/runner.py",
        "tpuscope.exporter.ingest",
    ),
    "Nothing in the product imports the fakes, the benchmarks or the fleet simulator": (
        "exporter/daemon.py",
        "tpuscope.testing.fake_tpu",
    ),
    "The shared modules belong to no room": ("catalog.py", "tpuscope.exporter"),
    "The in-job library's modules import each other one way only": ("tracing/hooks.py", "tpuscope.tracing.monitor"),
    "The benchmarks and the fleet simulator import none of each other": (
        "fleetsim/simulator.py",
        "tpuscope.bench.flood",
    ),
}


def test_every_top_level_module_is_shared_or_a_room_the_contracts_name() -> None:
    """A new module lands in a room, or among the shared ones, on purpose: one the contracts do not name is in no
    room, and nothing keeps its imports in order (a name that says nothing of its room, as tpuscope/failures.py
    beside tpuscope/tracing/failures.py did, is how that starts)."""
    rooms = {
        m
        for c in CONTRACT_TABLES
        if c["name"] != SHARED_CONTRACT
        for key in ("source_modules", "forbidden_modules")
        for m in c.get(key, ())
    } - set(SHARED)
    package = ROOT / "tpuscope"
    found = {f"tpuscope.{p.stem}" for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")}
    found |= {f"tpuscope.{p.name}" for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert not found - rooms - set(SHARED), "in no room and not shared: add each to pyproject's contracts"
    assert not (set(SHARED) | rooms) - found, "the contracts name modules that are gone"
    assert not set(SHARED) & rooms, "a module is both shared and a room"


def test_every_contract_has_a_breach_to_fail_on() -> None:
    assert set(BREACHES) == set(CONTRACTS)


@pytest.mark.parametrize("contract", CONTRACTS)
def test_a_forbidden_import_breaks_its_contract(contract: str, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "tpuscope", tmp_path / "tpuscope", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    where, forbidden = BREACHES[contract]
    module = tmp_path / "tpuscope" / where
    module.write_text(module.read_text() + f"\nimport {forbidden}  # the breach\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{contract} BROKEN" in result.stdout
    importer = f"tpuscope.{where.removesuffix('.py').replace('/', '.')}"
    if next(c["type"] for c in CONTRACT_TABLES if c["name"] == contract) == "acyclic_siblings":
        # A cycle is reported as the imports that would break it, by the siblings' own names.
        assert f"- .{importer.rsplit('.', 1)[1]} -> .{forbidden.rsplit('.', 1)[1]}" in result.stdout
    else:
        assert f"{importer} -> {forbidden}" in result.stdout


@pytest.mark.parametrize("command", [["top", "--help"], ["report", "--help"], ["hangs", "--help"], ["--version"]])
def test_readers_and_version_load_neither_grpc_nor_the_otel_sdk(command: list[str]) -> None:
    # -X importtime lists every module the command imports, on stderr, one line each.
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tpuscope", *command], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    loaded = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert "tpuscope.cli" in loaded  # the listing is real: it names our own modules
    assert [name for name in loaded if HEAVY.match(name)] == []


def test_no_test_module_imports_another() -> None:
    """What tests share lives in a helper module (conftest, tests/*_helpers.py, tpuscope.testing): a test module
    that imports another runs that one's module-level setup as well, and ties a change there to breakage here."""
    import ast

    tests = ROOT / "tests"
    test_modules = {path.stem for path in tests.glob("test_*.py")}

    def imported(source: str) -> set[str]:
        names: set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        return names

    assert imported("from test_x import y\nimport test_z.w\n") == {"test_x", "test_z"}  # the check can fail
    crossing = {path.name: imported(path.read_text()) & test_modules for path in sorted(tests.glob("test_*.py"))}
    assert {name: sorted(found) for name, found in crossing.items() if found} == {}
