"""``tpuscope hangs``: each worker's stacks and the verdict of a hang, read back from what the sidecars logged.

By the time someone looks at a hung job its pods are often gone: killed by hand, restarted by their JobSet, or
ended by the job itself (``exit_on_hang``). What stays is what each host's sidecar wrote on stderr when its
process got stuck (tpuscope.exporter.hangs): one JSON line per verdict, which ``kubectl logs`` shows and Cloud
Logging keeps as a structured entry. This command reads any mix of them: a sidecar's plain log (its other lines
are skipped), ``kubectl logs --prefix``'s ``[pod/NAME/CONTAINER] {...}`` lines, ``gcloud logging read
--format=json``'s array of entries or such entries one a line. Cloud Logging moves a line's ``time`` and
``severity`` out of its payload, so an entry's own ``timestamp`` stands in for them.

For each workload, each process's latest word decides, in the order the lines were written (not read: an export
lists the newest first): "stuck" stands, "moved on" clears it, "ended while stuck" keeps it (the process died
there; a later process of the same worker, a restart, supersedes it). Then, as the rules decide it in Prometheus
(:func:`tpuscope.positions.elsewhere`), the workers stuck elsewhere than most: the likely one the others waited for.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

from tpuscope import positions
from tpuscope.durations import human as duration
from tpuscope.report.window import utc

STUCK, MOVED_ON, ENDED = "stuck", "moved on", "ended while stuck"  # a verdict's states (HangWatch._say)
_STATES = (STUCK, MOVED_ON, ENDED)
LOGGER = "tpuscope.hang"  # the lines' logger: one that names it and cannot be read is counted, not skipped quietly
_POD = re.compile(r"^\[pod/([^/\]]+)/[^\]]*\]")  # kubectl logs --prefix
_DECODER = json.JSONDecoder()


@dataclass
class Line:
    """One verdict as a sidecar logged it: its ``tpuscope`` object, when it was written, the pod where known."""

    verdict: dict[str, Any]
    time: float
    order: int  # in the input, for lines of one time
    pod: str = ""


@dataclass
class Process:
    """One job process's story in the logs: its latest word, and its latest stuck verdict (with the stacks)."""

    workload: str
    slice: str
    worker: str
    pid: int | None
    pod: str = ""
    state: str = ""
    logged: float = 0.0  # when its latest line was written
    latest: dict[str, Any] = field(default_factory=dict)  # that line's verdict
    stuck: dict[str, Any] | None = None  # the stuck verdict its state refers to; None: moved on (or never logged)
    ended: float | None = None  # when it ended while stuck
    elsewhere: bool = False

    @property
    def verdict(self) -> dict[str, Any]:
        """The verdict to show: the stuck line's (position, frames, stacks), else the latest."""
        return self.stuck if self.stuck is not None else self.latest

    @property
    def where(self) -> tuple[int | None, str]:
        return (self.verdict.get("step"), str(self.verdict.get("phase", "unknown")))

    @property
    def name(self) -> str:
        return _worker_name(self.slice, self.worker)

    def sort_key(self) -> tuple[Any, ...]:
        return (not self.elsewhere, _number(self.slice), _number(self.worker), self.pid or 0)


@dataclass
class Hang:
    """One workload's verdict: its stuck processes (those elsewhere than most first), and those that moved on."""

    workload: str
    stuck: list[Process]
    moved_on: list[Process]
    restarted: list[Process]  # ended while stuck, then a later process of their worker went on

    @property
    def elsewhere(self) -> list[Process]:
        return [p for p in self.stuck if p.elsewhere]

    def places(self) -> list[tuple[tuple[int | None, str], list[Process]]]:
        """The positions the stuck processes share, the most shared first."""
        grouped: dict[tuple[int | None, str], list[Process]] = {}
        for process in self.stuck:
            grouped.setdefault(process.where, []).append(process)
        return sorted(grouped.items(), key=lambda item: (-len(item[1]), _where(*item[0])))


# --- reading ---------------------------------------------------------------------------------------------------------
class Reader:
    """Every verdict line of the inputs given to :meth:`read`, and how many lines looked like one but were not."""

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.unreadable = 0

    def read(self, stream: Iterable[str]) -> None:
        lines = iter(stream)
        first = next((line for line in lines if line.strip()), None)
        if first is None:
            return
        opening = first.strip()
        if opening.startswith("[") and opening[1:].lstrip()[:1] in ("", "{", "]"):  # a JSON array, not [pod/...]
            whole = [first, *lines]
            try:
                entries = json.loads("".join(whole))
            except ValueError:  # not one array after all: line by line
                entries, lines = None, iter(whole[1:])
            if entries is not None:
                for entry in entries if isinstance(entries, list) else [entries]:
                    self._object(entry, "", unread_if_ours=False)
                return
        self._line(first)
        for line in lines:
            self._line(line)

    def _line(self, text: str, pod: str = "") -> None:
        start = text.find("{")
        if start < 0 or '"tpuscope"' not in text:  # cheap: most lines of a log are someone else's
            return
        if prefix := _POD.match(text):
            pod = prefix.group(1)
        try:
            found, _ = _DECODER.raw_decode(text, start)  # what follows it is not ours
        except ValueError:
            if LOGGER in text:
                self.unreadable += 1  # cut short: a line past the log's limit, a file copied while written
            return
        self._object(found, pod, unread_if_ours=LOGGER in text)

    def _object(self, entry: Any, pod: str, *, unread_if_ours: bool) -> None:
        if not isinstance(entry, dict):
            return
        payload, stamp = entry, None
        if isinstance(entry.get("jsonPayload"), dict):  # a Cloud Logging entry
            payload, stamp = entry["jsonPayload"], entry.get("timestamp") or entry.get("receiveTimestamp")
            resource = entry.get("resource")
            labels = resource.get("labels") if isinstance(resource, dict) else None
            pod = pod or str((labels if isinstance(labels, dict) else {}).get("pod_name", ""))
        elif isinstance(entry.get("textPayload"), str):  # an entry whose line the agent did not parse
            self._line(entry["textPayload"], pod)
            return
        verdict = payload.get("tpuscope")
        if not (isinstance(verdict, dict) and verdict.get("kind") == "hang" and verdict.get("state") in _STATES):
            if unread_if_ours:
                self.unreadable += 1
            return
        written = _time(payload.get("time")) or _time(stamp)
        if written is None:  # since + seconds is when the sidecar wrote it, to the rounding of seconds
            since = _time(verdict.get("since"))
            written = since + float(verdict.get("seconds") or 0.0) if since is not None else 0.0
        self.lines.append(Line(verdict, written, len(self.lines), pod))


def _time(value: Any) -> float | None:
    """Unix seconds from an RFC 3339 time (any digits of fraction, ``Z`` or an offset), else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo else None


# --- deciding --------------------------------------------------------------------------------------------------------
def decide(lines: Iterable[Line], workload: str | None = None) -> list[Hang]:
    """Each workload's verdict from its lines, in any order (``workload``: only that one's)."""
    processes: dict[tuple[str, str, str, int | None], Process] = {}
    for line in sorted(lines, key=lambda line: (line.time, line.order)):
        v = line.verdict
        name = str(v.get("workload", ""))
        if workload is not None and name != workload:
            continue
        pid = v.get("pid") if isinstance(v.get("pid"), int) else None
        key = (name, str(v.get("slice", "")), str(v.get("worker", "")), pid)
        process = processes.setdefault(key, Process(*key))
        process.pod = line.pod or process.pod
        process.state, process.logged, process.latest = v["state"], line.time, v
        if v["state"] == STUCK:
            process.stuck, process.ended = v, None
        elif v["state"] == ENDED:
            process.ended = line.time
        else:
            process.stuck, process.ended = None, None
    hangs = []
    for name in sorted({p.workload for p in processes.values()}):
        mine = [p for p in processes.values() if p.workload == name]
        restarted = [p for p in mine if _superseded(p, mine)]
        stuck = [p for p in mine if p.state in (STUCK, ENDED) and p not in restarted]
        odd = set(positions.elsewhere({(p.slice, p.worker, p.pid): p.where for p in stuck}))
        for process in stuck:
            process.elsewhere = (process.slice, process.worker, process.pid) in odd
        moved_on = [p for p in mine if p.state == MOVED_ON]
        hangs.append(Hang(name, *(sorted(group, key=Process.sort_key) for group in (stuck, moved_on, restarted))))
    return hangs


def _superseded(process: Process, processes: list[Process]) -> bool:
    """It ended while stuck, and then another process of its worker got to a position of its own: a restart."""
    if process.ended is None:
        return False
    return any(
        other is not process
        and (other.slice, other.worker) == (process.slice, process.worker)
        and (_time(other.latest.get("since")) or 0.0) > process.ended
        for other in processes
    )


# --- writing ---------------------------------------------------------------------------------------------------------
def text(hangs: list[Hang], threads: str = "all") -> Iterator[str]:
    """The verdicts as lines for a terminal or a ticket: each workload's, then each stuck worker's stacks."""
    for hang in hangs:
        if not hang.stuck:
            continue
        yield f"== workload {hang.workload}: {_headline(hang)} =="
        for (step, phase), group in hang.places():
            yield f"  {len(group)} at {_where(step, phase)}: {_names(group)}"
        if hang.moved_on:
            yield f"  moved on since: {_names(hang.moved_on)}"
        if hang.restarted:
            yield f"  ended stuck, then restarted: {_names(hang.restarted)}"
        for process in hang.stuck:
            yield ""
            yield from _process(process, threads)
        yield ""


def _headline(hang: Hang) -> str:
    workers = {(p.slice, p.worker) for p in hang.stuck}
    said = f"{len(workers)} worker{'s' if len(workers) != 1 else ''} logged a stuck position"
    if len(hang.stuck) > len(workers):
        said += f" ({len(hang.stuck)} processes)"
    places = hang.places()
    if odd := hang.elsewhere:
        return f"{said}; elsewhere than most: {_names(odd)}"
    if len(places) == 1:
        return f"{said}; all at one place"
    return f"{said}; no place most of them share"


def _process(process: Process, threads: str) -> Iterator[str]:
    v = process.verdict
    who = f"{process.name} (pid {process.pid if process.pid is not None else 'unknown'}"
    who += f", pod {process.pod})" if process.pod else ")"
    yield f"-- {who}{', elsewhere than most' if process.elsewhere else ''} --"
    since = _time(v.get("since"))
    at = f"since {utc(since)}" if since is not None else "since an unknown time"
    limit = v.get("limit_seconds")
    yield (
        f"stuck at {_where(*process.where)} {at}: for {duration(float(v.get('seconds') or 0.0))} when logged"
        + (f" (its limit: {duration(float(limit))})" if isinstance(limit, int | float) else "")
    )
    if process.ended is not None:
        there = f", after {duration(process.ended - since)} there" if since is not None else ""
        yield f"the process ended while stuck, at {utc(process.ended)}{there}"
    if process.stuck is None:
        yield "stacks unknown: the line that logged them is not in the input (only the process's end is)"
        return
    yield f"top frames: {v.get('frames') or 'unknown'}"
    if v.get("threads") is None:
        yield f"stacks unknown: {v.get('stacks_unknown') or 'the sidecar logged none'}"
        return
    for thread in _threads(v, threads):
        yield from _traceback(thread)


def _threads(verdict: dict[str, Any], which: str) -> list[dict[str, Any]]:
    threads = [t for t in verdict.get("threads") or [] if isinstance(t, dict)]
    if which == "main":  # the thread that runs the steps: the one the verdict names, else the first (main) one
        named = [t for t in threads if "thread" in verdict and t.get("ident") == verdict["thread"]]
        return named or threads[:1]
    return threads


def _traceback(thread: dict[str, Any]) -> Iterator[str]:
    """One thread's stack as Python prints a traceback: outermost frame first, the code under each."""
    notes = [f"ident {thread.get('ident', '?')}"]
    if thread.get("daemon"):
        notes.append("daemon")
    yield f"Thread {thread.get('name', '?')} ({', '.join(notes)}):"
    for frame in [f for f in thread.get("frames") or [] if isinstance(f, dict)]:
        yield f'  File "{frame.get("file", "?")}", line {frame.get("line", 0)}, in {frame.get("function", "?")}'
        if code := str(frame.get("code") or "").strip():
            yield f"    {code}"


def as_json(hangs: list[Hang], threads: str = "all") -> list[dict[str, Any]]:
    """The verdicts for a script: per workload its stuck workers (with their stacks), and those that moved on."""

    def process(p: Process) -> dict[str, Any]:
        v = {k: val for k, val in p.verdict.items() if k not in ("kind", "state")}
        if v.get("threads") is not None:
            v["threads"] = _threads(p.verdict, threads)
        return {
            **v,
            "slice": p.slice,
            "worker": p.worker,
            "pid": p.pid,
            "pod": p.pod or None,
            "state": p.state,
            "logged": _iso(p.logged),
            "ended": _iso(p.ended) if p.ended is not None else None,
            "elsewhere": p.elsewhere,
        }

    def who(p: Process) -> dict[str, Any]:
        return {"slice": p.slice, "worker": p.worker, "pid": p.pid}

    return [
        {
            "workload": hang.workload,
            "stuck": len({(p.slice, p.worker) for p in hang.stuck}),
            "elsewhere": [who(p) for p in hang.elsewhere],
            "places": [
                {"step": step, "phase": phase, "workers": [who(p) for p in group]}
                for (step, phase), group in hang.places()
            ],
            "workers": [process(p) for p in hang.stuck],
            "moved_on": [{**who(p), "logged": _iso(p.logged)} for p in hang.moved_on],
            "restarted": [{**who(p), "ended": _iso(p.ended or 0.0)} for p in hang.restarted],
        }
        for hang in hangs
        if hang.stuck
    ]


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat()


def _where(step: int | None, phase: str) -> str:
    return f"step {step}, {phase}" if step is not None else f"no step yet, {phase}"


def _worker_name(slice_: str, worker: str) -> str:
    return f"slice {slice_ or '?'} worker {worker or '?'}"


def _names(processes: list[Process]) -> str:
    """``slice 0 workers 0-2, 5; slice 1 worker 3``: the workers, a slice's numbers in runs."""
    by_slice: dict[str, list[str]] = {}
    for p in sorted(processes, key=lambda p: (_number(p.slice), _number(p.worker))):
        names = by_slice.setdefault(p.slice, [])
        if p.worker not in names:
            names.append(p.worker)
    parts = []
    for slice_, workers in by_slice.items():
        parts.append(f"slice {slice_ or '?'} worker{'s' if len(workers) > 1 else ''} {_runs(workers)}")
    return "; ".join(parts)


def _runs(workers: list[str]) -> str:
    if not all(w.isdigit() for w in workers):
        return ", ".join(w or "?" for w in workers)
    numbers, runs = [int(w) for w in workers], []
    start = previous = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == previous + 1:
            previous = n
            continue
        runs.append(str(start) if start == previous else f"{start}-{previous}")
        if n is not None:
            start = previous = n
    return ", ".join(runs)


def _number(value: str) -> tuple[int, str]:
    return (int(value), "") if value.isdigit() else (1 << 62, value)


# --- the command -----------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read the hang verdicts the sidecars logged (tpuscope serve writes one JSON line on stderr when a job "
        "process is stuck, with every thread's Python stacks) and print, for each workload, where each worker was "
        "stuck, the workers elsewhere than most (the likely one the others waited for), and each stuck worker's "
        "stacks as a traceback. Reads a sidecar's log as it is, kubectl logs --prefix, and Cloud Logging's "
        "gcloud logging read --format=json, in any mix: the pods may be long gone. Exits 0 when it found a stuck "
        "verdict, 1 when none, 2 when an input cannot be read."
    )
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="sidecar logs, kubectl logs output or Cloud Logging exports; - or none: standard input",
    )
    parser.add_argument("--workload", help="only this workload's verdict (default: every workload in the logs)")
    parser.add_argument(
        "--threads",
        choices=("all", "main"),
        default="all",
        help="the stacks to print: every thread's, or only the one that runs the steps (default all)",
    )
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON, for a script")


def main(args: argparse.Namespace) -> int:
    return run(args.files, args.workload, args.threads, as_json_output=args.json)


def run(
    files: list[str],
    workload: str | None = None,
    threads: str = "all",
    *,
    as_json_output: bool = False,
    stdin: IO[str] | None = None,
    out: IO[str] | None = None,
) -> int:
    out = out or sys.stdout
    sources = files or ["-"]
    reader, failed = Reader(), False
    for source in sources:
        try:
            if source == "-":
                reader.read(stdin or sys.stdin)
            else:
                with open(source, encoding="utf-8", errors="replace") as f:
                    reader.read(f)
        except OSError as e:  # the others are still read: one missing file loses nothing of theirs
            print(f"tpuscope hangs: cannot read {source}: {e.strerror or e}", file=sys.stderr)
            failed = True
    if reader.unreadable:
        print(
            f"tpuscope hangs: {reader.unreadable} line(s) of {LOGGER} could not be read (cut short?), skipped",
            file=sys.stderr,
        )
    hangs = decide(reader.lines, workload)
    named = ", ".join("standard input" if s == "-" else s for s in sources)
    found = any(hang.stuck for hang in hangs)
    try:
        if as_json_output:
            print(json.dumps(as_json(hangs, threads), indent=1), file=out)
        else:
            for line in text(hangs, threads):
                print(line, file=out)
        if not found:
            cleared = sum(len(hang.moved_on) for hang in hangs)
            said = f"no hang verdicts in {named}" + (f" for workload {workload}" if workload else "")
            if cleared:
                said += f" ({cleared} process{'es' if cleared != 1 else ''} stuck, then moved on)"
            print(said, file=sys.stderr if as_json_output else out)
    except BrokenPipeError:  # piped into head, which read enough: not an error, and nothing more to write
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    return 2 if failed else 0 if found else 1
