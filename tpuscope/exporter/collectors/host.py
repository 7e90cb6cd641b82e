"""``host``: the machine the job runs on, and the job's own processes, through psutil.

CPU shares are computed from the change in the kernel's CPU time counters
between two collections, so they describe the last interval (the first
collection has nothing to compare with and leaves them out). Disk, network and
swap are served as byte counters, as Prometheus expects; ``rate()`` gives the
throughput over whatever window a query wants.

A job process's major page faults come from ``/proc/PID/stat`` (psutil has no
call for them); where there is no ``/proc`` that series is left out.

The job's processes come from three places: ``--pid``, ``--pid-file`` (read
at every collection, so a restarted job is followed), and the processes
connected to the event socket (their pid from the socket's peer credentials).
"""

from __future__ import annotations

import logging
from pathlib import Path

import psutil

from tpuscope import catalog
from tpuscope.exporter.collectors.base import PROCESS_GONE, Collector, CollectorError, Settings
from tpuscope.exporter.samples import Sample

log = logging.getLogger("tpuscope.collectors")


class HostCollector(Collector):
    name = catalog.HOST

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._previous_cpu: list[tuple[float, float, float]] | None = self._cpu_times()

    def collect(self, timeout: float) -> list[Sample]:
        samples = self._cpu() + self._memory_disk_network() + self._swap()
        processes, missing = self._processes()
        samples += processes
        if missing:
            raise CollectorError(PROCESS_GONE, f"no process {', '.join(missing)}", partial=samples)
        return samples

    @staticmethod
    def _cpu_times() -> list[tuple[float, float, float]]:
        """Per CPU: (total, not busy, iowait) seconds since boot.

        Not busy is idle, iowait and steal: time the hypervisor gave to another guest was not ours either.
        """
        result = []
        for t in psutil.cpu_times(percpu=True):
            # Linux counts guest time inside user time as well: subtract it, as psutil's cpu_percent does.
            total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
            iowait = getattr(t, "iowait", 0.0)
            result.append((total, t.idle + iowait + getattr(t, "steal", 0.0), iowait))
        return result

    def _cpu(self) -> list[Sample]:
        now = self._cpu_times()
        previous, self._previous_cpu = self._previous_cpu, now
        if previous is None or len(previous) != len(now):
            return []
        samples = []
        all_total = all_iowait = 0.0
        for cpu, ((total, free, iowait), (total0, free0, iowait0)) in enumerate(zip(now, previous, strict=True)):
            elapsed = total - total0
            if elapsed <= 0:  # too soon to tell
                return []
            busy = elapsed - (free - free0)
            samples.append(Sample(catalog.HOST_CPU_UTILIZATION, (str(cpu),), min(1.0, max(0.0, busy / elapsed))))
            all_total += elapsed
            all_iowait += iowait - iowait0
        samples.append(Sample(catalog.HOST_CPU_IOWAIT, (), max(0.0, all_iowait / all_total)))
        return samples

    @staticmethod
    def _memory_disk_network() -> list[Sample]:
        memory = psutil.virtual_memory()
        samples = [
            Sample(catalog.HOST_MEMORY_AVAILABLE, (), float(memory.available)),
            Sample(catalog.HOST_MEMORY_TOTAL, (), float(memory.total)),
        ]
        if disk := psutil.disk_io_counters(perdisk=False):
            samples += [
                Sample(catalog.HOST_DISK_IO, ("read",), float(disk.read_bytes)),
                Sample(catalog.HOST_DISK_IO, ("write",), float(disk.write_bytes)),
            ]
        nics = psutil.net_io_counters(pernic=True)
        received = sum(n.bytes_recv for name, n in nics.items() if name != "lo")
        sent = sum(n.bytes_sent for name, n in nics.items() if name != "lo")
        samples += [
            Sample(catalog.HOST_NETWORK, ("receive",), float(received)),
            Sample(catalog.HOST_NETWORK, ("transmit",), float(sent)),
        ]
        return samples

    @staticmethod
    def _swap() -> list[Sample]:
        swap = psutil.swap_memory()  # sin and sout: bytes since boot (0 where the OS does not say)
        return [
            Sample(catalog.HOST_SWAP_IO, ("in",), float(swap.sin)),
            Sample(catalog.HOST_SWAP_IO, ("out",), float(swap.sout)),
        ]

    def _job_processes(self) -> tuple[dict[int, str], list[str]]:
        """pid -> workload name (empty when only the pid is known), and what could not be resolved."""
        jobs: dict[int, str] = {pid: "" for pid in self._settings.pids}
        problems: list[str] = []
        if path := self._settings.pid_file:
            try:
                pid = int(Path(path).read_text().split()[0])
                if pid <= 0:
                    raise ValueError(f"{pid} is not a process id")
                jobs.setdefault(pid, "")
            except (OSError, ValueError, IndexError) as e:
                problems.append(f"from pid file {path} ({e})")
        for pid, workload in self._settings.job_pids().items():
            if pid > 0:  # 0: a peer in another pid namespace, which the sidecar cannot see
                jobs[pid] = workload
        return jobs, problems

    def _processes(self) -> tuple[list[Sample], list[str]]:
        jobs, missing = self._job_processes()
        samples = []
        for pid, workload in jobs.items():
            try:
                process = psutil.Process(pid)
                with process.oneshot():
                    name = workload or process.name()
                    cpu = process.cpu_times()
                    labels = (name, str(pid))
                    samples += [
                        Sample(catalog.JOB_CPU, labels, cpu.user + cpu.system),
                        Sample(catalog.JOB_RESIDENT_MEMORY, labels, float(process.memory_info().rss)),
                        Sample(catalog.JOB_THREADS, labels, float(process.num_threads())),
                    ]
                if (faults := major_page_faults(pid)) is not None:
                    samples.append(Sample(catalog.JOB_MAJOR_PAGE_FAULTS, labels, float(faults)))
            except psutil.NoSuchProcess:
                if pid in self._settings.pids or not workload:
                    missing.append(str(pid))  # asked for by --pid or the pid file: worth saying
            except psutil.AccessDenied:
                log.debug("no permission to read process %d", pid)
        return samples, missing


def major_page_faults(pid: int) -> int | None:
    """The major page faults of process ``pid`` so far; None where there is no ``/proc`` or it has just ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return parse_major_page_faults(stat)


def parse_major_page_faults(stat: str) -> int:
    """``majflt``, field 12 of a ``/proc/PID/stat`` line (proc(5)).

    Field 2, the command name in parentheses, may itself hold spaces and ')' (a thread can name
    itself anything), so the fields are counted from after the last ')', where field 3 begins.
    """
    after_name = stat.rpartition(")")[2].split()
    return int(after_name[12 - 3])
