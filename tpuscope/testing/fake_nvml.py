"""A fake ``libnvidia-ml.so.1``, to test the NVML collector at the real C-library boundary.

pynvml finds NVML with ``ctypes.CDLL("libnvidia-ml.so.1")`` on Linux, so a subprocess whose
``LD_LIBRARY_PATH`` starts with the directory :func:`build` returns uses the library compiled from
``fake_nvml.c`` instead of the driver's, with no NVIDIA GPU or driver on the machine. Mocking pynvml
would test our guesses about it; this tests pynvml's real ctypes calls, struct layouts and error
classes.

The library answers from a plain-text state file that :class:`FakeNvmlState` writes; the library
re-reads it while the process under test runs, so a test can change GPU values, inject XID events
or failures mid-run and watch the collector react. The format is documented in ``fake_nvml.c``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

LIBRARY_NAME = "libnvidia-ml.so.1"
STATE_ENV = "TPUSCOPE_FAKE_NVML_STATE"
MAX_DEVICES = 16
NOT_SUPPORTED_WORDS = frozenset(
    {"power", "temperature", "clocks", "utilization", "memory", "events", "max_clocks", "clocks_event_reasons"}
)
# Entry points build() can leave out of the library, as a driver older than the function has no such symbol.
OMITTABLE = frozenset(
    {
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetCurrentClocksEventReasons",  # since R535
        "nvmlDeviceGetCurrentClocksThrottleReasons",  # its name before R535
    }
)


def build(directory: Path, omit: Iterable[str] = ()) -> Path:
    """Compile ``fake_nvml.c`` into ``directory/libnvidia-ml.so.1``; return ``directory``, for LD_LIBRARY_PATH.

    ``omit``: entry points (among ``OMITTABLE``) to leave out of the library, to test a driver that
    predates them; build such a library in a directory of its own.

    Compiled to a temporary name and renamed into place, so a process that already has an older
    build mapped is never handed a half-written file.
    """
    unknown = set(omit) - OMITTABLE
    if unknown:
        raise ValueError(f"cannot omit {sorted(unknown)}; omittable: {sorted(OMITTABLE)}")
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc not found on PATH: it is needed to build the fake NVML library")
    source = Path(__file__).with_name("fake_nvml.c")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / LIBRARY_NAME
    partial = directory / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
    command = [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-pthread", "-o", str(partial), str(source)]
    command += [f"-DFAKE_NVML_OMIT_{name}" for name in sorted(set(omit))]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"building the fake NVML library failed ({' '.join(command)}):\n{result.stderr}")
    os.replace(partial, target)
    return directory


@dataclass
class FakeGpu:
    """What one fake GPU reports; the defaults look like a lightly loaded H100 SXM."""

    name: str = "NVIDIA H100 80GB HBM3"
    utilization_gpu: int = 0
    utilization_memory: int = 0
    memory_used: int = 1_048_576 * 512
    memory_total: int = 85_899_345_920
    power_mw: int = 70_000
    temperature_c: int = 33
    clock_sm_mhz: int = 1980
    clock_mem_mhz: int = 2619
    uuid: str | None = None
    """None: the library makes one up from the index."""
    clock_sm_max_mhz: int = 1980
    clock_mem_max_mhz: int = 2619
    clocks_event_reasons: int = 0
    """The bit mask of nvml.h's nvmlClocksEventReason* (0x40: hardware thermal slowdown); 0: full speed."""


@dataclass(frozen=True)
class _Xid:
    device: int
    xid: int
    sequence: int


@dataclass
class FakeNvmlState:
    """The state file the fake library answers from; change the attributes, then :meth:`write`.

    ``fail_init``: the nvmlReturn_t every nvmlInit* returns (e.g. 9, driver not loaded).
    ``fail_device``: the code every per-device query returns (e.g. 15, GPU is lost), on every GPU
    or, if ``fail_device_index`` is set, only on that one. ``hang_ms``: how long every per-device
    query sleeps first, to test deadlines. ``not_supported``: queries that return NOT_SUPPORTED,
    among ``NOT_SUPPORTED_WORDS``.
    """

    path: Path
    gpus: list[FakeGpu] = field(default_factory=lambda: [FakeGpu()])
    fail_init: int | None = None
    fail_device: int | None = None
    fail_device_index: int | None = None
    hang_ms: int = 0
    not_supported: set[str] = field(default_factory=set)
    _xids: list[_Xid] = field(default_factory=list, init=False, repr=False)

    def xid(self, device: int, xid: int) -> None:
        """Add an XID critical-error event on ``device``; the library delivers each one once per process.

        Events are kept across writes (the library remembers which it delivered by their sequence
        number), so call :meth:`write` after adding them.
        """
        self._xids.append(_Xid(device, xid, len(self._xids) + 1))

    def render(self) -> str:
        """The state file's text."""
        if len(self.gpus) > MAX_DEVICES:
            raise ValueError(f"the fake NVML library holds at most {MAX_DEVICES} GPUs, not {len(self.gpus)}")
        unknown = self.not_supported - NOT_SUPPORTED_WORDS
        if unknown:
            raise ValueError(f"unknown not_supported queries {sorted(unknown)}; known: {sorted(NOT_SUPPORTED_WORDS)}")
        lines = ["# tpuscope fake NVML state (see tpuscope/testing/fake_nvml.c)", f"devices {len(self.gpus)}"]
        for index, gpu in enumerate(self.gpus):
            for text in (gpu.name, gpu.uuid or ""):
                if "\n" in text or "#" in text:
                    raise ValueError(f"GPU {index}: names and UUIDs cannot hold a newline or '#': {text!r}")
            lines += [
                f"name {index} {gpu.name}",
                f"utilization {index} {gpu.utilization_gpu} {gpu.utilization_memory}",
                f"memory {index} {gpu.memory_used} {gpu.memory_total}",
                f"power {index} {gpu.power_mw}",
                f"temperature {index} {gpu.temperature_c}",
                f"clocks {index} {gpu.clock_sm_mhz} {gpu.clock_mem_mhz}",
                f"max_clocks {index} {gpu.clock_sm_max_mhz} {gpu.clock_mem_max_mhz}",
                f"clocks_event_reasons {index} {gpu.clocks_event_reasons:#x}",
            ]
            if gpu.uuid is not None:
                lines.append(f"uuid {index} {gpu.uuid}")
        lines += [f"xid {event.device} {event.xid} {event.sequence}" for event in self._xids]
        if self.fail_init is not None:
            lines.append(f"fail init {self.fail_init}")
        if self.fail_device is not None:
            only = "" if self.fail_device_index is None else f" {self.fail_device_index}"
            lines.append(f"fail device {self.fail_device}{only}")
        if self.hang_ms:
            lines.append(f"hang_ms {self.hang_ms}")
        lines += [f"notsupported {word}" for word in sorted(self.not_supported)]
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        """Write the state file atomically (temp file + rename), so the library never reads half of it."""
        text = self.render()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(text)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def environment(lib_dir: Path, state: FakeNvmlState) -> dict[str, str]:
    """Variables to add to a subprocess's environment so its pynvml loads the fake library and state.

    LD_LIBRARY_PATH is searched before the system's library cache, so the fake wins even on a
    machine with a real driver; it only takes effect at process start, hence a subprocess.
    """
    inherited = os.environ.get("LD_LIBRARY_PATH", "")
    library_path = str(lib_dir.resolve()) + (f":{inherited}" if inherited else "")
    return {"LD_LIBRARY_PATH": library_path, STATE_ENV: str(state.path.resolve())}
