"""The sidecar image, built by the documented command (`make image`) and run as the manifests run it.

`make image` (deploy/image/build.sh) makes the image from Debian's python3 packages and the project's wheel,
with podman, so no base image and no registry are needed. The test runs it as Kubernetes would: another
non-root user, a read-only root filesystem, no capabilities, the job's socket in a shared directory. A job on
the host sends its events through that socket, Prometheus' view is a scrape of the published port, and the
container stops on SIGTERM with exit status 0 once a scrape has read the final state (``--shutdown-linger``).

This machine's podman needs three settings (``CONTAINERS_CONF``): runc, as crun refuses the hybrid cgroups here;
cgroupfs, with no systemd; no default ulimits, which the sandbox may not raise. A workstation's podman or
docker needs none of them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import require

from tpuscope import catalog, kubernetes
from tpuscope.testing import bench as testing_bench
from tpuscope.testing.prometheus import free_port
from tpuscope.testing.waiting import scrape_until, wait_for

ROOT = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/tpuscope:{VERSION}"
SIZE_TARGET_MB = 150  # issue 37's target for an image that holds Python and the sidecar, and nothing else
WORKLOAD = "image"
STEPS = 30
# The sidecar container's runAsUser and runAsGroup in the manifests: Kubernetes runs the image as those, not as its own.
SIDECAR_UID = kubernetes.UID
CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n'
# The base unpacked, the wheel's dependencies fetched, the image built: about half a minute alone.
pytestmark = pytest.mark.long


@dataclass(frozen=True)
class Built:
    env: dict[str, str]
    size_mb: float

    def podman(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A throwaway container of the image; ``args`` are podman run's options, then the command."""
        return self.podman("run", "--rm", *args)


@pytest.fixture(scope="module")
def built(module_tmp: Path) -> Built:
    require("podman")
    require("mmdebstrap")
    conf = module_tmp / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    # The command as docs/fleet.md gives it.
    make = subprocess.run(["make", "image"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert make.returncode == 0, make.stdout[-3000:] + make.stderr[-3000:]
    said = re.search(rf"^built {re.escape(IMAGE)}: (\d+) MB$", make.stdout, re.MULTILINE)
    assert said, make.stdout
    print(f"\n{said.group(0)}")
    return Built(env, float(said.group(1)))


def test_the_image_is_small_and_its_config_is_the_sidecars(built: Built) -> None:
    assert built.size_mb <= SIZE_TARGET_MB, f"the image grew to {built.size_mb} MB"
    inspected = built.podman("image", "inspect", IMAGE)
    assert inspected.returncode == 0, inspected.stderr
    (image,) = json.loads(inspected.stdout)
    config = image["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["/usr/local/bin/tpuscope", "serve"]
    assert config["Labels"]["org.opencontainers.image.version"] == VERSION
    assert "TPUSCOPE_LISTEN=:9478" in config["Env"]
    assert image["Healthcheck"]["Test"][0] == "CMD"
    # The manifests name this image by the same version, from the same source.
    assert kubernetes.SIDECAR_IMAGE.endswith(f"/tpuscope:{VERSION}")


def test_the_image_has_the_collectors_libraries_and_no_jax_and_no_shell(built: Built) -> None:
    probe = "import importlib.util as u; print(*(u.find_spec(m) is not None for m in ('jax', 'tpu_info', 'pynvml')))"
    found = built.run("--entrypoint", "/usr/bin/python3", IMAGE, "-c", probe)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["False", "True", "True"]
    version = built.run("--entrypoint", "tpuscope", IMAGE, "--version")
    assert version.stdout.strip() == f"tpuscope {VERSION}", version.stderr
    shell = built.run("--entrypoint", "/bin/sh", IMAGE, "-c", "true")
    assert shell.returncode != 0, "the image has a shell"


def test_a_sidecar_from_the_image_is_scraped_healthy_and_stops_on_sigterm(built: Built, short_tmp: Path) -> None:
    shared = short_tmp / "run-tpuscope"  # the pod's emptyDir: mode 0777, as the kubelet makes one without fsGroup
    shared.mkdir()
    shared.chmod(0o777)
    port = free_port()
    name = f"tpuscope-test-{port}"
    started = built.podman(
        "run", "--detach", "--name", name, "--user", f"{SIDECAR_UID}:{SIDECAR_UID}", "--read-only", "--cap-drop=ALL",
        "--security-opt=no-new-privileges", "--publish", f"127.0.0.1:{port}:9478",
        "--volume", f"{shared}:/run/tpuscope", IMAGE,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        socket = shared / "events.sock"
        wait_for(socket.exists, 60, "socket.exists", detail=lambda: built.podman("logs", name).stderr)
        job = testing_bench.run(
            "--synthetic", timeout=120, workload=WORKLOAD, steps=STEPS, step_time=0.005, socket=socket,
            run_dir=short_tmp / "job",
        )  # fmt: skip
        assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
        scrape = scrape_until(url, lambda s: (s.value(catalog.STEPS.name, workload=WORKLOAD) or 0) >= STEPS, timeout=30)
        assert scrape.value(catalog.STEPS.name, workload=WORKLOAD) == STEPS, built.podman("logs", name).stderr
        assert built.podman("healthcheck", "run", name).returncode == 0
        # Nothing in the image can be written, by the sidecar's user or any other.
        write = built.podman("exec", name, "/usr/bin/python3", "-c", "open('/usr/local/bin/x', 'w')")
        assert "Read-only file system" in write.stderr, write.stderr

        assert built.podman("kill", "--signal", "TERM", name).returncode == 0
        scrape_until(url, lambda s: True)  # the scrape of the final state the sidecar lingers for
        exited = built.podman("wait", name, timeout=60)
        assert exited.stdout.strip() == "0", built.podman("logs", name).stderr
        logs = built.podman("logs", name)
        log = logs.stdout + logs.stderr
        assert "events at /run/tpuscope/events.sock" in log and "stopped" in log.splitlines()[-1], log
    finally:
        built.podman("rm", "--force", name)
