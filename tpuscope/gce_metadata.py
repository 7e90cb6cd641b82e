"""The VM's metadata server (Compute Engine, Cloud TPU VMs, GKE nodes): is the platform ending this VM?

A process that disappears says nothing about why. Whoever sees it go (the sidecar, when a job's connection
closes without a goodbye; the job itself, when it opted in to a SIGTERM handler) asks the VM's metadata server:
``instance/maintenance-event`` says TERMINATE_ON_HOST_MAINTENANCE while a host maintenance event stops the VM,
``instance/preempted`` says TRUE once a spot or preemptible VM is preempted. docs/failures.md says where each is
served (not by GKE's own metadata server, under Workload Identity) and what each environment can tell.

Both sides use it, so it belongs to neither. The job imports it only after a SIGTERM, and urllib (a sixth of
the Monitor's import time) is imported inside the functions, so the job's import path stays free of it. The
server is asked by its address, never by name: a DNS look-up is the one wait no timeout here would bound.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from tpuscope import reasons

# Where the server is: GCE_METADATA_HOST as Google's own clients read it (host or host:port), which is also how a
# test points it at a server of its own; else the address every Compute Engine VM reaches it at.
METADATA_HOST_ENV = "GCE_METADATA_HOST"
METADATA_ADDRESS = "169.254.169.254"
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
MAINTENANCE_PATH = "/computeMetadata/v1/instance/maintenance-event"
# Seconds per request: the answer comes from the host itself, in milliseconds; any longer is no answer.
TIMEOUT_SECONDS = 0.5
PREEMPTION, MAINTENANCE = reasons.PLATFORM_REASONS
# The DMI product name of a Compute Engine VM ("Google Compute Engine"), readable in its containers too.
_PRODUCT_NAME = "/sys/class/dmi/id/product_name"


def metadata_host(environ: Mapping[str, str] = os.environ) -> str | None:
    """Where the metadata server answers (host or host:port), or None where there is none to ask."""
    return environ.get(METADATA_HOST_ENV) or (METADATA_ADDRESS if _on_google_vm() else None)


def termination_reason(environ: Mapping[str, str] = os.environ, timeout: float = TIMEOUT_SECONDS) -> str | None:
    """``maintenance`` while a host maintenance event terminates the VM, ``preemption`` once the VM is preempted;
    None when neither, or when there is no metadata server or it does not answer.

    A maintenance event that live-migrates the VM (MIGRATE_ON_HOST_MAINTENANCE) ends no process: it is not a
    reason, and a process that vanishes during one is booked as it would be without it."""
    host = metadata_host(environ)
    if host is None:
        return None
    if _value(host, MAINTENANCE_PATH, timeout).startswith("TERMINATE"):
        return MAINTENANCE
    if _value(host, PREEMPTED_PATH, timeout) == "TRUE":
        return PREEMPTION
    return None


def serves_termination_notices(
    environ: Mapping[str, str] = os.environ, timeout: float = TIMEOUT_SECONDS
) -> bool | None:
    """Whether the metadata server here serves ``instance/preempted``: False where it answers that it does not
    (GKE's metadata server, which a pod under Workload Identity reaches instead of the VM's, serves a few paths
    of instance/ and not this one), or where there is none; None when it does not answer (it may later)."""
    import urllib.error

    host = metadata_host(environ)
    if host is None:
        return False
    try:
        _get(host, PREEMPTED_PATH, timeout)
    except urllib.error.HTTPError:  # it answered, with a 404
        return False
    except Exception:
        return None
    return True


def _value(host: str, path: str, timeout: float) -> str:
    """The value at ``path``; empty when there is no answer in time or no such path (the platform says nothing)."""
    try:
        return _get(host, path, timeout)
    except Exception:
        return ""


def _get(host: str, path: str, timeout: float) -> str:
    """The value at ``path``, stripped; raises on no answer or an error status."""
    import urllib.request

    request = urllib.request.Request(f"http://{host}{path}", headers={"Metadata-Flavor": "Google"})
    # No proxy: the server is on the VM's own link, and a proxy from the environment would ask about another.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=timeout) as response:
        value: str = response.read(256).decode("ascii", "replace").strip()
        return value


def _on_google_vm() -> bool:
    try:
        with open(_PRODUCT_NAME) as product:
            return "Google" in product.read(64)
    except OSError:
        return False
