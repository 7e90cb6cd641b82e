"""The gke-device-plugin collector against GKE's TPU device plugin's metrics page, served over HTTP by the test.

The page is written here from the plugin's published format (GKE's "TPU metrics", and expositions others have
captured from ``tpu-device-plugin`` on v6e and tpu7x nodes): gauges per chip, percentages for the ratios,
labelled ``accelerator_id`` (``<node id>-<chip index>``), ``make``, ``model`` and ``tpu_topology``; each once
per container holding the chip (with ``pod``, ``namespace``, ``container``) and once per chip of the node
(``*_node``), with some metrics only in one of the two, and the Go runtime's own series beside them.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from tpuscope import catalog, kubernetes, top
from tpuscope.exporter import config
from tpuscope.exporter.collectors import COLLECTORS
from tpuscope.exporter.collectors import gke_device_plugin as plugin
from tpuscope.exporter.collectors.base import CollectorError, Settings
from tpuscope.scrape import Scrape
from tpuscope.testing.fake_device_plugin import (
    FAMILIES,
    HOLDER,
    OTHER,
    TOPOLOGY,
    FakeDevicePlugin,
    chips,
    page,
)
from tpuscope.testing.fake_tpu import Chip, FakeTpuRuntime, FakeTpuServer
from tpuscope.testing.prometheus import free_port
from tpuscope.testing.waiting import scrape_until
from tpuscope.workload.sidecar import SidecarProcess

UP = catalog.COLLECTOR_UP.name
ERRORS = catalog.COLLECTOR_ERRORS.name
DUTY = catalog.DUTY_CYCLE.name
TENSORCORE = catalog.TENSORCORE_UTILIZATION.name


@pytest.fixture
def device_plugin() -> Iterator[FakeDevicePlugin]:
    with FakeDevicePlugin(page(chips())) as fake:
        yield fake


def settings(fake: FakeDevicePlugin, libtpu: str = "") -> Settings:
    """The collector's settings; libtpu at a port nothing listens on unless ``libtpu`` names one."""
    return Settings(device_plugin_address=fake.address, libtpu_addresses=(libtpu or f"127.0.0.1:{free_port()}",))


def collected(fake: FakeDevicePlugin, **environ: str) -> dict[tuple[str, str], float]:
    """(metric, device) -> value from one collection, as the sidecar's pod given by ``environ`` (none: no pod)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("POD_NAME", "POD_NAMESPACE", "K8S_POD_NAME", "K8S_NAMESPACE_NAME"):
            patch.delenv(name, raising=False)
        for name, value in environ.items():
            patch.setenv(name, value)
        samples = plugin.GkeDevicePluginCollector(settings(fake)).collect(2.0)
    assert all(s.labels[1:] == ("v5p", plugin.SOURCE) for s in samples), samples
    by_key = {(s.metric.name, s.labels[0]): float(s.value) for s in samples}  # type: ignore[arg-type]
    assert len(by_key) == len(samples), "one value per chip and metric"
    return by_key


# --- the mapping -----------------------------------------------------------------------------------------


def test_each_chip_maps_to_the_catalogues_device_metrics_as_ratios_and_bytes(device_plugin: FakeDevicePlugin) -> None:
    got = collected(device_plugin)
    for chip in chips():
        d = str(chip.index)
        assert got[(DUTY, d)] == pytest.approx(chip.duty_percent / 100)
        assert got[(TENSORCORE, d)] == pytest.approx(chip.tensorcore_percent / 100)
        assert got[(catalog.DEVICE_MEMORY_USED.name, d)] == chip.hbm_used
        assert got[(catalog.DEVICE_MEMORY_LIMIT.name, d)] == chip.hbm_total
        assert got[(catalog.MEMORY_BANDWIDTH_UTILIZATION.name, d)] == pytest.approx(chip.bandwidth_percent / 100)
    assert len(got) == 4 * len(FAMILIES)


def test_the_per_node_value_wins_and_the_per_container_one_fills_in() -> None:
    """Where a chip has both (the plugin measures once; here they differ to tell them apart), the node's."""
    text = "\n".join(
        [
            'duty_cycle{accelerator_id="9-0",container="c",make="cloud-tpu",model="tpu7x",namespace="n",pod="p"} 10',
            'duty_cycle_node{accelerator_id="9-0",make="cloud-tpu",model="tpu7x"} 90',
            'memory_used{accelerator_id="9-0",container="c",make="cloud-tpu",model="tpu7x",namespace="n",pod="p"} 7',
        ]
    )
    readings = plugin.parse(text + "\n")
    chosen = plugin.chip_values(readings, {"9-0"})
    values = {known.metric: reading.value for (known, _), reading in chosen.items()}
    assert values == {catalog.DUTY_CYCLE: 0.9, catalog.DEVICE_MEMORY_USED: 7.0}
    assert plugin.accelerator_label("tpu7x") == "v7x"
    assert [plugin.accelerator_label(m) for m in ("tpu-v5-lite-podslice", "tpu-v6e-slice", "tpu-v5p-slice")] == [
        "v5e",
        "v6e",
        "v5p",
    ]


def test_only_this_pods_chips_where_the_plugin_says_whose_they_are() -> None:
    """Two TPU pods on one node: each sidecar serves its pod's 4 chips, not the node's 8."""
    node = chips(4, HOLDER) + chips(4, OTHER, first=4)
    with FakeDevicePlugin(page(node)) as fake:
        ours = collected(fake, POD_NAME=HOLDER[1], POD_NAMESPACE=HOLDER[0])
        assert {device for _, device in ours} == {"0", "1", "2", "3"}
        # No pod known (a TPU VM, or a sidecar without the downward API): the whole node.
        assert {device for _, device in collected(fake)} == {str(i) for i in range(8)}
        # A pod the plugin gives no chip: none of the others'.
        assert collected(fake, POD_NAME="serve-0", POD_NAMESPACE="ml") == {}
    with FakeDevicePlugin(page(chips(4, holder=None))) as idle:  # no container holds a chip yet: the node's
        assert {device for _, device in collected(idle, POD_NAME="train-0", POD_NAMESPACE="ml")} == {"0", "1", "2", "3"}


# --- auto, the options, the labels -----------------------------------------------------------------------


def test_auto_runs_it_where_the_plugin_answers(device_plugin: FakeDevicePlugin) -> None:
    collector = COLLECTORS[plugin.NAME]
    assert collector.unavailable_here(settings(device_plugin)) is None
    nothing = Settings(device_plugin_address=f"127.0.0.1:{free_port()}")
    assert "no TPU device plugin at" in (collector.unavailable_here(nothing) or "")
    device_plugin.page = page([])  # something answers, with none of the plugin's metrics
    assert "serves none" in (collector.unavailable_here(settings(device_plugin)) or "")


def resolve(*flags: str, **environ: str) -> config.ServeConfig:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.resolve(parser.parse_args(list(flags)), environ)


def test_the_topology_comes_from_the_flag_then_the_tpu_environment_then_the_plugin(
    device_plugin: FakeDevicePlugin,
) -> None:
    at = {"TPUSCOPE_DEVICE_PLUGIN_ADDRESS": device_plugin.address}
    assert resolve(**at).tpu_topology == TOPOLOGY
    assert resolve(**at).host_labels[str(catalog.Label.TPU_TOPOLOGY)] == TOPOLOGY
    asked = device_plugin.requests
    assert resolve(**at, TPU_TOPOLOGY="4x4").tpu_topology == "4x4"
    assert resolve("--tpu-topology=8x8x16", **at, TPU_TOPOLOGY="4x4").tpu_topology == "8x8x16"
    assert resolve("--collectors=host", **at).tpu_topology == ""  # its collector off: the plugin is not asked
    assert device_plugin.requests == asked
    with pytest.raises(config.ConfigError, match="TPU_TOPOLOGY"):
        resolve(**at, TPU_TOPOLOGY="v5p")
    device_plugin.page = page(chips(), topology="a slice")  # a value we cannot use: no label, no failure
    assert resolve(**at).tpu_topology == ""
    assert str(catalog.Label.TPU_TOPOLOGY) not in resolve(**at).host_labels


def test_the_address_may_be_a_bare_host_as_the_downward_api_gives_it() -> None:
    off = ("--collectors=host",)
    assert resolve(*off, "--device-plugin-address=10.0.0.7").device_plugin_address == "10.0.0.7:2112"
    assert resolve(*off, "--device-plugin-address=fd00::7").device_plugin_address == "[fd00::7]:2112"
    assert resolve(*off, "--device-plugin-address=[fd00::7]:9").device_plugin_address == "[fd00::7]:9"
    assert resolve(*off).device_plugin_address == plugin.DEFAULT_ADDRESS
    with pytest.raises(config.ConfigError, match="--device-plugin-address"):
        resolve(*off, "--device-plugin-address=:2112")


def test_the_manifests_point_the_sidecar_at_the_plugin_on_its_node() -> None:
    """The downward API gives the node's IP (not its labels); the sidecar reads it as the kubelet expands it."""
    env = kubernetes.sidecar_container()["env"]
    names = [e["name"] for e in env]
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in env if "valueFrom" in e}
    (address,) = [e["value"] for e in env if e["name"] == "TPUSCOPE_DEVICE_PLUGIN_ADDRESS"]
    variable = address.removeprefix("$(").removesuffix(")")
    assert fields[variable] == "status.hostIP" and names.index(variable) < names.index("TPUSCOPE_DEVICE_PLUGIN_ADDRESS")
    expanded = {"TPUSCOPE_DEVICE_PLUGIN_ADDRESS": address.replace(f"$({variable})", "127.0.0.1")}
    assert resolve(**expanded).device_plugin_address == f"127.0.0.1:{plugin.DEFAULT_PORT}"


# --- a real sidecar ----------------------------------------------------------------------------------------


def plugin_sidecar(socket: Path, fake: FakeDevicePlugin, *extra: str, libtpu: str = "") -> SidecarProcess:
    return SidecarProcess(
        socket,
        "127.0.0.1:0",
        f"--device-plugin-address={fake.address}",
        f"--libtpu-address={libtpu or f'127.0.0.1:{free_port()}'}",
        "--collector-interval=0.2",
        "--collector-deadline=0.5",
        *extra,
        # The pod the page's chips are allocated to; no TPU_TOPOLOGY, so the topology is the plugin's.
        env={"POD_NAME": HOLDER[1], "POD_NAMESPACE": HOLDER[0], "TPU_TOPOLOGY": ""},
    )


def test_the_sidecar_serves_each_chip_with_its_accelerator_and_topology_and_top_shows_them(
    device_plugin: FakeDevicePlugin, short_tmp: Path
) -> None:
    with plugin_sidecar(short_tmp / "s.sock", device_plugin, f"--collectors={plugin.NAME}") as sidecar:
        scrape = scrape_until(sidecar.url, lambda s: s.has(TENSORCORE))
        assert scrape.value(UP, collector=plugin.NAME) == 1, sidecar.log()
        where = {"accelerator": "v5p", "source": plugin.SOURCE, "tpu_topology": TOPOLOGY}
        for chip in chips():
            d = {"device": str(chip.index), **where}
            assert scrape.value(DUTY, **d) == pytest.approx(chip.duty_percent / 100)
            assert scrape.value(TENSORCORE, **d) == pytest.approx(chip.tensorcore_percent / 100)
            assert scrape.value(catalog.DEVICE_MEMORY_USED.name, **d) == chip.hbm_used
            assert scrape.value(catalog.DEVICE_MEMORY_LIMIT.name, **d) == chip.hbm_total
        # The topology is the host's, on every series (the sidecar's own too), not only the devices'.
        assert scrape.has(catalog.BUILD_INFO.name, tpu_topology=TOPOLOGY)
        source = top.Source(sidecar.url)
        source.read(5.0)
        console = Console(record=True, width=160)
        console.print(top.devices_table(source))
    rows = [line for line in console.export_text().splitlines() if plugin.SOURCE in line]
    assert len(rows) == 4 and all("v5p" in row and "%" in row for row in rows), rows


def test_where_libtpu_answers_it_wins_and_the_plugin_adds_what_libtpu_lacks(
    device_plugin: FakeDevicePlugin, short_tmp: Path
) -> None:
    runtime = FakeTpuServer(FakeTpuRuntime([Chip(d, duty_cycle_percent=70.0) for d in range(4)])).start()
    collectors = f"--collectors=libtpu,{plugin.NAME}"
    try:
        with plugin_sidecar(short_tmp / "s.sock", device_plugin, collectors, libtpu=runtime.address) as sidecar:

            def duty_from(source: str) -> Scrape:
                def only(scrape: Scrape) -> bool:
                    sources = {s.labels["source"] for s in scrape.find(DUTY)}
                    return sources == {source} and len(list(scrape.find(DUTY))) == 4 and scrape.has(TENSORCORE)

                scrape = scrape_until(sidecar.url, only)
                assert only(scrape), f"duty cycle not from {source} alone:\n{scrape.text}\n{sidecar.log()}"
                return scrape

            scrape = duty_from("libtpu")
            assert scrape.value(DUTY, device="0") == pytest.approx(0.7)
            assert not scrape.has(catalog.DEVICE_MEMORY_USED.name, source=plugin.SOURCE)
            assert {s.labels["source"] for s in scrape.find(TENSORCORE)} == {plugin.SOURCE}
            runtime.stop()  # the runtime's metrics service gone (a job without TPU_RUNTIME_METRICS_PORTS)
            scrape = duty_from(plugin.SOURCE)
            assert scrape.value(DUTY, device="0") == pytest.approx(chips()[0].duty_percent / 100)
            runtime.start()
            duty_from("libtpu")
            log = sidecar.log()
    finally:
        runtime.stop()
    assert log.count("libtpu answers at") == 2, log


def test_the_collector_goes_down_with_a_reason_and_recovers(device_plugin: FakeDevicePlugin, short_tmp: Path) -> None:
    with plugin_sidecar(short_tmp / "s.sock", device_plugin, f"--collectors={plugin.NAME}") as sidecar:

        def state(up: int, reason: str = "") -> Scrape:
            errors = Scrape.fetch(sidecar.url).present(ERRORS, collector=plugin.NAME, reason=reason) if reason else 0

            def reached(scrape: Scrape) -> bool:
                failed = not reason or scrape.present(ERRORS, collector=plugin.NAME, reason=reason) > errors
                return scrape.value(UP, collector=plugin.NAME) == up and failed

            scrape = scrape_until(sidecar.url, reached)
            assert reached(scrape), f"never up={up} ({reason}):\n{sidecar.log()}"
            return scrape

        assert state(1).has(DUTY)
        device_plugin.stop()
        assert not state(0, "unavailable").has(DUTY), "no series frozen at their last values"
        device_plugin.start()
        assert state(1).has(DUTY)
        device_plugin.status = 500
        state(0, "invalid_response")
        device_plugin.status = 200
        device_plugin.page = page([])  # a plugin that serves none of the metrics we know
        state(0, "unknown_metrics")
        device_plugin.page = page(chips())
        assert state(1).has(DUTY)
        log = sidecar.log()
    assert log.count(f"collector {plugin.NAME}: down (unavailable)") == 1, log


def test_a_failed_fetch_says_why() -> None:
    with pytest.raises(CollectorError) as refused:
        plugin.fetch(f"127.0.0.1:{free_port()}", 1.0)
    assert refused.value.reason == "unavailable"
    with FakeDevicePlugin("this is not { prometheus text\n") as fake, pytest.raises(CollectorError) as garbled:
        plugin.parse(plugin.fetch(fake.address, 1.0))
    assert garbled.value.reason == "invalid_response"
