"""One chip, one ``device``: the TPU runtime's device ids turned into the host's chip indexes.

A TPU host's chips are numbered two ways. libtpu's metrics service keys duty cycle and HBM by the runtime's device
id, JAX's ``Device.id``: on a single-host slice the chip's index on the host (0 to 7), on a multi-host slice its id
in the whole slice (404, 405, 412 and 413 on one v5p host of an 8x8x16). GKE's TPU device plugin keys those two
families the same way, but TensorCore utilization and HBM bandwidth, which it reads from the host's PCI devices, by
the chip's index on the host (0 to 3); libtpu's HLO metrics carry the process's device ordinal; XProf's device planes
and NVML count from 0 on the host as well. So tpuscope's ``device`` label is the host's chip index on every family
and from every source, and ``tpuscope_tpu_chip_info`` keeps the runtime's id beside it (docs/metrics.md).

A multi-host slice gives each host a block of chips (2x2x1 on a v5p, v5e or v6e host) whose ids, in increasing
order, are the host's chips in order: a runtime id's index is its rank among the host's ids. Where every id is
below the host's chip count, the ids already are the indexes (a single-host slice, or a process holding some of its
chips). Neither libtpu nor the plugin says this: the rank is inferred (the plugin's own scrape, with ids 404, 405,
412, 413 beside indexes 0 to 3, fits it), and the info series lets a user check it against ``jax.devices()``.

The ids seen are remembered for the collector's life, so a port that stops answering renumbers no other chip.
"""

from __future__ import annotations

from collections.abc import Iterable

from tpuscope import catalog
from tpuscope.exporter.samples import Sample


class HostChips:
    """This host's chips as the runtime numbers them, and the index ``device`` gives each."""

    def __init__(self, count: int | None = None) -> None:
        self.count = count  # the host's chips, where something says (the PCI devices tpu-info counts)
        self._ids: set[int] = set()

    def see(self, ids: Iterable[int]) -> None:
        """Runtime device ids a source reported for this host's chips."""
        self._ids.update(ids)

    def index(self, device_id: int) -> int:
        """The host's index of the chip the runtime calls ``device_id``; a number the runtime never reported as an
        id is taken as an index already (a source that counts from 0 on the host)."""
        if device_id not in self._ids or self._numbered_from_zero():
            return device_id
        return sorted(self._ids).index(device_id)

    def label(self, device_id: int) -> str:
        return str(self.index(device_id))

    def _numbered_from_zero(self) -> bool:
        limit = self.count if self.count is not None else len(self._ids)
        return max(self._ids) < limit

    def info(self, accelerator: str, source: str) -> list[Sample]:
        """``tpuscope_tpu_chip_info`` for every chip seen: its index and the runtime's id."""
        return [
            Sample(catalog.TPU_CHIP_INFO, (self.label(i), str(i), accelerator, source), 1.0) for i in sorted(self._ids)
        ]
