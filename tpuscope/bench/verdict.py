"""How the benchmarks report: named checks, printed as a table and written with the figures and the machine as
JSON, the exit code their verdict; and the aligned text tables they print."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpuscope.bench.machine import machine


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def check_lines(checks: list[Check], width: int = 30) -> list[str]:
    return ["Checks:", *(f"  {'ok  ' if c.ok else 'FAIL'} {c.name:<{width}} {c.detail}" for c in checks)]


def write_report(json_path: Path, figures: dict[str, Any], checks: list[Check]) -> list[str]:
    """Write the machine, the figures and the checks to ``json_path``; the names of the failed checks."""
    failed = [c.name for c in checks if not c.ok]
    report = {"machine": machine(), **figures, "checks": [asdict(c) for c in checks], "failed": failed}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"JSON: {json_path}")
    return failed


def table(rows: list[list[str]], right: set[int]) -> list[str]:
    """``rows`` (the first the header) in aligned columns, those numbered in ``right`` aligned right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
