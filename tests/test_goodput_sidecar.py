"""Goodput as a real sidecar books it: a ledger per process, downtime while a workload is down, the wall time
as the denominator, and a final scrape after SIGTERM (docs/goodput.md)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tpuscope import catalog, events
from tpuscope.scrape import Scrape
from tpuscope.testing.waiting import last_scrape_before_exit, scrape_until, sidecar_rounds, wait_for
from tpuscope.tracing import Monitor
from tpuscope.workload.sidecar import SidecarProcess

GOODPUT, WALL, DOWN = catalog.GOODPUT.name, catalog.GOODPUT_WALL.name, catalog.WORKLOAD_DOWN_SINCE.name
PROCESSES = catalog.WORKLOAD_PROCESSES.name
LINGER_S = 20.0  # --shutdown-linger: a sidecar that lingers when it should not takes this long to stop
STEP_S = 0.02  # each step of job() sleeps this long: the least a step can take


def booked(scrape: Scrape, workload: str) -> dict[str, float]:
    return {s.labels["category"]: s.value for s in scrape.find(GOODPUT, workload=workload) if s.value}


def job(socket: Path, workload: str, steps: int, then: str = "") -> str:
    """A job's source: ``steps`` steps of STEP_S each, its Monitor closed cleanly, then ``then``."""
    return (
        "import time\n"
        "from tpuscope.tracing import Monitor\n"
        f"mon = Monitor({workload!r}, socket={str(socket)!r}, traces=False)\n"
        f"for n in range({steps}):\n"
        "    with mon.step(n):\n"
        f"        time.sleep({STEP_S})\n"
        f"{then or 'mon.close()'}\n"
    )


def test_two_processes_of_one_workload_book_no_lost_time(sidecar: SidecarProcess) -> None:
    """One process per GPU: two ranks of one workload step 20 times each, side by side, and stop cleanly. (One
    ledger for both read rank B's step n after rank A's as a restart: 2 clean ranks of 20 steps booked 1.05 s
    productive and 0.95 s lost.)"""
    source = job(sidecar.socket, "ranks", 20)
    launched = time.monotonic()
    ranks = [subprocess.Popen([sys.executable, "-c", source]) for _ in range(2)]
    assert [rank.wait(timeout=60) for rank in ranks] == [0, 0]
    ran = time.monotonic() - launched
    scrape = scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, workload="ranks") == 40)
    scrape = scrape_until(sidecar.url, lambda s: not s.has(PROCESSES, workload="ranks"))
    seconds = booked(scrape, "ranks")
    assert "lost" not in seconds
    # At least the steps' sleeps, at most both processes' whole lives.
    assert 2 * 20 * STEP_S <= seconds["productive"] <= 2 * ran
    assert sum(seconds.values()) == pytest.approx(scrape.value(WALL, workload="ranks"), rel=0.02)


def test_two_threads_stepping_one_monitor_book_no_lost_time(sidecar: SidecarProcess) -> None:
    """Two threads step one Monitor with the same step numbers: one process, no restart."""
    with Monitor("threads", socket=sidecar.socket, traces=False) as mon:

        def loop() -> None:
            for n in range(20):
                with mon.step(n):
                    time.sleep(0.01)

        threads = [threading.Thread(target=loop) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    # Its connection closed after the last step: once the ingest has seen it go, every step has been booked.
    scrape = scrape_until(
        sidecar.url,
        lambda s: s.has(catalog.STEPS.name, workload="threads") and not s.has(PROCESSES, workload="threads"),
    )
    assert scrape.value(catalog.STEPS.name, workload="threads") == 40
    seconds = booked(scrape, "threads")
    assert "lost" not in seconds
    # Their steps overlap: booked up to the process's wall time, not twice over.
    assert sum(seconds.values()) == pytest.approx(scrape.value(WALL, workload="threads"), abs=0.02)


def test_a_connection_that_goes_ends_its_ledger_whatever_it_sent_last(sidecar: SidecarProcess) -> None:
    """A connection that sends a step after its stop, or that takes another workload's name, is a process the
    sidecar books while it is there, and not after: the wall time stops growing when it goes."""
    witness = Monitor("witness", socket=sidecar.socket, traces=False)  # connected throughout: counts the bookings
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as job:
        job.connect(str(sidecar.socket))
        for event in (
            events.Lifecycle(workload="late", state="start"),
            events.Lifecycle(workload="late", state="stop"),
            events.Step(workload="late", step=1, duration_s=0.01, compute_s=0.01),  # after its stop
            events.Step(workload="renamed", step=2, duration_s=0.01, compute_s=0.01),  # and then another name
        ):
            job.send(events.encode(event))
        scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, workload="renamed") == 1)
    # Closed: the ingest sees it go, and books its wall time as it does.
    before = scrape_until(
        sidecar.url, lambda s: not s.has(PROCESSES, workload="late") and not s.has(PROCESSES, workload="renamed")
    )
    after = sidecar_rounds(sidecar.url, "witness", 2)  # the wall time is booked once a round
    witness.close()
    for workload in ("late", "renamed"):
        assert after.present(WALL, workload=workload) == before.present(WALL, workload=workload), workload
        assert not after.has(DOWN, workload=workload)


def test_a_killed_job_is_down_until_it_starts_again_and_the_gap_is_downtime(sidecar: SidecarProcess) -> None:
    """SIGKILL: its unsaved steps are lost, the workload is down from the kill, its downtime grows while it
    lasts, and the next start ends it. Then the categories add up to the wall time."""
    killed = job(sidecar.socket, "down", 5, then="import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    launched = time.time()
    assert subprocess.run([sys.executable, "-c", killed], timeout=60).returncode == -signal.SIGKILL
    gone = time.time()
    first = scrape_until(sidecar.url, lambda s: s.has(DOWN, workload="down"))
    since = first.present(DOWN, workload="down")  # its last event, filed at its send or (soon after) its receipt
    assert launched <= since <= time.time()
    assert 5 * STEP_S <= booked(first, "down")["lost"] <= gone - launched
    downtime_before = booked(first, "down").get("downtime", 0.0)
    # Booked once a round while it lasts, not only when the next start ends it; never ahead of the clock.
    later = scrape_until(sidecar.url, lambda s: booked(s, "down").get("downtime", 0.0) > downtime_before)
    assert booked(later, "down")["downtime"] <= time.time() - since
    back = time.time()
    with Monitor("down", socket=sidecar.socket, traces=False) as mon, mon.step(0):
        time.sleep(STEP_S)
    scrape = scrape_until(sidecar.url, lambda s: (s.value(GOODPUT, workload="down", category="productive") or 0) > 0)
    seen = time.time()  # the new start was filed before this: it books productive time only after it
    scrape = scrape_until(sidecar.url, lambda s: not s.has(PROCESSES, workload="down"))
    assert not scrape.has(DOWN, workload="down")
    seconds = booked(scrape, "down")
    # From its last event to the next start, which the test sent after `back` and the sidecar had filed by `seen`.
    assert back - since <= seconds["downtime"] <= seen - since
    assert sum(seconds.values()) == pytest.approx(scrape.value(WALL, workload="down"), abs=0.05)


def test_after_sigterm_the_sidecar_serves_until_a_scrape_reads_the_final_state(short_tmp: Path) -> None:
    """On Kubernetes the job and its sidecar get SIGTERM together. The sidecar serves on until the job has gone
    and a scrape has read what it booked last (the steps its clean stop made productive), then exits. (It used
    to exit about a second after SIGTERM: with scrapes 15 s apart, the final booking was rarely seen.)"""
    linger = ("--shutdown-linger", f"{LINGER_S:g}s")
    with SidecarProcess(short_tmp / "a.sock", "127.0.0.1:0", *linger) as sidecar:
        mon = Monitor("finishing", socket=sidecar.socket, traces=False)
        started = time.perf_counter()
        with mon.step(0):
            time.sleep(STEP_S)
        took = time.perf_counter() - started  # a loaded machine oversleeps (a fresh-clone CI: 30 ms)
        scrape = scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, workload="finishing") == 1)
        assert "productive" not in booked(scrape, "finishing")  # pending until its clean stop
        sidecar.proc.send_signal(signal.SIGTERM)
        wait_for(
            lambda: "until a scrape reads the final state" in sidecar.log(),
            20,
            "the linger after SIGTERM",
            detail=sidecar.log,
        )
        # A scrape now is the final one to a sidecar that forgets its job is connected: it would exit at its next
        # look (every 0.1 s). That it does not is seen only as time passing.
        Scrape.fetch(sidecar.url)
        time.sleep(1.0)
        assert "the final state was scraped" not in sidecar.log()
        assert sidecar.proc.poll() is None, "it stopped with its job still connected"
        mon.close()
        # Scraped as Prometheus scrapes it, again and again, until it exits (a fresh-clone run scraped once, before
        # the sidecar saw the job leave, and the sidecar rightly lingered on). Stopping its threads takes seconds on a
        # loaded machine (a fresh-clone CI run: over 5), so the wait is long.
        final = last_scrape_before_exit(
            sidecar.url,
            lambda: sidecar.proc.poll() is not None,
            lambda scrape: scrape.has(WALL, workload="finishing"),
            60,
            detail=sidecar.log,
        )
        assert sidecar.proc.wait(timeout=30) == 0, sidecar.log()
        # It exits for a scrape, not for the linger's end (20 s): its log says so.
        assert "the final state was scraped" in sidecar.log(), sidecar.log()
        assert STEP_S <= booked(final, "finishing")["productive"] <= took
    # Nothing scraped this one: it has nothing to wait for.
    with SidecarProcess(short_tmp / "b.sock", "127.0.0.1:0", *linger) as unscraped:
        started = time.monotonic()
        assert unscraped.stop() == 0
        assert time.monotonic() - started < LINGER_S
        assert "until a scrape reads the final state" not in unscraped.log()


def test_custom_badput_is_served_as_its_own_category_and_the_categories_still_add_up(sidecar: SidecarProcess) -> None:
    """Issue 57: an eval between two steps and a check inside one, marked with ``mon.badput``. The sidecar serves each
    as it arrives, as long as the job measured it; the eval is no longer ``other`` and the check comes out of the
    step's productive time."""
    with Monitor("marked", socket=sidecar.socket, traces=False) as mon:
        for n in range(10):
            with mon.step(n):
                time.sleep(STEP_S)
                if n == 5:
                    with mon.badput("sdc_check"):
                        time.sleep(0.05)
            if n == 3:
                with mon.badput("eval"):
                    time.sleep(0.3)
        served = scrape_until(sidecar.url, lambda s: booked(s, "marked").get("eval", 0.0) > 0)
        assert booked(served, "marked").get("other", 0.0) == 0, "booked before the process ends, not in its lump"
    scrape = scrape_until(
        sidecar.url, lambda s: s.has(catalog.STEPS.name, workload="marked") and not s.has(PROCESSES, workload="marked")
    )
    seconds = booked(scrape, "marked")
    print(f"marked: {seconds}")
    assert seconds["eval"] >= 0.3 and seconds["sdc_check"] >= 0.05
    assert seconds["productive"] >= 10 * STEP_S
    assert seconds.get("other", 0.0) < 0.3, "the eval is not other"
    assert sum(seconds.values()) == pytest.approx(scrape.value(WALL, workload="marked"), abs=0.02)
