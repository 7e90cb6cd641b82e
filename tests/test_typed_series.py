"""The sidecar's series are typed from the catalogue to the handler: mypy refuses a wrong update.

A catalogue constant's class says its kind (catalog.CounterMetric, ...), and ``Series[...]`` gives the metric
object of that kind, whose ``labels(...)`` is a series with only that kind's updates. Checked here by running
mypy, with the project's configuration, on a snippet that updates each kind wrongly and one that updates each
rightly.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parent.parent

PREAMBLE = """\
from prometheus_client import CollectorRegistry

from tpuscope import catalog
from tpuscope.exporter.metrics import register

series = register(CollectorRegistry())
"""

RIGHT = """\
series[catalog.STEPS].labels("w").inc()
series[catalog.MFU].labels("w").set(0.5)
series[catalog.STEP_DURATION].labels("w").observe(0.1)
series[catalog.BUILD_INFO].labels("0").set(1)
"""

# Each wrong update, with what mypy says of it.
WRONG = {
    'series[catalog.STEPS].labels("w").set(1)': '"CounterSeries" has no attribute "set"',
    'series[catalog.STEP_DURATION].labels("w").inc()': '"HistogramSeries" has no attribute "inc"',
    'series[catalog.MFU].labels("w").observe(0.1)': '"GaugeSeries" has no attribute "observe"',
}


def test_mypy_refuses_a_wrong_update_and_passes_a_right_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    right, wrong = tmp_path / "right.py", tmp_path / "wrong.py"
    right.write_text(PREAMBLE + RIGHT)
    wrong.write_text(PREAMBLE + "".join(line + "\n" for line in WRONG))
    monkeypatch.chdir(ROOT)  # where mypy finds the package (an editable install's import hook is not followed)
    report, errors, status = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "mypy-cache"),
            "--follow-imports=silent",
            "--no-error-summary",
            str(right),
            str(wrong),
        ]
    )
    assert not errors, errors
    said = {
        (Path(match["file"]).name, int(match["line"])): match["message"]
        for match in re.finditer(r"^(?P<file>[^:\n]+):(?P<line>\d+): error: (?P<message>.*)$", report, re.MULTILINE)
    }
    first = PREAMBLE.count("\n") + 1
    assert said == {
        ("wrong.py", line): f"{message}  [attr-defined]" for line, message in enumerate(WRONG.values(), first)
    }, report
    assert status == 1
