"""``tpuscope hangs``: after every process of a job and every sidecar is gone, each worker's stacks and the verdict
are read back from what the sidecars logged (issue 54).

The lines are the sidecar's own (``HangWatch._say``, the code that writes them in ``tpuscope serve``), for a
four-worker job where worker 1 is stuck in compute while the others wait in sync; they reach the reader as a
sidecar's plain log, as ``kubectl logs --prefix`` prints them, and as Cloud Logging exports them (an array,
newest first, and one entry a line), with what Cloud Logging moves out of a payload moved out.
"""

from __future__ import annotations

import io
import json
import mmap
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import prometheus_client
import pytest

from tpuscope import cli, positions
from tpuscope.exporter import metrics
from tpuscope.exporter.hangs import HangWatch, Limits, Watched

WORKLOAD = "llm"
T0 = datetime(2026, 5, 1, 3, 0, tzinfo=UTC).timestamp()  # when the first verdict was logged
LIMIT = 300.0
THREAD = 140_001  # the thread that runs the steps (the main one)


def frame(file: str, line: int, function: str, code: str, *, library: bool = False) -> dict[str, Any]:
    return {"file": file, "line": line, "function": function, "code": code, "library": library}


def stacks_at(phase: str) -> dict[str, Any]:
    """A process's answer: its main thread in a collective (sync) or spinning in the job's code (compute), and a
    daemon thread waiting for input."""
    main = [frame("/app/job/train.py", 80, "<module>", "main()"), frame("/app/job/train.py", 60, "main", "step(s)")]
    if phase == "sync":
        main.append(frame("/app/job/train.py", 40, "step", "jax.block_until_ready(loss)"))
        main.append(
            frame("/usr/lib/python3/site-packages/jax/_src/api.py", 2900, "block_until_ready", "x.wait()", library=True)
        )
    else:
        main.append(frame("/app/job/train.py", 44, "step", "batch = fixup(batch)"))
        main.append(frame("/app/job/fixup.py", 12, "fixup", "while not done(batch): pass"))
    loader = [frame("/usr/lib/python3.11/threading.py", 1002, "_bootstrap", "self._bootstrap_inner()", library=True)]
    loader.append(frame("/usr/lib/python3.11/queue.py", 171, "get", "self.not_empty.wait()", library=True))
    return {
        "request": "1",
        "threads": [
            {"ident": THREAD, "name": "MainThread", "daemon": False, "frames": main},
            {"ident": 140_002, "name": "data-loader", "daemon": True, "frames": loader},
        ],
    }


def said(
    slice_: str,
    worker: int,
    state: str,
    phase: str,
    at: float,
    *,
    stacks: bool = True,
    seconds: float = 400.0,
    pid: int | None = None,
) -> dict[str, Any]:
    """The line the sidecar of ``worker`` writes in ``state`` (at step 1200, in ``phase``, there for ``seconds``),
    as JSON, written at ``at`` (Unix seconds): the test's clock, so it orders its lines as it pleases."""
    out = io.StringIO()
    watch = HangWatch(
        socket_path=Path("/nonexistent/s.sock"),
        socket_mode=0o600,
        metrics=metrics.register(prometheus_client.CollectorRegistry()),
        limits=Limits(),
        host_labels={"slice": slice_, "worker": str(worker)},
        stream=out,
    )
    answer = stacks_at(phase) if stacks else None
    watched = Watched(
        worker, lambda _: None, WORKLOAD, Path("r.position"), mmap.mmap(-1, positions.RECORD_BYTES), False
    )
    watched.frames = positions.top_frames(answer, THREAD) if answer else "unknown"
    now = time.monotonic()
    pid = 100 + worker if pid is None else pid
    position = positions.Position(pid=pid, step=1200, where=phase, since=now - seconds, thread=THREAD)
    severity = "WARNING" if state == "stuck" else "INFO"
    watch._say(watched, severity, state, position, limit=LIMIT, stacks=answer, now=now)
    line: dict[str, Any] = json.loads(out.getvalue())
    line["time"] = datetime.fromtimestamp(at, UTC).isoformat()
    line["tpuscope"]["since"] = datetime.fromtimestamp(at - seconds, UTC).isoformat()
    return line


def exported(line: dict[str, Any], pod: str) -> dict[str, Any]:
    """The line as ``gcloud logging read --format=json`` gives it back: what Cloud Logging takes from a payload
    (time, severity, labels) moved into the entry, the timestamp in nanoseconds."""
    moved = ("time", "severity", "logging.googleapis.com/labels")
    stamp = datetime.fromisoformat(line["time"]).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
    return {
        "insertId": f"{pod}-{stamp}",
        "jsonPayload": {k: v for k, v in line.items() if k not in moved},
        "labels": line["logging.googleapis.com/labels"],
        "logName": "projects/p/logs/stderr",
        "resource": {"type": "k8s_container", "labels": {"pod_name": pod, "container_name": "tpuscope"}},
        "severity": line["severity"],
        "timestamp": stamp,
    }


@pytest.fixture
def logs(tmp_path: Path) -> list[Path]:
    """What four sidecars of slice 0 and one of slice 1 logged, once their pods are gone."""
    sidecar = tmp_path / "sidecar-0.log"  # worker 0's and worker 3's sidecar logs, cat together
    sidecar.write_text(
        "2026-05-01 02:50:00 INFO tpuscope.exporter: serving :9478\n"
        + json.dumps(said("0", 0, "stuck", "sync", T0 + 1))
        + "\n"
        + "not json at all {\n"
        + json.dumps({"severity": "INFO", "message": "someone else's JSON line", "tpuscope": 3})
        + "\n"
        + json.dumps(said("0", 3, "stuck", "sync", T0 + 6, stacks=False))
        + "\n"
    )
    kubectl = tmp_path / "kubectl.log"  # kubectl logs --prefix of worker 2's sidecar: it saw its process end
    kubectl.write_text(
        "[pod/llm-w2/tpuscope] 2026-05-01 02:50:00 INFO tpuscope.exporter: serving :9478\n"
        f"[pod/llm-w2/tpuscope] {json.dumps(said('0', 2, 'stuck', 'sync', T0 + 2))}\n"
        f"[pod/llm-w2/tpuscope] {json.dumps(said('0', 2, 'ended while stuck', 'sync', T0 + 90, seconds=488))}\n"
    )
    # Worker 1, newest first: stuck at step 1200; before, stuck elsewhere and moved on (an earlier episode).
    earlier = said("0", 1, "stuck", "io", T0 - 600)
    entries = [
        exported(said("0", 1, "stuck", "compute", T0 + 3), "llm-w1"),
        exported(said("0", 1, "moved on", "compute", T0 - 500), "llm-w1"),
        exported(earlier, "llm-w1"),
    ]
    array = tmp_path / "gcloud.json"
    array.write_text(json.dumps(entries, indent=2))
    # Slice 1's worker 0 was stuck a while, then moved on: an export one entry a line.
    lines = tmp_path / "gcloud-lines.json"
    moved = [said("1", 0, "stuck", "io", T0 + 4), said("1", 0, "moved on", "compute", T0 + 30)]
    lines.write_text("".join(json.dumps(exported(line, "llm-s1-w0")) + "\n" for line in moved))
    return [sidecar, kubectl, array, lines]


def hangs(*arguments: str | Path, stdin: str = "") -> tuple[int, str, str]:
    """``tpuscope hangs ARGUMENTS``, run in this process: its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
    try:
        status = cli.main(["hangs", *map(str, arguments)])
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return status, out.getvalue(), err.getvalue()


def test_the_verdict_and_each_workers_stacks_are_read_back_from_the_sidecars_logs(logs: list[Path]) -> None:
    status, out, err = hangs(*logs)
    assert (status, err) == (0, ""), err
    head = out.splitlines()
    assert (
        head[0]
        == f"== workload {WORKLOAD}: 4 workers logged a stuck position; elsewhere than most: slice 0 worker 1 =="
    )
    assert head[1:4] == [
        "  3 at step 1200, sync: slice 0 workers 0, 2-3",
        "  1 at step 1200, compute: slice 0 worker 1",
        "  moved on since: slice 1 worker 0",
    ]
    odd = out.split("-- slice 0 worker 1 (pid 101, pod llm-w1), elsewhere than most --\n", 1)[1].split("\n\n")[0]
    assert odd.startswith("stuck at step 1200, compute since 2026-05-01 02:53:2"), odd  # 400 s before T0 + 3
    assert "for 7 min when logged (its limit: 5 min)" in odd
    assert "top frames: fixup (job/fixup.py:12) < step (job/train.py:44) < main (job/train.py:60)" in odd
    assert "Thread MainThread (ident 140001):\n" in odd
    assert '  File "/app/job/fixup.py", line 12, in fixup\n    while not done(batch): pass' in odd
    assert "Thread data-loader (ident 140002, daemon):" in odd
    assert out.index("slice 0 worker 1 (pid") < out.index("-- slice 0 worker 0 (pid 100)"), "the odd one first"
    assert "top frames: block_until_ready (jax/_src/api.py:2900) < step (job/train.py:40)" in out
    ended = out.split("-- slice 0 worker 2 (pid 102, pod llm-w2) --\n", 1)[1]
    assert "the process ended while stuck, at 2026-05-01 03:01:30 UTC" in ended.split("\n\n")[0]
    unknown = out.split("-- slice 0 worker 3 (pid 103) --\n", 1)[1]
    assert unknown.split("\n")[2].startswith("stacks unknown: the process did not answer in 5 s"), unknown
    assert "slice 1 worker 0 (pid" not in out and "step 1200, io" not in out, "moved on: no longer stuck"


def test_only_the_thread_that_runs_the_steps_and_as_json(logs: list[Path]) -> None:
    status, out, _ = hangs("--threads", "main", *logs)
    assert status == 0 and out.count("Thread MainThread") == 3 and "data-loader" not in out

    status, out, _ = hangs("--json", *logs)
    assert status == 0
    (verdict,) = json.loads(out)
    assert verdict["workload"] == WORKLOAD and verdict["stuck"] == 4
    assert verdict["elsewhere"] == [{"slice": "0", "worker": "1", "pid": 101}]
    assert [(w["worker"], w["phase"], w["elsewhere"], w["state"]) for w in verdict["workers"]] == [
        ("1", "compute", True, "stuck"),
        ("0", "sync", False, "stuck"),
        ("2", "sync", False, "ended while stuck"),
        ("3", "sync", False, "stuck"),
    ]
    assert [t["name"] for t in verdict["workers"][0]["threads"]] == ["MainThread", "data-loader"]
    assert verdict["workers"][3]["threads"] is None and "did not answer" in verdict["workers"][3]["stacks_unknown"]
    assert verdict["moved_on"] == [{"slice": "1", "worker": "0", "pid": 100, "logged": "2026-05-01T03:00:30+00:00"}]


def test_a_tie_names_nobody_and_standard_input_is_read(logs: list[Path]) -> None:
    lines = [said("0", w, "stuck", "sync" if w < 2 else "compute", T0 + w) for w in range(4)]
    status, out, _ = hangs(stdin="".join(json.dumps(line) + "\n" for line in lines))
    assert status == 0
    assert (
        out.splitlines()[0]
        == f"== workload {WORKLOAD}: 4 workers logged a stuck position; no place most of them share =="
    )
    assert "elsewhere than most" not in out

    status, out, _ = hangs("-", stdin=json.dumps(lines[0]) + "\n")
    assert status == 0 and "1 worker logged a stuck position; all at one place" in out


def test_no_verdict_exits_1_and_a_missing_file_2_with_the_others_still_read(logs: list[Path], tmp_path: Path) -> None:
    calm = tmp_path / "calm.log"
    calm.write_text("2026-05-01 02:50:00 INFO tpuscope.exporter: serving :9478\n" + logs[3].read_text())
    status, out, err = hangs(calm)
    assert (status, err) == (1, "")
    assert out == f"no hang verdicts in {calm} (1 process stuck, then moved on)\n"

    status, out, err = hangs("--json", calm)
    assert (status, json.loads(out)) == (1, []) and "no hang verdicts" in err

    missing = tmp_path / "gone.log"
    status, out, err = hangs(missing, *logs)
    assert status == 2
    assert err == f"tpuscope hangs: cannot read {missing}: No such file or directory\n"
    assert "elsewhere than most: slice 0 worker 1" in out, "the files that could be read are not lost"


def test_a_line_cut_short_is_counted_not_passed_over_quietly(tmp_path: Path) -> None:
    whole = json.dumps(said("0", 0, "stuck", "sync", T0))
    cut = tmp_path / "cut.log"
    cut.write_text(whole[: len(whole) // 2] + "\n")
    status, out, err = hangs(cut)
    assert status == 1 and "no hang verdicts" in out
    assert err == "tpuscope hangs: 1 line(s) of tpuscope.hang could not be read (cut short?), skipped\n"


def test_a_process_that_ended_stuck_then_restarted_is_no_longer_the_workers_verdict() -> None:
    """Worker 0's process ended stuck (exit_on_hang); its restart, another pid, got stuck later elsewhere."""
    lines = [
        said("0", 0, "stuck", "sync", T0),
        said("0", 0, "ended while stuck", "sync", T0 + 60, seconds=460),
        said("0", 0, "stuck", "io", T0 + 900, pid=200),
        said("0", 1, "stuck", "io", T0 + 901),
    ]
    status, out, _ = hangs(stdin="".join(json.dumps(line) + "\n" for line in lines))
    assert status == 0
    assert out.splitlines()[:3] == [
        f"== workload {WORKLOAD}: 2 workers logged a stuck position; all at one place ==",
        "  2 at step 1200, io: slice 0 workers 0-1",
        "  ended stuck, then restarted: slice 0 worker 0",
    ]
    assert "-- slice 0 worker 0 (pid 200) --" in out and "(pid 100)" not in out
