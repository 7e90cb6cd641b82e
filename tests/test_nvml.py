"""The nvml collector through pynvml and a fake libnvidia-ml.so.1: the real C-library boundary, no GPU needed.

The fake (tpuscope/testing/fake_nvml.c) exports the NVML symbols pynvml calls and
answers from a state file the test rewrites mid-run. What needs a real GPU
(the numbers a real driver gives) is checked on a lent GPU machine when there
is one; see the issue notes.
"""

from __future__ import annotations

import ctypes.util
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tpuscope import catalog
from tpuscope.scrape import Scrape
from tpuscope.testing.fake_nvml import FakeGpu, FakeNvmlState, build, environment
from tpuscope.testing.waiting import scrape_until
from tpuscope.workload.sidecar import SidecarProcess

UP = catalog.COLLECTOR_UP.name
ERRORS = catalog.COLLECTOR_ERRORS.name
THROTTLED = catalog.THROTTLED.name
REASONS = ("power_cap", "power_brake", "thermal", "hardware")


def nvml_sidecar(socket: Path, env: dict[str, str] | None) -> SidecarProcess:
    return SidecarProcess(
        socket,
        "127.0.0.1:0",
        "--collectors=nvml",
        "--collector-interval=0.2",
        "--collector-deadline=0.5",
        env=env,
    )


@pytest.fixture
def state(short_tmp: Path) -> FakeNvmlState:
    state = FakeNvmlState(
        short_tmp / "nvml.state",
        gpus=[
            FakeGpu("NVIDIA H100 80GB HBM3", 75, 40, 10 << 30, 80 << 30, 350_500, 65, 1980, 2619),
            FakeGpu("NVIDIA H200", 3, 97, 100 << 30, 141 << 30, 699_000, 88, 345, 3201),
        ],
    )
    state.write()
    return state


def down_with(url: str, reason: str) -> Scrape:
    scrape = scrape_until(
        url, lambda s: s.value(UP, collector="nvml") == 0 and (s.value(ERRORS, reason=reason) or 0) > 0
    )
    assert scrape.present(ERRORS, collector="nvml", reason=reason) > 0 and scrape.present(UP, collector="nvml") == 0
    return scrape


def up(url: str) -> Scrape:
    scrape = scrape_until(url, lambda s: s.value(UP, collector="nvml") == 1)
    assert scrape.value(UP, collector="nvml") == 1
    return scrape


def test_every_gpu_reading_under_the_shared_names(fake_nvml_lib: Path, state: FakeNvmlState, short_tmp: Path) -> None:
    with nvml_sidecar(short_tmp / "s.sock", environment(fake_nvml_lib, state)) as sidecar:
        scrape = up(sidecar.url)
        for index, (gpu, accelerator) in enumerate(zip(state.gpus, ("h100", "h200"), strict=True)):
            d = {"device": str(index), "accelerator": accelerator, "source": "nvml"}
            assert scrape.value(catalog.DUTY_CYCLE.name, **d) == pytest.approx(gpu.utilization_gpu / 100)
            bandwidth = scrape.value(catalog.MEMORY_BANDWIDTH_UTILIZATION.name, **d)
            assert bandwidth == pytest.approx(gpu.utilization_memory / 100)
            assert scrape.value(catalog.DEVICE_MEMORY_USED.name, **d) == gpu.memory_used
            assert scrape.value(catalog.DEVICE_MEMORY_LIMIT.name, **d) == gpu.memory_total
            assert scrape.value(catalog.POWER.name, **d) == pytest.approx(gpu.power_mw / 1000)
            assert scrape.value(catalog.TEMPERATURE.name, **d) == gpu.temperature_c
            assert scrape.value(catalog.CLOCK.name, clock="sm", **d) == gpu.clock_sm_mhz * 1e6
            assert scrape.value(catalog.CLOCK.name, clock="memory", **d) == gpu.clock_mem_mhz * 1e6
        assert not scrape.has(catalog.XID_ERRORS.name)

        # XID errors arrive as driver events; each is counted once, by device and code.
        state.xid(1, 79)
        state.xid(1, 79)
        state.xid(0, 48)
        state.write()
        xid = catalog.XID_ERRORS.name
        scrape = scrape_until(sidecar.url, lambda s: s.value(xid) == 3)
        assert scrape.value(xid, device="1", xid="79", accelerator="h200") == 2
        assert scrape.value(xid, device="0", xid="48") == 1

        # A query a board does not support drops its series; the collector stays up.
        state.not_supported = {"power"}
        state.write()
        scrape = scrape_until(sidecar.url, lambda s: not s.has(catalog.POWER.name))
        assert not scrape.has(catalog.POWER.name) and scrape.value(UP, collector="nvml") == 1
        assert scrape.has(catalog.TEMPERATURE.name, device="0")
        assert sidecar.log().count("does not support the power query") == 2  # once per GPU, not per collection


def test_faults_mark_nvml_down_with_a_reason_and_it_recovers(
    fake_nvml_lib: Path, state: FakeNvmlState, short_tmp: Path
) -> None:
    state.fail_init = 9  # the driver is not loaded when the sidecar starts
    state.write()
    with nvml_sidecar(short_tmp / "s.sock", environment(fake_nvml_lib, state)) as sidecar:
        down_with(sidecar.url, "unavailable")
        state.fail_init = None
        state.write()
        up(sidecar.url)

        state.fail_device = 15  # NVML_ERROR_GPU_IS_LOST
        state.write()
        scrape = down_with(sidecar.url, "unavailable")
        assert not scrape.has(catalog.DUTY_CYCLE.name)
        state.fail_device = None
        state.write()
        up(sidecar.url)

        state.hang_ms = 3000  # every query hangs past the 0.5 s deadline
        state.write()
        down_with(sidecar.url, "deadline")
        state.hang_ms = 0
        state.write()
        up(sidecar.url)
        log = sidecar.log()
    assert log.count("collector nvml: down (unavailable)") == 2, log
    assert log.count("collector nvml: down (deadline)") == 1, log


def test_without_a_driver_nvml_says_not_supported(short_tmp: Path) -> None:
    assert ctypes.util.find_library("nvidia-ml") is None, "this test expects a host without an NVIDIA driver"
    with nvml_sidecar(short_tmp / "s.sock", None) as sidecar:
        down_with(sidecar.url, "not_supported")
        assert "NVML library not found" in sidecar.log()
    # `auto` leaves it off here rather than reporting a down collector on every GPU-less host.
    with SidecarProcess(short_tmp / "t.sock", "127.0.0.1:0", "--collector-interval=0.2") as sidecar:
        scrape = scrape_until(sidecar.url, lambda s: s.value(UP, collector="host") == 1)
        assert {s.labels["collector"] for s in scrape.find(UP)} == {"host"}
        assert "collector nvml: off (auto)" in sidecar.log()


def test_one_lost_gpu_does_not_hide_the_others(fake_nvml_lib: Path, state: FakeNvmlState, short_tmp: Path) -> None:
    state.xid(0, 79)
    state.fail_device, state.fail_device_index = 15, 1  # GPU 1 has fallen off the bus
    state.write()
    with nvml_sidecar(short_tmp / "s.sock", environment(fake_nvml_lib, state)) as sidecar:
        scrape = down_with(sidecar.url, "unavailable")
        scrape = scrape_until(sidecar.url, lambda s: s.has(catalog.XID_ERRORS.name))
        assert scrape.present(UP, collector="nvml") == 0
        assert scrape.has(catalog.DUTY_CYCLE.name, device="0")
        assert not scrape.has(catalog.DUTY_CYCLE.name, device="1")
        assert scrape.value(catalog.XID_ERRORS.name, device="0", xid="79") == 1
        state.fail_device = None
        state.write()
        assert up(sidecar.url).has(catalog.DUTY_CYCLE.name, device="1")


def test_a_hung_driver_does_not_keep_the_sidecar_from_stopping(
    fake_nvml_lib: Path, state: FakeNvmlState, short_tmp: Path
) -> None:
    state.hang_ms = 120_000
    state.write()
    with nvml_sidecar(short_tmp / "s.sock", environment(fake_nvml_lib, state)) as sidecar:
        down_with(sidecar.url, "deadline")
        assert sidecar.stop(timeout=10) == 0  # SIGTERM: a clean exit, not the SIGKILL after 10 s


def throttled(scrape: Scrape, device: str) -> dict[str, float]:
    return {s.labels["reason"]: s.value for s in scrape.find(THROTTLED, device=device)}


def gpu0_throttled(expected: dict[str, float]) -> Callable[[Scrape], bool]:
    return lambda scrape: throttled(scrape, "0") == expected


def test_max_clocks_and_why_the_driver_holds_the_clocks_down(
    fake_nvml_lib: Path, state: FakeNvmlState, short_tmp: Path
) -> None:
    state.gpus[1].clock_sm_max_mhz, state.gpus[1].clock_mem_max_mhz = 1980, 3201
    state.write()
    with nvml_sidecar(short_tmp / "s.sock", environment(fake_nvml_lib, state)) as sidecar:
        scrape = scrape_until(sidecar.url, lambda s: s.has(THROTTLED, device="1"))
        for index, gpu in enumerate(state.gpus):
            d = {"device": str(index), "source": "nvml"}
            assert scrape.value(catalog.CLOCK_MAX.name, clock="sm", **d) == gpu.clock_sm_max_mhz * 1e6
            assert scrape.value(catalog.CLOCK_MAX.name, clock="memory", **d) == gpu.clock_mem_max_mhz * 1e6
            assert throttled(scrape, str(index)) == dict.fromkeys(REASONS, 0.0)  # mask 0: full speed

        # nvml.h bits, as the driver sets them: which reason each one turns on (GPU 1 stays at full speed).
        cases = {
            0x40: {"thermal"},  # HW thermal slowdown
            0x20: {"thermal"},  # SW thermal slowdown
            0x4: {"power_cap"},  # SW power cap
            0x80: {"power_brake"},  # HW power brake
            0x8: {"hardware"},  # HW slowdown
            0x1: set(),  # GPU idle: clocks chosen low, not held down
            0x4 | 0x40: {"power_cap", "thermal"},
            0x0: set(),
        }
        for mask, reasons in cases.items():
            expected = {reason: float(reason in reasons) for reason in REASONS}
            state.gpus[0].clocks_event_reasons = mask
            state.write()
            scrape = scrape_until(sidecar.url, gpu0_throttled(expected))
            assert throttled(scrape, "0") == expected, hex(mask)
            assert throttled(scrape, "1") == dict.fromkeys(REASONS, 0.0)
            assert scrape.value(UP, collector="nvml") == 1


def test_a_gpu_without_max_clocks_or_throttle_reasons_serves_the_rest(
    fake_nvml_lib: Path, state: FakeNvmlState, short_tmp: Path
) -> None:
    state.not_supported = {"max_clocks", "clocks_event_reasons"}
    state.write()
    with nvml_sidecar(short_tmp / "s.sock", environment(fake_nvml_lib, state)) as sidecar:
        scrape = up(sidecar.url)
        assert not scrape.has(catalog.CLOCK_MAX.name) and not scrape.has(THROTTLED)
        assert scrape.value(catalog.CLOCK.name, device="1", clock="sm") == state.gpus[1].clock_sm_mhz * 1e6
        assert scrape.value(catalog.TEMPERATURE.name, device="0") == state.gpus[0].temperature_c
        log = sidecar.log()
    for query in ("max_clocks", "throttling"):
        assert log.count(f"does not support the {query} query") == 2, log  # once per GPU


@pytest.fixture(scope="module")
def old_nvml_libs() -> Iterator[dict[str, Path]]:
    """Fake libraries without the R535 reasons entry point, and without either of its names."""
    root = Path(tempfile.mkdtemp(prefix="ts-nvml-old-"))
    event, throttle = "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"
    yield {
        "before_r535": build(root / "before_r535", omit={event}),
        "neither": build(root / "neither", omit={event, throttle}),
    }
    shutil.rmtree(root, ignore_errors=True)


def test_a_driver_before_r535_answers_under_the_older_name(
    old_nvml_libs: dict[str, Path], state: FakeNvmlState, short_tmp: Path
) -> None:
    state.gpus[0].clocks_event_reasons = 0x40
    state.write()
    with nvml_sidecar(short_tmp / "s.sock", environment(old_nvml_libs["before_r535"], state)) as sidecar:
        scrape = scrape_until(sidecar.url, lambda s: s.has(THROTTLED, device="1"))
        assert throttled(scrape, "0") == {"power_cap": 0.0, "power_brake": 0.0, "thermal": 1.0, "hardware": 0.0}
        assert throttled(scrape, "1") == dict.fromkeys(REASONS, 0.0)
        assert scrape.value(UP, collector="nvml") == 1
        assert sidecar.log().count("NVML has no nvmlDeviceGetCurrentClocksEventReasons") == 1


def test_a_driver_with_neither_reasons_query_leaves_throttling_out(
    old_nvml_libs: dict[str, Path], state: FakeNvmlState, short_tmp: Path
) -> None:
    with nvml_sidecar(short_tmp / "s.sock", environment(old_nvml_libs["neither"], state)) as sidecar:
        scrape = scrape_until(
            sidecar.url, lambda s: s.value(UP, collector="nvml") == 1 and s.has(catalog.CLOCK_MAX.name)
        )
        assert scrape.value(UP, collector="nvml") == 1
        assert not scrape.has(THROTTLED)
        assert scrape.value(catalog.CLOCK_MAX.name, device="0", clock="sm") == state.gpus[0].clock_sm_max_mhz * 1e6
        assert scrape.value(catalog.DUTY_CYCLE.name, device="1") == pytest.approx(state.gpus[1].utilization_gpu / 100)
        log = sidecar.log()
    assert log.count("does not support the throttling query") == 2, log
