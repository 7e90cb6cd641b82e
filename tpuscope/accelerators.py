"""One name per accelerator model, whoever reports it.

JAX says ``TPU v5 lite``, a Cloud TPU VM's ``TPU_ACCELERATOR_TYPE`` says
``v5litepod-8``, NVML says ``NVIDIA H100 80GB HBM3``. The ``accelerator`` label
must read the same from the workload, the libtpu collector and the NVML
collector, or the dashboards split one fleet into three.
"""

from __future__ import annotations

# Substrings of the lowercased description -> our name; the most specific first.
_NAMES = (
    ("v5 lite", "v5e"),
    ("v5lite", "v5e"),
    ("v5e", "v5e"),
    ("v5p", "v5p"),
    ("v6 lite", "v6e"),
    ("v6e", "v6e"),
    ("v4", "v4"),
    ("7x", "v7x"),
    ("h200", "h200"),
    ("h100", "h100"),
    ("a100", "a100"),
)


def accelerator_name(description: str) -> str | None:
    """``TPU v5 lite`` / ``v5litepod-8`` -> ``v5e``; ``NVIDIA H100 80GB HBM3`` -> ``h100``; unknown -> None."""
    text = description.lower()
    for needle, name in _NAMES:
        if needle in text:
            return name
    return None
