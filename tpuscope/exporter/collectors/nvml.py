"""``nvml``: NVIDIA GPUs through NVML (nvidia-ml-py), under the same names as TPUs where the meaning is the same.

GPU utilization is the duty cycle (the share of time a kernel was running),
memory used and total are the device memory series (used as nvidia-smi counts
it, without the driver's own reserve), memory utilization is the memory
bandwidth series. Power, temperature, clocks (current and maximum), the reasons
the driver holds the clocks down, and XID errors are GPU-only. XID errors
arrive as NVML events: each collection drains the events that came since the
previous one and counts them by device and code.

A query a GPU does not support (power on some boards), or that the driver is
too old to have, leaves that series out and is logged once; a GPU that stops
answering, or a driver that goes away, fails the collection, and the next try
starts NVML afresh.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import time
from collections import Counter
from typing import Any

from tpuscope import catalog
from tpuscope.accelerators import accelerator_name
from tpuscope.exporter.collectors.base import (
    DEADLINE,
    ERROR,
    NOT_SUPPORTED,
    UNAVAILABLE,
    Collector,
    CollectorError,
    Settings,
)
from tpuscope.exporter.samples import Sample

log = logging.getLogger("tpuscope.collectors")

SOURCE = "nvml"

# nvml.h's clocks-event reason bits (nvmlClocksEventReason*, named nvmlClocksThrottleReason* before R535),
# as numbers: the bits are the driver's ABI, while pynvml spells the constants one way or the other by version.
SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap
HW_SLOWDOWN = 0x8  # nvmlClocksEventReasonHwSlowdown
SW_THERMAL_SLOWDOWN = 0x20  # nvmlClocksEventReasonSwThermalSlowdown
HW_THERMAL_SLOWDOWN = 0x40  # nvmlClocksEventReasonHwThermalSlowdown
HW_POWER_BRAKE_SLOWDOWN = 0x80  # nvmlClocksEventReasonHwPowerBrakeSlowdown

# catalog.THROTTLED's reason label -> the bits that set it. The other bits (GPU idle, application clocks,
# sync boost, display clock) are clocks chosen lower, not held down, and set none.
# The software power cap is apart: a busy GPU at its power limit is working as designed, and the alert leaves it
# out (TpuscopeDeviceThrottled); a power brake (the rack or power supply asking the board to slow) is not.
THROTTLE_REASONS: dict[str, int] = {
    "power_cap": SW_POWER_CAP,
    "power_brake": HW_POWER_BRAKE_SLOWDOWN,
    "thermal": SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN,
    "hardware": HW_SLOWDOWN,
}

# The clocks-event reasons query under its R535 name, then its older one: the first this pynvml has is tried first.
_REASONS_QUERIES = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise CollectorError(NOT_SUPPORTED, "nvidia-ml-py is not installed (pip install 'tpuscope[gpu]')") from None
    return pynvml


def _error(nvml: Any, e: Exception, doing: str) -> CollectorError:
    """An NVMLError as a CollectorError with the reason an SRE would act on."""
    code = getattr(e, "value", None)
    if isinstance(e, nvml.NVMLError_LibraryNotFound):
        return CollectorError(NOT_SUPPORTED, f"{doing}: NVML library not found (no NVIDIA driver on this host)")
    unavailable = (nvml.NVML_ERROR_DRIVER_NOT_LOADED, nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_UNINITIALIZED)
    if code in unavailable:
        return CollectorError(UNAVAILABLE, f"{doing}: {e}")
    if code == nvml.NVML_ERROR_TIMEOUT:
        return CollectorError(DEADLINE, f"{doing}: {e}")
    return CollectorError(ERROR, f"{doing}: {e}")


class NvmlCollector(Collector):
    name = catalog.NVML

    @classmethod
    def unavailable_here(cls, settings: Settings) -> str | None:
        try:
            nvml = _nvml()
            nvml.nvmlInit()
            nvml.nvmlShutdown()
        except CollectorError as e:
            return str(e)
        except Exception as e:
            return f"NVML cannot start: {e}"
        return None

    def __init__(self, settings: Settings) -> None:
        self._nvml = _nvml()
        self._xids: Counter[tuple[str, str, str, str]] = Counter()  # (device, accelerator, source, xid) -> events
        self._unsupported: set[tuple[str, str]] = set()  # (device, query) already logged as not supported
        self._devices: list[tuple[Any, str, str]] = []  # (handle, index, accelerator)
        self._events: Any = None
        self._initialized = False  # NVML counts inits: shut down exactly once per successful init
        self._memory_v2 = True  # until the driver says it has no nvmlDeviceGetMemoryInfo_v2
        # Until the driver lacks one: a pre-R535 driver has only the older name.
        self._reasons_queries = [name for name in _REASONS_QUERIES if hasattr(self._nvml, name)]
        self._start()

    def _start(self) -> None:
        """Initialise NVML and find the GPUs and their events (again, after a failure: a lost GPU, a new driver)."""
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise _error(nvml, e, "starting NVML") from None
        self._initialized = True
        try:
            self._discover()
        except nvml.NVMLError as e:
            self.close()
            raise _error(nvml, e, "listing GPUs") from None
        if not self._devices:
            self.close()
            raise CollectorError(NOT_SUPPORTED, "NVML sees no GPU on this host")

    def _discover(self) -> None:
        nvml = self._nvml
        self._devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                model = nvml.nvmlDeviceGetName(handle)
            except nvml.NVMLError:  # a GPU that does not answer is still listed, and reported as failing
                model = ""
            model = model.decode() if isinstance(model, bytes) else str(model)
            self._devices.append((handle, str(index), accelerator_name(model) or "gpu"))
        try:
            self._events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as e:
            log.info("XID events unavailable: %s", e)
            return
        for handle, label, _ in self._devices:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
            except nvml.NVMLError as e:
                log.info("GPU %s does not report XID events: %s", label, e)

    def close(self) -> None:
        nvml = self._nvml
        if self._events is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(self._events)
            self._events = None
        if self._initialized:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
            self._initialized = False
        self._devices = []

    def collect(self, timeout: float) -> list[Sample]:
        nvml = self._nvml
        if not self._devices:  # every GPU failed last time (a driver reload?): start NVML afresh
            self.close()
            self._start()
        samples: list[Sample] = []
        errors: list[CollectorError] = []
        for handle, index, accelerator in self._devices:
            try:
                samples += self._device(handle, (index, accelerator, SOURCE))
            except nvml.NVMLError as e:  # one lost GPU must not hide the others
                errors.append(_error(nvml, e, f"reading GPU {index}"))
        try:
            self._drain_xid_events()
        except nvml.NVMLError as e:
            errors.append(_error(nvml, e, "reading XID events"))
        samples += [Sample(catalog.XID_ERRORS, key, float(n)) for key, n in self._xids.items()]
        if errors:
            if len(errors) >= len(self._devices):
                self._devices = []
            raise CollectorError(errors[0].reason, "; ".join(str(e) for e in errors), partial=samples)
        return samples

    def _device(self, handle: Any, labels: tuple[str, str, str]) -> list[Sample]:
        nvml = self._nvml

        def utilization() -> list[Sample]:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            return [
                Sample(catalog.DUTY_CYCLE, labels, rates.gpu / 100),
                Sample(catalog.MEMORY_BANDWIDTH_UTILIZATION, labels, rates.memory / 100),
            ]

        def memory() -> list[Sample]:
            info = self._memory_info(handle)
            return [
                Sample(catalog.DEVICE_MEMORY_USED, labels, float(info.used)),
                Sample(catalog.DEVICE_MEMORY_LIMIT, labels, float(info.total)),
            ]

        def power() -> list[Sample]:  # NVML says milliwatts
            return [Sample(catalog.POWER, labels, nvml.nvmlDeviceGetPowerUsage(handle) / 1000)]

        def temperature() -> list[Sample]:
            celsius = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            return [Sample(catalog.TEMPERATURE, labels, float(celsius))]

        domains = (("sm", nvml.NVML_CLOCK_SM), ("memory", nvml.NVML_CLOCK_MEM))

        def clocks() -> list[Sample]:  # NVML says MHz
            return [
                Sample(catalog.CLOCK, (*labels, name), nvml.nvmlDeviceGetClockInfo(handle, clock) * 1e6)
                for name, clock in domains
            ]

        def max_clocks() -> list[Sample]:  # MHz too
            return [
                Sample(catalog.CLOCK_MAX, (*labels, name), nvml.nvmlDeviceGetMaxClockInfo(handle, clock) * 1e6)
                for name, clock in domains
            ]

        def throttling() -> list[Sample]:
            reasons = self._clocks_event_reasons(handle)
            return [
                Sample(catalog.THROTTLED, (*labels, reason), 1.0 if reasons & bits else 0.0)
                for reason, bits in THROTTLE_REASONS.items()
            ]

        samples: list[Sample] = []
        for query in (utilization, memory, power, temperature, clocks, max_clocks, throttling):
            try:
                samples += query()
            # FunctionNotFound: a driver older than the query has no such symbol; the GPU itself is fine.
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
                if (labels[0], query.__name__) not in self._unsupported:
                    self._unsupported.add((labels[0], query.__name__))
                    log.info("GPU %s does not support the %s query; its series are left out", labels[0], query.__name__)
        return samples

    def _memory_info(self, handle: Any) -> Any:
        """Memory as nvidia-smi and DCGM count it: ``used`` leaves out what the driver reserves for itself.

        The v1 query's ``used`` adds that reserve (480 MiB on an H100 80GB HBM3 with driver 580), so
        an idle GPU would show memory in use that nvidia-smi's memory.used does not. Drivers before
        R510 have no v2 query: there v1 is all there is.
        """
        nvml = self._nvml
        if self._memory_v2:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
            except nvml.NVMLError as e:
                no_v2 = (
                    nvml.NVML_ERROR_FUNCTION_NOT_FOUND,  # no such symbol in the library
                    nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,  # a struct version this driver does not know
                    nvml.NVML_ERROR_NOT_SUPPORTED,
                )
                if getattr(e, "value", None) not in no_v2:
                    raise
                self._memory_v2 = False
                log.info("NVML has no v2 memory query (%s): memory used includes the driver's reserve", e)
        return nvml.nvmlDeviceGetMemoryInfo(handle)

    def _clocks_event_reasons(self, handle: Any) -> int:
        """The bit mask of reasons the driver holds the clocks down, under whichever name this driver has."""
        nvml = self._nvml
        while len(self._reasons_queries) > 1:  # the newer name, where an older one is left to fall back on
            try:
                return int(getattr(nvml, self._reasons_queries[0])(handle))
            except nvml.NVMLError_FunctionNotFound:  # a driver before R535
                missing = self._reasons_queries.pop(0)
                log.info("NVML has no %s: reading clocks-event reasons as %s", missing, self._reasons_queries[0])
        if not self._reasons_queries:  # a pynvml with neither name
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        return int(getattr(nvml, self._reasons_queries[0])(handle))

    def _drain_xid_events(self) -> None:
        nvml = self._nvml
        if self._events is None:
            return
        # By handle, not nvmlDeviceGetIndex: XID 79 means the GPU fell off the bus and answers nothing.
        devices = {_address(handle): (index, accelerator) for handle, index, accelerator in self._devices}
        deadline = time.monotonic() + 0.5  # events are rare; never let a storm of them hold the collection
        while time.monotonic() < deadline:
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError_Timeout:
                return
            index, accelerator = devices.get(_address(event.device), ("unknown", "gpu"))
            xid = str(event.eventData)
            self._xids[(index, accelerator, SOURCE, xid)] += 1
            log.warning("GPU %s: XID %s", index, xid)


def _address(handle: Any) -> int | None:
    """A device handle (a C pointer) as a number, to compare handles from different calls."""
    return ctypes.cast(handle, ctypes.c_void_p).value
