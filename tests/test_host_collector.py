"""The host collector: the machine, and the job's processes found by --pid, --pid-file and the event socket."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tpuscope import catalog
from tpuscope.exporter.collectors.host import parse_major_page_faults
from tpuscope.scrape import Scrape
from tpuscope.testing.waiting import scrape_until
from tpuscope.tracing import Monitor
from tpuscope.workload.sidecar import SidecarProcess

UP = catalog.COLLECTOR_UP.name


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in job process with a known number of threads."""
    code = (
        "import threading, time\n"
        "for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    yield proc
    proc.kill()
    proc.wait()


def host_sidecar(socket: Path, *extra: str) -> SidecarProcess:
    return SidecarProcess(socket, "127.0.0.1:0", "--collectors=host", "--collector-interval=0.2", *extra)


def test_host_and_job_processes(short_tmp: Path, sleeper: subprocess.Popen[bytes]) -> None:
    pid_file = short_tmp / "job.pid"
    pid_file.write_text(f"{sleeper.pid}\n")
    with (
        host_sidecar(short_tmp / "s.sock", f"--pid-file={pid_file}") as sidecar,
        Monitor("hosted", socket=sidecar.socket) as monitor,
    ):
        monitor.step(0.01)  # connected: the sidecar learns this process from the socket's peer credentials
        me, job = {"pid": str(os.getpid())}, {"pid": str(sleeper.pid)}

        def complete(s: Scrape) -> bool:
            return s.has(catalog.JOB_THREADS.name, **me) and s.has(catalog.JOB_THREADS.name, **job)

        scrape = scrape_until(sidecar.url, lambda s: complete(s) and s.has(catalog.HOST_CPU_UTILIZATION.name))
    assert scrape.value(UP, collector="host") == 1
    cpus = {s.labels["cpu"] for s in scrape.find(catalog.HOST_CPU_UTILIZATION.name)}
    assert cpus == {str(i) for i in range(psutil.cpu_count())}
    assert all(0 <= s.value <= 1 for s in scrape.find(catalog.HOST_CPU_UTILIZATION.name))
    assert 0 <= scrape.present(catalog.HOST_CPU_IOWAIT.name) <= 1
    assert scrape.value(catalog.HOST_MEMORY_TOTAL.name) == psutil.virtual_memory().total
    assert 0 < scrape.present(catalog.HOST_MEMORY_AVAILABLE.name) <= psutil.virtual_memory().total
    assert scrape.has(catalog.HOST_NETWORK.name, direction="transmit")
    # The job found through the pid file, named after its process; this test's process, by its workload.
    assert scrape.value(catalog.JOB_THREADS.name, **job) == 4
    assert (
        scrape.find(catalog.JOB_THREADS.name, **job).__next__().labels["workload"] == psutil.Process(sleeper.pid).name()
    )
    assert scrape.present(catalog.JOB_RESIDENT_MEMORY.name, workload="hosted", **me) > 10 << 20
    assert scrape.present(catalog.JOB_CPU.name, workload="hosted", **me) > 0


def test_a_missing_process_is_reported_and_the_rest_still_served(
    short_tmp: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    sleeper.kill()
    sleeper.wait()
    with host_sidecar(short_tmp / "s.sock", f"--pid={sleeper.pid}") as sidecar:
        scrape = scrape_until(
            sidecar.url, lambda s: (s.value(catalog.COLLECTOR_ERRORS.name, reason="process_gone") or 0) > 0
        )
        assert scrape.present(catalog.COLLECTOR_ERRORS.name, collector="host", reason="process_gone") > 0
        assert scrape.present(UP, collector="host") == 0
        assert scrape.has(catalog.HOST_MEMORY_TOTAL.name), "what could be read is still served"
        assert f"no process {sleeper.pid}" in sidecar.log()


def test_swap_io_is_served_in_both_directions(short_tmp: Path) -> None:
    with host_sidecar(short_tmp / "s.sock") as sidecar:
        scrape = scrape_until(sidecar.url, lambda s: s.has(catalog.HOST_SWAP_IO.name))
    swap = psutil.swap_memory()  # read after the scrape: a counter can only have grown since
    served = {s.labels["direction"]: s.value for s in scrape.find(catalog.HOST_SWAP_IO.name)}
    assert served.keys() == {"in", "out"}
    assert 0 <= served["in"] <= swap.sin and 0 <= served["out"] <= swap.sout


# A job that faults: it evicts a file it wrote from the page cache (posix_fadvise needs no root for
# one's own clean pages), then reads it through a mapping with readahead off, so each page is a
# fault that waits for the disk. It prints its own count (getrusage: the kernel's count through
# another door than /proc/PID/stat) before and after, and waits for a line on stdin between.
# The file goes under /var/tmp, which stays on disk where /tmp may be tmpfs (whose pages never leave memory).
FAULTER = """
import mmap, os, resource, sys
def majflt(): print(resource.getrusage(resource.RUSAGE_SELF).ru_majflt, flush=True)
with open(sys.argv[1], "wb") as f:
    f.write(os.urandom(16 << 20)); f.flush(); os.fsync(f.fileno())
majflt(); sys.stdin.readline()
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
pages = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
pages.madvise(mmap.MADV_RANDOM)
sum(pages[i] for i in range(0, len(pages), mmap.PAGESIZE))
majflt(); sys.stdin.readline()
"""


@pytest.fixture
def on_disk() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ts-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_major_page_faults_of_a_job_process(short_tmp: Path, on_disk: Path) -> None:
    job = subprocess.Popen(
        [sys.executable, "-c", FAULTER, str(on_disk / "mapped.bin")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert job.stdin is not None and job.stdout is not None
    seen: list[float] = []  # every served value, scrape after scrape

    def served_is(expected: int) -> Callable[[Scrape], bool]:
        def check(scrape: Scrape) -> bool:
            values = [s.value for s in scrape.find(catalog.JOB_MAJOR_PAGE_FAULTS.name, pid=str(job.pid))]
            seen.extend(values)
            return values == [expected]

        return check

    try:
        with host_sidecar(short_tmp / "s.sock", f"--pid={job.pid}") as sidecar:
            before = int(job.stdout.readline())
            scrape = scrape_until(sidecar.url, served_is(before))
            assert served_is(before)(scrape), seen
            job.stdin.write(b"go\n")
            job.stdin.flush()
            after = int(job.stdout.readline())
            scrape = scrape_until(sidecar.url, served_is(after))
            assert served_is(after)(scrape), seen
            assert scrape.has(catalog.JOB_CPU.name, pid=str(job.pid))  # beside the job's other series
    finally:
        job.kill()
        job.wait()
    assert seen == sorted(seen), "a counter never goes down"
    # 16 MiB: 4096 pages of 4 KiB (256 of 64 KiB), nearly each a fault of its own.
    assert after - before >= 100, f"{before} -> {after} major faults: is {on_disk} in memory (tmpfs)?"


def test_stat_parser_counts_fields_after_the_last_parenthesis() -> None:
    # A thread may name itself anything up to 15 bytes, spaces and ')' included: "a) 1 2 ) R" here,
    # which fools a parser that splits at the first ')' or on spaces from the start.
    line = "4242 (a) 1 2 ) R) S 1 4242 4242 0 -1 4194560 1500 20 7 3 25 11 0 0 20 0 4 0 12345 1000000 200\n"
    assert parse_major_page_faults(line) == 7
