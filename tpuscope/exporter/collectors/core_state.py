"""What a stalled job's TPU cores are doing: the runtime's ``GetTpuRuntimeStatus``, asked only during a stall.

libtpu's metrics service answers, for each core of its host, the program it runs (a fingerprint), where its
sequencers are in it (the HLO location, when ``include_hlo_info`` asks), the programs queued behind it and any
error (tpu_telemetry.proto's ``CurrentCoreStateSummary``). In a hung multi-host job every worker's cores wait at
the same collective but one's: the worker whose cores sit elsewhere is usually the one the others wait for. Each
sidecar serves its own cores; the rules compare the workers (tpuscope.alerts.recording.core_state_rules).

The HLO details cost the runtime work to gather and say nothing while a job steps, so the libtpu collector asks
only while a workload connected to the sidecar has made no progress (a step, its start, a checkpoint or a
compile stage ending) for :attr:`StallTrigger.after` seconds: the alerts' stall threshold by default
(thresholds.stall_seconds), so the state is there by the time TpuscopeWorkloadStalled fires. What it serves is
bounded: at most :data:`MAX_CORES` cores, each value cut to the alphabet and length of a label value
(events.LabelValue).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tpuscope import catalog, events
from tpuscope.exporter.samples import Sample

log = logging.getLogger("tpuscope.collectors")

# A host has 4 or 8 chips of one or two TensorCores, and up to four SparseCores each on a v5p: room for all.
MAX_CORES = 64
# The start of a program fingerprint, in hex: enough to tell a host's few programs apart, short enough to read.
FINGERPRINT_DIGITS = 16
# A core that runs no program, or a sequencer the runtime gives no HLO location for.
NONE = "none"
# tpu_telemetry.proto's TpuCoreTypeProto values -> the prefix of the core label (tc0: TensorCore 0 of the chip).
_CORE_KINDS = {1: "tc", 2: "sc", 3: "sc"}
_TENSOR_CORE_SEQUENCER = 1  # TpuSequencerTypeProto.TPU_SEQUENCER_TYPE_TENSOR_CORE_SEQUENCER


def label_value(text: str) -> str:
    """``text`` as a label value, as the job's own labels are made (:func:`tpuscope.events.label_value`)."""
    return events.label_value(text, NONE)


@dataclass(frozen=True)
class CoreAt:
    """Where one core is: its chip (``device``, as the other runtime series name it), which core of the chip,
    the program and the HLO location, each already a label value."""

    device: str
    core: str
    fingerprint: str
    hlo_location: str
    error: str = ""  # the runtime's error message for the core, for the log: free text, never a label

    @property
    def key(self) -> tuple[str, str]:
        return (self.device, self.core)

    @property
    def location(self) -> tuple[str, str]:
        return (self.fingerprint, self.hlo_location)


def cores(response: Any, chip_label: Callable[[int], str] = str) -> list[CoreAt]:
    """Each core of a ``GetTpuRuntimeStatusResponse``, in chip and core order, at most :data:`MAX_CORES`.

    ``chip_label``: the ``device`` label of the runtime's ``chip_id`` (:meth:`.chips.HostChips.label`), so that a
    core's chip is the device the other TPU series name."""
    found = sorted(
        (_core(summary, chip_label) for summary in response.core_states.values()),
        key=lambda c: (int(c.device) if c.device.isdigit() else 0, c.core),
    )
    return found[:MAX_CORES]


def _core(summary: Any, chip_label: Callable[[int], str]) -> CoreAt:
    on_chip = summary.core_id.core_on_chip
    fingerprint = summary.program_fingerprint.hex()[:FINGERPRINT_DIGITS]
    return CoreAt(
        device=chip_label(summary.core_id.chip_id),
        core=f"{_CORE_KINDS.get(on_chip.type, 'core')}{on_chip.index}",
        fingerprint=fingerprint or NONE,
        hlo_location=label_value(_hlo_location(summary.sequencer_info)),
        error=summary.error_message if summary.HasField("error_message") else "",
    )


def _hlo_location(sequencers: Iterable[Any]) -> str:
    """The HLO location of the core's main sequencer (a TensorCore's), else of the first that has one."""
    located = [s for s in sequencers if s.HasField("hlo_location") and s.hlo_location]
    located.sort(key=lambda s: s.sequencer_type != _TENSOR_CORE_SEQUENCER)
    return located[0].hlo_location if located else ""


class StallTrigger:
    """Whether to ask the runtime now: a workload connected to the sidecar has made no progress for ``after``
    seconds, or its processes here are stuck (``stuck``: the hang watch's, exporter/hangs.py, which says it
    sooner). ``progress``: each connected workload -> the Unix time of its last progress (the aggregator's)."""

    def __init__(
        self,
        progress: Callable[[], Mapping[str, float]],
        after: float,
        stuck: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        self.progress = progress
        self.after = after
        self.stuck = stuck

    def stalled(self, now: float | None = None) -> list[str]:
        """The connected workloads without progress for ``after`` seconds, and the stuck ones."""
        now = time.time() if now is None else now
        quiet = {workload for workload, last in self.progress().items() if now - last >= self.after}
        return sorted(quiet | self.stuck())


class CoreClock:
    """Since when each core has been at its location, as far as the sidecar has seen: from the first answer
    that put it there, a lower bound. Forgotten when the stall ends, so the next one counts afresh."""

    def __init__(self) -> None:
        self._since: dict[tuple[str, str], tuple[tuple[str, str], float]] = {}
        self._errors: dict[tuple[str, str], str] = {}

    def samples(self, found: list[CoreAt], now: float | None = None) -> list[Sample]:
        now = time.monotonic() if now is None else now
        since = {}
        for core in found:
            location, first = self._since.get(core.key, (core.location, now))
            since[core.key] = (core.location, first if location == core.location else now)
            self._log_error(core)
        self._since = since
        return [
            sample
            for core in found
            for sample in (
                Sample(catalog.CORE_STATE, (core.device, core.core, *core.location), 1.0),
                Sample(catalog.CORE_LOCATION_AGE, core.key, now - since[core.key][1]),
            )
        ]

    def _log_error(self, core: CoreAt) -> None:
        """A core's error, logged when it first says it (the message is free text: the log's, not a label's)."""
        if core.error and self._errors.get(core.key) != core.error:
            log.warning("TPU core %s of chip %s reports an error: %s", core.core, core.device, core.error)
        self._errors[core.key] = core.error

    def forget(self) -> None:
        self._since.clear()
        self._errors.clear()
