"""The host collector: the machine, and the job's processes found by --pid, --pid-file and the event socket."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import wait_for

from tpuscope import catalog
from tpuscope.scrape import Scrape
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

        scrape = wait_for(sidecar.url, lambda s: complete(s) and s.has(catalog.HOST_CPU_UTILIZATION.name))
    assert scrape.value(UP, collector="host") == 1
    cpus = {s.labels["cpu"] for s in scrape.find(catalog.HOST_CPU_UTILIZATION.name)}
    assert cpus == {str(i) for i in range(psutil.cpu_count())}
    assert all(0 <= s.value <= 1 for s in scrape.find(catalog.HOST_CPU_UTILIZATION.name))
    assert 0 <= scrape.value(catalog.HOST_CPU_IOWAIT.name) <= 1
    assert scrape.value(catalog.HOST_MEMORY_TOTAL.name) == psutil.virtual_memory().total
    assert 0 < scrape.value(catalog.HOST_MEMORY_AVAILABLE.name) <= psutil.virtual_memory().total
    assert scrape.has(catalog.HOST_NETWORK.name, direction="transmit")
    # The job found through the pid file, named after its process; this test's process, by its workload.
    assert scrape.value(catalog.JOB_THREADS.name, **job) == 4
    assert (
        scrape.find(catalog.JOB_THREADS.name, **job).__next__().labels["workload"] == psutil.Process(sleeper.pid).name()
    )
    assert scrape.value(catalog.JOB_RESIDENT_MEMORY.name, workload="hosted", **me) > 10 << 20
    assert scrape.value(catalog.JOB_CPU.name, workload="hosted", **me) > 0


def test_a_missing_process_is_reported_and_the_rest_still_served(
    short_tmp: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    sleeper.kill()
    sleeper.wait()
    with host_sidecar(short_tmp / "s.sock", f"--pid={sleeper.pid}") as sidecar:
        scrape = wait_for(sidecar.url, lambda s: s.value(catalog.COLLECTOR_ERRORS.name, reason="process_gone") > 0)
        assert scrape.value(catalog.COLLECTOR_ERRORS.name, collector="host", reason="process_gone") > 0
        assert scrape.value(UP, collector="host") == 0
        assert scrape.has(catalog.HOST_MEMORY_TOTAL.name), "what could be read is still served"
        assert f"no process {sleeper.pid}" in sidecar.log()
