"""Where in a multi-host job this process runs, as the TPU environment says it.

A TPU pod slice is several hosts in lockstep; a multi-slice job is several such
slices. The sidecar labels every series with its ``slice`` and ``worker`` and
the job's spans carry the same, so a straggler can be named. Cloud TPU VMs and
GKE's TPU webhook set ``TPU_WORKER_ID`` (the host's index in its slice) and, for
multi-slice jobs, ``MEGASCALE_SLICE_ID``; Kubernetes sets ``JOB_COMPLETION_INDEX``
in every container of an Indexed Job's pod, the sidecar's included.
"""

from __future__ import annotations

from collections.abc import Mapping

SLICE_VARIABLES = ("MEGASCALE_SLICE_ID",)
WORKER_VARIABLES = ("TPU_WORKER_ID", "JOB_COMPLETION_INDEX", "JAX_PROCESS_ID")


def first_set(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    """(variable, value) of the first of ``names`` set to something, or None."""
    for name in names:
        if value := environ.get(name, "").strip():
            return name, value
    return None


def slice_of(environ: Mapping[str, str]) -> str:
    found = first_set(environ, SLICE_VARIABLES)
    return found[1] if found else "0"


def worker_of(environ: Mapping[str, str]) -> str:
    found = first_set(environ, WORKER_VARIABLES)
    return found[1] if found else "0"
