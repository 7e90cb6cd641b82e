"""What the reliability benchmarks (``bench flood``, ``bench soak``) judge and how they report it:
named checks, printed as a table and written with the figures as JSON, the exit code their verdict."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpuscope.bench.perf import machine


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
