"""Spans with no collector: only to a file the job names, capped and rotated, and said where; none by default."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tpuscope.bench.timing import empty_steps
from tpuscope.tracing import Monitor, Traces
from tpuscope.tracing.span_export import JsonLinesExporter, exporter

CAP = 200_000


@pytest.fixture
def state_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No collector and no chosen spans file (tests/conftest.py chooses one), and a fresh XDG state directory."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:  # endpoints, OTEL_TRACES_EXPORTER, OTEL_SDK_DISABLED
        monkeypatch.delenv(name)
    monkeypatch.delenv("TPUSCOPE_SPANS_FILE", raising=False)
    monkeypatch.delenv("TPUSCOPE_SPANS_MAX_BYTES", raising=False)
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of ``path`` as JSON: a line cut in two, or two run together, fails to parse."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_long_job_keeps_its_newest_spans_within_the_cap_in_the_file_it_named(
    state_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    short_tmp: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("TPUSCOPE_SPANS_MAX_BYTES", str(CAP))
    path = tmp_path / "spans" / "long-job.jsonl"
    began = time.perf_counter()
    # The default sampling: 1 in 100 steps and the slow ones, about 3.5 MB of spans in all.
    with (
        caplog.at_level(logging.INFO, logger="tpuscope"),
        Monitor("long-job", socket=short_tmp / "absent.sock", traces=Traces(spans_file=path)) as mon,
    ):
        empty_steps(mon, 100_000)
    print(f"100,000 steps and the close: {time.perf_counter() - began:.1f} s")

    assert list(workdir.iterdir()) == [] and not state_home.exists()
    rotated = path.with_name(path.name + ".1")
    assert sorted(path.parent.iterdir()) == [path, rotated]
    sizes = path.stat().st_size, rotated.stat().st_size
    print(f"spans file {sizes[0]} bytes, rotated {sizes[1]} bytes")
    assert 0 < sizes[0] <= CAP and 0 < sizes[1] <= CAP
    newest, older = read_lines(path), read_lines(rotated)
    # The rotation can fall anywhere, even between the last 1-in-100 step and the slow ones kept after it: the
    # two files together hold the newest steps, older in `.1`, in order.
    kept = [r["attributes"]["tpuscope.step"] for r in older + newest if r["name"] == "step"]
    assert 99_900 in kept, "the last 1-in-100 step is kept"
    assert kept == sorted(kept), "the rotated file holds the older spans"
    assert newest[-1]["name"] == "lifecycle" and newest[-1]["events"][0]["name"] == "stop"
    said = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert said == [f"tpuscope: spans go to {path}, rotated at {CAP} bytes ($TPUSCOPE_SPANS_MAX_BYTES)"]


def test_with_no_collector_and_no_file_a_job_writes_no_spans_anywhere(state_home: Path, short_tmp: Path) -> None:
    """Before issue 34 such a job got a spans file per process under the XDG state directory that nothing read."""
    job = (
        "import sys\n"
        "from tpuscope.tracing import Monitor\n"
        "from tpuscope.bench.timing import empty_steps\n"
        f"with Monitor('quiet', socket={str(short_tmp / 'absent.sock')!r}) as mon:\n"
        "    empty_steps(mon, 1000)\n"
        "print(mon.spans, 'opentelemetry.sdk' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True, timeout=60, cwd=short_tmp)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["None", "False"]
    assert not state_home.exists() and sorted(p.name for p in short_tmp.iterdir()) == []
    assert "spans" not in run.stderr


def provider_for(span_exporter: JsonLinesExporter, service: str) -> TracerProvider:
    """Spans written as each ends (SimpleSpanProcessor): the order of writes is the order of the calls."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    return provider


def test_writers_sharing_a_file_follow_its_rotation_and_lose_no_line(tmp_path: Path) -> None:
    """Two exporters take turns on one file; whichever rotates it, the other writes to the new file after."""
    path, cap = tmp_path / "shared.jsonl", 40_000
    writers = [JsonLinesExporter(path, cap), JsonLinesExporter(path, cap)]
    tracers = [provider_for(w, f"writer{i}").get_tracer("test") for i, w in enumerate(writers)]
    spans = 0
    while not writers[0].rotated.exists() or spans % 2:  # until a rotation, then one turn each
        tracers[spans % 2].start_span(f"span{spans}").end()
        spans += 1
    for _ in range(2):
        tracers[spans % 2].start_span(f"span{spans}").end()
        spans += 1
    for writer in writers:
        writer.shutdown()

    older, newest = read_lines(writers[0].rotated), read_lines(path)
    assert [r["name"] for r in older + newest] == [f"span{n}" for n in range(spans)]
    assert {r["resource"]["service.name"] for r in newest[-2:]} == {"writer0", "writer1"}
    assert 0 < writers[0].rotated.stat().st_size <= cap and 0 < path.stat().st_size <= cap


def test_concurrent_writers_rotating_a_shared_file_cut_no_line_and_keep_the_cap(tmp_path: Path) -> None:
    path, cap, spans = tmp_path / "shared.jsonl", 30_000, 150
    writers = [JsonLinesExporter(path, cap) for _ in range(4)]

    def write(index: int) -> None:
        tracer = provider_for(writers[index], f"writer{index}").get_tracer("test")
        for n in range(spans):
            tracer.start_span("span", attributes={"n": n}).end()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(writers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for writer in writers:
        writer.shutdown()
    assert sum(w.dropped for w in writers) == 0
    records = read_lines(writers[0].rotated) + read_lines(path)
    assert len(records) * 2 < len(writers) * spans, "the writers rotated the file several times"
    assert writers[0].rotated.stat().st_size <= cap and path.stat().st_size <= cap
    # Rotation drops the oldest file whole: what is left of each writer is its latest spans, none missing between.
    for index in range(len(writers)):
        kept = [r["attributes"]["n"] for r in records if r["resource"]["service.name"] == f"writer{index}"]
        assert kept == list(range(spans - len(kept), spans)), index


def test_spans_that_cannot_be_written_are_counted_and_said_once_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "spans"
    writer = JsonLinesExporter(directory / "x.jsonl", 10_000)
    tracer = provider_for(writer, "lost").get_tracer("test")
    tracer.start_span("written").end()
    shutil.rmtree(directory)
    directory.write_text("a file where the directory was: nothing can be written under it")
    for n in range(100):
        tracer.start_span(f"lost{n}").end()
    writer.shutdown()
    assert writer.dropped == 100
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot write spans to" in m for m in messages) == 1, messages
    assert any("100 spans not written" in m for m in messages), messages
    assert not any("Exception while exporting" in m for m in messages), "export raised into the SDK"


@pytest.mark.parametrize("value", ["0", "-1", "64MiB", "lots"])
def test_a_bad_cap_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match="TPUSCOPE_SPANS_MAX_BYTES"):
        exporter(environ={"TPUSCOPE_SPANS_MAX_BYTES": value, "TPUSCOPE_SPANS_FILE": "spans.jsonl"})


def test_a_monitor_with_a_bad_cap_runs_without_spans_and_says_why(
    state_home: Path, monkeypatch: pytest.MonkeyPatch, short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TPUSCOPE_SPANS_MAX_BYTES", "64MiB")
    with Monitor(
        "capped", socket=short_tmp / "absent.sock", traces=Traces(spans_file=short_tmp / "spans.jsonl")
    ) as mon:
        empty_steps(mon, 10)
    assert mon.spans is None
    assert "spans are off: TPUSCOPE_SPANS_MAX_BYTES='64MiB'" in caplog.text
    assert not state_home.exists()
