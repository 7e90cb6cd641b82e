"""Preemption and maintenance are classified with no signal handler in the job: a real JAX job and a real sidecar,
terminated as Kubernetes terminates a pod with a native sidecar (the job's SIGTERM, its exit, then the
sidecar's SIGTERM), with the VM's metadata server a server of the test's own (at the protocol boundary). The job
is booked preemption or maintenance when the server says so, vanished when it says nothing; a job that crashes
is booked its own reason, or vanished, never preemption. Without a metadata server, or with GKE's (which serves
no notices), a job that vanished is booked at once, as before.
"""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuscope import catalog, gce_metadata
from tpuscope.exporter.endings import HOLD_SECONDS
from tpuscope.scrape import Scrape
from tpuscope.testing.waiting import last_scrape_before_exit, scrape_until, wait_for
from tpuscope.workload.sidecar import SidecarProcess

pytestmark = pytest.mark.long

WORKLOAD = "job"
# A JAX job as a user writes one, with a Monitor that installs no SIGTERM handler (the default since issue 34,
# said explicitly here): it steps until it is terminated, or raises, or aborts, after its 4th step.
JOB = textwrap.dedent(
    f"""
    import os, sys
    import jax, jax.numpy as jnp
    from tpuscope.tracing import Hooks, Monitor

    mode, socket = sys.argv[1], sys.argv[2]
    step = jax.jit(lambda x: jnp.tanh(x @ x))
    x = jnp.ones((64, 64))
    with Monitor({WORKLOAD!r}, socket=socket, hooks=Hooks(sigterm=False, profile_period="off"), traces=False) as mon:
        n = 0
        while True:
            with mon.step(n):
                x = step(x).block_until_ready()
            n += 1
            if n == 4 and mode == "raise":
                raise RuntimeError("a bug in the training loop")
            if n == 4 and mode == "abort":
                import resource
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
                os.abort()  # a crash in native code: no exception, no goodbye
    """
)


class MetadataServer(http.server.ThreadingHTTPServer):
    """The two answers the sidecar asks for, as Compute Engine gives them; ``gke``: as GKE's metadata server,
    which a pod under Workload Identity reaches instead, and which serves neither (404)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Answer)
        self.preempted = "FALSE"
        self.maintenance_event = "NONE"
        self.gke = False
        self.asked: list[tuple[float, str]] = []  # (Unix time, path) of each request with the Metadata-Flavor header
        self.refused = 0  # requests without it: the real server refuses them

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def answer(self, path: str) -> str | None:
        if self.gke:
            return None
        return {gce_metadata.PREEMPTED_PATH: self.preempted, gce_metadata.MAINTENANCE_PATH: self.maintenance_event}.get(
            path
        )


class _Answer(http.server.BaseHTTPRequestHandler):
    server: MetadataServer

    def do_GET(self) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            self.server.refused += 1
            self._send(403, "Missing Metadata-Flavor:Google header.")
            return
        value = self.server.answer(self.path)  # before the request is seen: a test that changes the answer
        self.server.asked.append((time.time(), self.path))  # on seeing it changes the next one
        self._send(404 if value is None else 200, value or "not found")

    def _send(self, status: int, body: str) -> None:
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    server = MetadataServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def start_sidecar(tmp: Path, metadata: MetadataServer | None) -> SidecarProcess:
    """``tpuscope serve`` as in a pod: it lingers after its SIGTERM until a scrape reads the final state. Its slice is
    the test's directory's name, on every series it serves: a scrape without it came from another process."""
    env = {gce_metadata.METADATA_HOST_ENV: metadata.host if metadata else ""}
    return SidecarProcess(
        tmp / "events.sock", "127.0.0.1:0", "--shutdown-linger", "60s", f"--slice={tmp.name}", env=env
    )


def start_job(tmp: Path, sidecar: SidecarProcess, mode: str) -> subprocess.Popen[str]:
    script = tmp / "job.py"
    script.write_text(JOB)
    return subprocess.Popen(
        [sys.executable, str(script), mode, str(sidecar.socket)],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_stepping(sidecar: SidecarProcess) -> None:
    """Until the job has stepped (scraping, as Prometheus does: the sidecar then lingers for a last scrape)."""
    scrape = scrape_until(
        sidecar.url, lambda s: (s.value(catalog.STEPS.name, workload=WORKLOAD) or 0) >= 3, timeout=120
    )
    assert scrape.present(catalog.STEPS.name, workload=WORKLOAD) >= 3, sidecar.log()


def ended(job: subprocess.Popen[str]) -> tuple[int, str]:
    """The job's exit status and the end of its stderr, once it has exited."""
    try:
        _, err = job.communicate(timeout=60)
    finally:
        job.kill()
    return job.returncode, err[-2000:]


def paths_asked(metadata: MetadataServer, since: int) -> list[str]:
    """The paths the metadata server was asked for, from its ``since``-th request on."""
    return [path for _, path in metadata.asked[since:]]


def failures(scrape: Scrape) -> dict[str, float]:
    """The workload's failures by reason; a reason with no series is absent, not zero."""
    name = catalog.WORKLOAD_FAILURES.name
    return {x.labels["reason"]: x.value for x in scrape.find(name, workload=WORKLOAD)}


def final_state(sidecar: SidecarProcess) -> Scrape:
    """The kubelet's SIGTERM to the sidecar, then scrapes, as Prometheus goes on scraping, until it exits: the
    last one it served (it lingers until one has read the final state)."""
    sidecar.proc.send_signal(signal.SIGTERM)
    ours = sidecar.socket.parent.name  # its slice (start_sidecar): a page without it is another server's
    final = last_scrape_before_exit(
        sidecar.url,
        lambda: sidecar.proc.poll() is not None,
        lambda scrape: any(sample.labels.get("slice") == ours for sample in scrape.samples),
        60,
        detail=sidecar.log,
    )
    assert sidecar.proc.wait(timeout=30) == 0, sidecar.log()
    return final


@pytest.mark.parametrize(
    ("preempted", "maintenance_event", "reason"),
    [
        ("TRUE", "NONE", "preemption"),
        ("FALSE", "TERMINATE_ON_HOST_MAINTENANCE", "maintenance"),
        ("FALSE", "MIGRATE_ON_HOST_MAINTENANCE", "vanished"),  # a live migration ends no process
        ("FALSE", "NONE", "vanished"),
    ],
)
def test_a_job_terminated_as_a_pod_is_booked_as_the_metadata_server_says(
    short_tmp: Path, metadata: MetadataServer, preempted: str, maintenance_event: str, reason: str
) -> None:
    metadata.preempted, metadata.maintenance_event = preempted, maintenance_event
    with start_sidecar(short_tmp, metadata) as sidecar:
        job = start_job(short_tmp, sidecar, "run")
        wait_stepping(sidecar)
        job.send_signal(signal.SIGTERM)  # the kubelet: the main container first; no handler, so it ends at once
        status, err = ended(job)
        assert status == -signal.SIGTERM, err
        if reason != "vanished":  # a notice is booked as soon as it is read: a scrape before the sidecar's end
            before = scrape_until(sidecar.url, lambda s: bool(failures(s)), timeout=30)
            assert failures(before) == {reason: 1.0}, sidecar.log()
        final = final_state(sidecar)
        assert failures(final) == {reason: 1.0}, sidecar.log() + "\nthe last scrape:\n" + final.text
    assert metadata.asked and not metadata.refused


def test_a_notice_that_lags_the_jobs_end_is_read_at_the_sidecars_sigterm(
    short_tmp: Path, metadata: MetadataServer
) -> None:
    """The metadata server says nothing yet when the job ends; by the sidecar's SIGTERM it says preempted. The
    verdict is booked at the time the job ended (the workload is down since then), not at the sidecar's end."""
    with start_sidecar(short_tmp, metadata) as sidecar:
        job = start_job(short_tmp, sidecar, "run")
        wait_stepping(sidecar)
        asked_before = len(metadata.asked)
        job.send_signal(signal.SIGTERM)
        status, err = ended(job)
        assert status == -signal.SIGTERM, err
        exited = time.time()
        # The sidecar asked both questions once the job had gone, and heard no notice: its verdict waits.
        wait_for(
            lambda: gce_metadata.PREEMPTED_PATH in paths_asked(metadata, since=asked_before),
            20,
            "gce_metadata.PREEMPTED_PATH in paths_asked(metadata, since=asked_before)",
        )
        metadata.preempted = "TRUE"
        terminated = time.time()
        scrape = final_state(sidecar)
    assert failures(scrape) == {"preemption": 1.0}, sidecar.log()
    down_since = scrape.present(catalog.WORKLOAD_DOWN_SINCE.name, workload=WORKLOAD)
    assert exited - 10 < down_since < terminated


@pytest.mark.parametrize(("mode", "reason"), [("raise", "other"), ("abort", "vanished")])
def test_a_job_that_crashes_is_not_booked_preemption(
    short_tmp: Path, metadata: MetadataServer, mode: str, reason: str
) -> None:
    """A Python exception: the job says why itself, and the sidecar asks nobody (even a VM being preempted does
    not make a bug a preemption). A crash in native code says nothing: the metadata server has no notice, and
    the sidecar, stopped by the kubelet after the job's container exited (restartPolicy Never), books vanished."""
    metadata.preempted = "TRUE" if mode == "raise" else "FALSE"
    with start_sidecar(short_tmp, metadata) as sidecar:
        job = start_job(short_tmp, sidecar, mode)
        wait_stepping(sidecar)
        status, err = ended(job)  # on its own
        assert status == (1 if mode == "raise" else -signal.SIGABRT), err
        assert failures(final_state(sidecar)) == {reason: 1.0}, sidecar.log()


@pytest.mark.parametrize("where", ["no metadata server", "GKE's metadata server"])
def test_where_the_platform_cannot_tell_a_job_that_vanished_is_booked_at_once(
    short_tmp: Path, metadata: MetadataServer, where: str
) -> None:
    """Off Google Cloud, or in a GKE pod whose metadata server (Workload Identity's) serves no notices: nothing
    to wait for, so no delay: booked before the hold a verdict waits for elsewhere."""
    metadata.gke = True
    with start_sidecar(short_tmp, metadata if where != "no metadata server" else None) as sidecar:
        job = start_job(short_tmp, sidecar, "run")
        wait_stepping(sidecar)
        job.send_signal(signal.SIGTERM)
        status, err = ended(job)
        assert status == -signal.SIGTERM, err
        scrape = scrape_until(sidecar.url, lambda s: bool(failures(s)), timeout=HOLD_SECONDS - 2)
        assert failures(scrape) == {"vanished": 1.0}, sidecar.log()
        assert failures(final_state(sidecar)) == {"vanished": 1.0}
    if where == "GKE's metadata server":  # asked once, at start, whether it serves the notices; not again
        assert [path for _, path in metadata.asked] == [gce_metadata.PREEMPTED_PATH]
