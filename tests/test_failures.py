"""Every failure the job can name, caused for real on this machine, lands on the sidecar's /metrics under its
reason: the JAX bench runs out of memory (an allocation XLA refuses), fails to compile, reads a corrupt record,
restores a checkpoint whose bytes changed on disk, fails to start its runtime, and is stopped by SIGTERM, with
and without a host maintenance event on the VM's metadata server (a server of the test's own, at the protocol
boundary). Each run is its own workload on one sidecar.
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuscope import catalog
from tpuscope.gce_metadata import METADATA_HOST_ENV
from tpuscope.reasons import RECOMPILE_VALUES
from tpuscope.scrape import Scrape
from tpuscope.testing import bench as testing_bench
from tpuscope.testing.waiting import scrape_until
from tpuscope.tracing.preemption import SIGTERM_EXIT
from tpuscope.workload.runner import CRASHED
from tpuscope.workload.sidecar import SidecarProcess

pytestmark = pytest.mark.long


def options(sidecar: SidecarProcess, tmp: Path, workload: str) -> dict[str, Any]:
    return {
        "workload": workload,
        "socket": sidecar.socket,
        "run_dir": tmp / workload,
        "profile_period": "off",
        "checkpoint_every": 0,
        "compile_cache": tmp / "xla-cache",
        "cpu_devices": 2,
    }


def bench_command(sidecar: SidecarProcess, tmp: Path, workload: str, *flags: str) -> list[str]:
    return testing_bench.command(*flags, **options(sidecar, tmp, workload))


def bench(
    sidecar: SidecarProcess, tmp: Path, workload: str, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return testing_bench.run(*flags, env=env, **options(sidecar, tmp, workload))


def failures_of(sidecar: SidecarProcess, workload: str) -> dict[str, float]:
    """The workload's failures by reason, once the sidecar has counted one."""
    name = catalog.WORKLOAD_FAILURES.name
    scrape = scrape_until(
        sidecar.url, lambda s: any(x.name == name and x.labels["workload"] == workload for x in s.samples)
    )
    return {x.labels["reason"]: x.value for x in scrape.samples if x.name == name and x.labels["workload"] == workload}


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("oom=3", "out_of_memory"), ("compile-error=3", "compile_error"), ("bad-data=3", "data_error")],
)
def test_a_failing_step_lands_under_its_reason(
    module_sidecar: SidecarProcess, module_tmp: Path, fault: str, reason: str
) -> None:
    workload = fault.split("=")[0]
    run = bench(module_sidecar, module_tmp, workload, "--steps=6", f"--inject={fault}")
    assert run.returncode == CRASHED, run.stdout[-2000:] + run.stderr[-2000:]
    assert f'reason="{reason}"' in run.stdout
    assert failures_of(module_sidecar, workload) == {reason: 1.0}
    # Only the failed compile counts as one, by its stage and why; the other runs compiled all they ran.
    failed = catalog.COMPILE_FAILURES.name
    compiles = {
        (x.labels["stage"], x.labels["reason"]): x.value
        for x in Scrape.fetch(module_sidecar.url).samples
        if x.name == failed and x.labels["workload"] == workload
    }
    assert compiles == ({("backend", "unsupported"): 1.0} if reason == "compile_error" else {})


def test_a_restore_from_a_corrupted_checkpoint_lands_under_checkpoint_restore(
    module_sidecar: SidecarProcess, module_tmp: Path
) -> None:
    saved = bench(module_sidecar, module_tmp, "restore", "--steps=6", "--checkpoint-every=5")
    assert saved.returncode == 0, saved.stdout[-2000:] + saved.stderr[-2000:]
    data = sorted((module_tmp / "restore" / "checkpoints" / "4").rglob("d/*"))
    assert data, "Orbax wrote no data files"
    for path in data:  # as bit rot or a torn write leaves them: bytes changed in the middle of each file
        content = bytearray(path.read_bytes())
        middle = len(content) // 2
        content[middle : middle + 16] = bytes(b ^ 0xFF for b in content[middle : middle + 16])
        path.write_bytes(bytes(content))
    resumed = bench(module_sidecar, module_tmp, "restore", "--steps=10", "--checkpoint-every=5")
    assert resumed.returncode == 1, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "DATA_LOSS" in resumed.stderr  # the checksum caught it: what Orbax raised, as the job saw it
    assert failures_of(module_sidecar, "restore") == {"checkpoint_restore": 1.0}
    restores = Scrape.fetch(module_sidecar.url).value(
        catalog.CHECKPOINT_DURATION.series("count"), workload="restore", operation="restore", result="error"
    )
    assert restores == 1


def test_a_runtime_that_does_not_start_lands_under_runtime_init(
    module_sidecar: SidecarProcess, module_tmp: Path
) -> None:
    # No TPU here: JAX cannot open libtpu, as on a host whose libtpu is missing or of another version.
    run = bench(module_sidecar, module_tmp, "init", "--steps=6", env={"JAX_PLATFORMS": "tpu"})
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Unable to initialize backend 'tpu'" in run.stderr
    assert failures_of(module_sidecar, "init") == {"runtime_init": 1.0}


class _MetadataServer(http.server.BaseHTTPRequestHandler):
    """The VM metadata server's one answer the job asks for, as Compute Engine gives it during maintenance."""

    def do_GET(self) -> None:
        ok = self.path == "/computeMetadata/v1/instance/maintenance-event"
        ok = ok and self.headers.get("Metadata-Flavor") == "Google"
        body = b"TERMINATE_ON_HOST_MAINTENANCE" if ok else b"not found"
        self.send_response(200 if ok else 404)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def metadata_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MetadataServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("maintenance", [False, True], ids=["preemption", "maintenance"])
def test_a_sigterm_lands_under_preemption_or_maintenance(
    module_sidecar: SidecarProcess, module_tmp: Path, metadata_server: str, maintenance: bool
) -> None:
    workload = "maintenance" if maintenance else "preempted"
    env = {**os.environ}
    env.pop(METADATA_HOST_ENV, None)
    if maintenance:
        env[METADATA_HOST_ENV] = metadata_server
    command = bench_command(module_sidecar, module_tmp, workload, "--steps=100000")
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as job:
        try:
            stepping = scrape_until(
                module_sidecar.url, lambda s: (s.value(catalog.STEPS.name, workload=workload) or 0) >= 3, 120
            )
            assert stepping.present(catalog.STEPS.name, workload=workload) >= 3
            job.send_signal(signal.SIGTERM)  # as the kubelet does at a pod's deletion, before its grace period
            out, err = job.communicate(timeout=60)
        finally:
            job.kill()
    # The bench opts in to the Monitor's handler: it leaves at its next step, unwinds and reports.
    assert job.returncode == SIGTERM_EXIT, out[-2000:] + err[-2000:]
    assert "Run summary" in out  # the job unwound and reported, as it would in its grace period
    assert failures_of(module_sidecar, workload) == {workload if maintenance else "preemption": 1.0}


def test_a_recompile_is_counted_by_its_cause(module_sidecar: SidecarProcess, module_tmp: Path) -> None:
    # A new sequence length every 2 steps: JAX explains each retrace as different input types.
    run = bench(module_sidecar, module_tmp, "reshaped", "--steps=7", "--inject=recompile=2")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # Counted, not logged into the job's output: the explanations, nor the persistent cache's misses, which the
    # same setting raises to warnings (the run uses the cache).
    assert "TRACING CACHE MISS" not in run.stderr and "PERSISTENT COMPILATION CACHE" not in run.stderr
    scrape = Scrape.fetch(module_sidecar.url)
    recompiles = catalog.RECOMPILES.name
    assert scrape.present(recompiles, workload="reshaped", cause="input_types") >= 3
    # Each cause one of the closed set (the bench's FLOPs analysis also makes a new function per shape: JAX says
    # redefined_function for those).
    causes = {x.labels["cause"] for x in scrape.samples if x.name == recompiles and x.labels["workload"] == "reshaped"}
    assert causes <= set(RECOMPILE_VALUES), causes
