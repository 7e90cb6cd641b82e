"""The gke-device-plugin collector against GKE's TPU device plugin's metrics page, served over HTTP by the test.

Two pages: a real scrape of the plugin (``../shared/reference/gke-device-plugin/axlearn_sample_metrics.txt``, one
host of a v5p 8x8x16), served as it is, and :mod:`tpuscope.testing.fake_device_plugin`, written from the plugin's
source and checked here against that scrape: its chip numberings, per container and per node, its reset, its
megascale histograms, several TPU pods on one node.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from tpuscope import catalog, kubernetes, top
from tpuscope.exporter import config
from tpuscope.exporter.collectors import COLLECTORS
from tpuscope.exporter.collectors import gke_device_plugin as plugin
from tpuscope.exporter.collectors.base import CollectorError, Settings
from tpuscope.exporter.samples import Sample
from tpuscope.scrape import Scrape
from tpuscope.testing.fake_device_plugin import (
    HOLDER,
    HOST_FAMILIES,
    OTHER,
    RUNTIME_FAMILIES,
    TOPOLOGY,
    FakeDevicePlugin,
    Node,
    chips,
    multislice_histograms,
    page,
    shared_tpu7x_node,
    v5p_host,
)
from tpuscope.testing.fake_tpu import V5P_HOST, Chip, FakeTpuRuntime, FakeTpuServer
from tpuscope.testing.prometheus import free_port
from tpuscope.testing.waiting import scrape_until
from tpuscope.workload.sidecar import SidecarProcess

UP = catalog.COLLECTOR_UP.name
ERRORS = catalog.COLLECTOR_ERRORS.name
DUTY = catalog.DUTY_CYCLE.name
TENSORCORE = catalog.TENSORCORE_UTILIZATION.name


REAL_SCRAPE = (
    Path(__file__).resolve().parents[1].parent / "shared/reference/gke-device-plugin/axlearn_sample_metrics.txt"
)
# The pod the real scrape's chips are allocated to.
REAL_POD = {"POD_NAMESPACE": "default", "POD_NAME": "dummy-job-0-252-7jwkw"}


def real_scrape() -> str:
    if not REAL_SCRAPE.is_file():
        pytest.fail(f"{REAL_SCRAPE} is missing: the suite reads the recorded scrape from ../shared/reference/")
    return REAL_SCRAPE.read_text()


@pytest.fixture
def device_plugin() -> Iterator[FakeDevicePlugin]:
    with FakeDevicePlugin(v5p_host()) as fake:
        yield fake


def settings(fake: FakeDevicePlugin, libtpu: str = "") -> Settings:
    """The collector's settings; libtpu at a port nothing listens on unless ``libtpu`` names one."""
    return Settings(device_plugin_address=fake.address, libtpu_addresses=(libtpu or f"127.0.0.1:{free_port()}",))


def collection(fake: FakeDevicePlugin, **environ: str) -> list[Sample]:
    """One collection's samples, as the sidecar's pod given by ``environ`` (none: no pod)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("POD_NAME", "POD_NAMESPACE", "K8S_POD_NAME", "K8S_NAMESPACE_NAME"):
            patch.delenv(name, raising=False)
        for name, value in environ.items():
            patch.setenv(name, value)
        return plugin.GkeDevicePluginCollector(settings(fake)).collect(2.0)


def collected(fake: FakeDevicePlugin, **environ: str) -> dict[tuple[str, str], float]:
    """(metric, device) -> value of the per-chip gauges of one collection."""
    samples = [s for s in collection(fake, **environ) if s.metric.labels[:3] == catalog.DUTY_CYCLE.labels]
    assert all(s.labels[2] == plugin.SOURCE for s in samples), samples
    by_key = {(s.metric.name, s.labels[0]): float(s.value) for s in samples}  # type: ignore[arg-type]
    assert len(by_key) == len(samples), "one value per chip and metric"
    return by_key


def chip_info(samples: list[Sample]) -> set[tuple[str, str]]:
    return {(s.labels[0], s.labels[1]) for s in samples if s.metric is catalog.TPU_CHIP_INFO}


# --- the fake against the real plugin ----------------------------------------------------------------------


def shape(text: str) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Each per-chip family of a page: its label names, and the numbers its accelerator_ids end in."""
    found: dict[str, tuple[set[str], set[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "accelerator_id" in sample.labels:
                names, ids = found.setdefault(sample.name, (set(), set()))
                names.update(sample.labels)
                ids.add(sample.labels["accelerator_id"].rpartition("-")[2])
    return {name: (frozenset(names), frozenset(ids)) for name, (names, ids) in found.items()}


def test_the_fakes_page_has_the_real_scrapes_families_labels_and_chip_numberings() -> None:
    """The real scrape is one v5p host's; the fake's v5p host must look the same where it matters to a reader:
    the per-chip families, their labels, and which numbering each family's accelerator_id uses."""
    real, fake = shape(real_scrape()), shape(page(v5p_host(("default", "dummy-job-0-252-7jwkw", "dummy"))))
    assert set(real) == set(fake) == {f + s for f in RUNTIME_FAMILIES + HOST_FAMILIES for s in ("", "_node")}
    assert {name: names for name, (names, _) in real.items()} == {name: names for name, (names, _) in fake.items()}
    runtime_ids, indexes = {str(i) for i in V5P_HOST}, {"0", "1", "2", "3"}
    for name, (_, ids) in real.items():
        assert ids == (runtime_ids if name.removesuffix("_node") in RUNTIME_FAMILIES else indexes), name
        assert fake[name][1] == ids, name
    for label in ("make", "model", "tpu_topology"):
        assert values_of(real_scrape(), label) == values_of(page(v5p_host()), label), label


def values_of(text: str, label: str) -> set[str]:
    """Every value ``label`` takes on a page's per-chip series."""
    return {
        s.labels[label] for f in text_string_to_metric_families(text) for s in f.samples if "accelerator_id" in s.labels
    }


# --- the mapping -----------------------------------------------------------------------------------------


def test_each_chip_maps_to_the_catalogues_device_metrics_as_ratios_and_bytes(device_plugin: FakeDevicePlugin) -> None:
    got = collected(device_plugin)
    node = v5p_host()
    for chip in node.chips:
        d = str(chip.index)  # the runtime's 404 is the host's chip 0: one device in every family
        assert got[(DUTY, d)] == pytest.approx(chip.duty_percent / 100)
        assert got[(TENSORCORE, d)] == pytest.approx(chip.tensorcore_percent / 100)
        assert got[(catalog.DEVICE_MEMORY_USED.name, d)] == chip.hbm_used
        assert got[(catalog.DEVICE_MEMORY_LIMIT.name, d)] == chip.hbm_total
        assert got[(catalog.MEMORY_BANDWIDTH_UTILIZATION.name, d)] == pytest.approx(chip.bandwidth_percent / 100)
    assert len(got) == 4 * len(RUNTIME_FAMILIES + HOST_FAMILIES)
    assert chip_info(collection(device_plugin)) == {(str(c.index), str(c.runtime_id)) for c in node.chips}


def test_the_real_scrape_alone_names_each_chip_once_in_every_family() -> None:
    with FakeDevicePlugin(real_scrape()) as fake:
        samples = collection(fake, **REAL_POD)
    devices = {
        metric: {s.labels[0] for s in samples if s.metric is metric}
        for metric in (
            catalog.DUTY_CYCLE,
            catalog.DEVICE_MEMORY_USED,
            catalog.DEVICE_MEMORY_LIMIT,
            catalog.TENSORCORE_UTILIZATION,
        )
    }
    assert all(found == {"0", "1", "2", "3"} for found in devices.values()), devices
    tensorcore = {s.labels[0]: s.value for s in samples if s.metric is catalog.TENSORCORE_UTILIZATION}
    assert tensorcore == {"0": 0.01, "1": 0.02, "2": 0.03, "3": 0.04}
    assert chip_info(samples) == {("0", "404"), ("1", "405"), ("2", "412"), ("3", "413")}


def test_the_per_node_value_wins_and_the_per_container_one_fills_in() -> None:
    """Where a chip has both (the plugin measures once; here they differ to tell them apart), the node's."""
    text = "\n".join(
        [
            'duty_cycle{accelerator_id="9-0",container="c",make="cloud-tpu",model="tpu7x",namespace="n",pod="p"} 10',
            'duty_cycle_node{accelerator_id="9-0",make="cloud-tpu",model="tpu7x"} 90',
            'memory_used{accelerator_id="9-0",container="c",make="cloud-tpu",model="tpu7x",namespace="n",pod="p"} 7',
        ]
    )
    readings = plugin.parse(text + "\n").readings
    chosen = plugin.chip_values(readings, {0}, plugin.numbering(readings))
    values = {known.metric: reading.value for (known, _), reading in chosen.items()}
    assert values == {catalog.DUTY_CYCLE: 0.9, catalog.DEVICE_MEMORY_USED: 7.0}
    assert plugin.accelerator_label("tpu7x") == "v7x"
    assert [plugin.accelerator_label(m) for m in ("tpu-v5-lite-podslice", "tpu-v6e-slice", "tpu-v5p-slice")] == [
        "v5e",
        "v6e",
        "v5p",
    ]


def test_only_this_pods_chips_as_its_libtpu_reports_them_though_the_host_families_show_every_chip() -> None:
    """A tpu7x node shared by two pods of 2 chips (device spreading): the plugin writes every chip's TensorCore
    utilization under both pods; each sidecar serves its own pod's 2 chips, the ones its libtpu reports."""
    node = shared_tpu7x_node()
    with FakeDevicePlugin(node) as fake:
        ours = collected(fake, POD_NAME=HOLDER[1], POD_NAMESPACE=HOLDER[0])
        assert {device for _, device in ours} == {"0", "1"}
        assert {device for name, device in ours if name == TENSORCORE} == {"0", "1"}
        theirs = collected(fake, POD_NAME=OTHER[1], POD_NAMESPACE=OTHER[0])
        assert {device for _, device in theirs} == {"2", "3"}
        # No pod known (a TPU VM, or a sidecar without the downward API): the whole node.
        assert {device for _, device in collected(fake)} == {"0", "1", "2", "3"}
        # A pod the plugin gives no chip: none of the others'.
        assert collected(fake, POD_NAME="serve-0", POD_NAMESPACE="ml") == {}
        node.containers = []  # no container holds a chip yet: the node's, from the host families
        idle = collected(fake, POD_NAME="train-0", POD_NAMESPACE="ml")
        assert {device for _, device in idle} == {"0", "1", "2", "3"}
        assert {name for name, _ in idle} == {TENSORCORE, catalog.MEMORY_BANDWIDTH_UTILIZATION.name}


def test_the_plugins_minute_reset_of_its_host_families_is_no_gap_and_an_absence_past_the_hold_is_no_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = v5p_host()
    with FakeDevicePlugin(node) as fake, pytest.MonkeyPatch.context() as env:
        env.setenv("POD_NAME", HOLDER[1])
        env.setenv("POD_NAMESPACE", HOLDER[0])
        collector = plugin.GkeDevicePluginCollector(settings(fake))
        before = {(s.metric, s.labels[0]): s.value for s in collector.collect(2.0)}
        node.host_reset = True  # the moment between the plugin's Reset and its Set
        during = {(s.metric, s.labels[0]): s.value for s in collector.collect(2.0)}
        assert during == before, "held through the reset, not dropped and not an error"
        monkeypatch.setattr(plugin, "HOLD_SECONDS", 0.0)  # a host library that stays silent past the hold
        after = {(s.metric, s.labels[0]) for s in collector.collect(2.0)}
    assert {metric for metric, _ in after} == {
        catalog.DUTY_CYCLE,
        catalog.DEVICE_MEMORY_USED,
        catalog.DEVICE_MEMORY_LIMIT,
        catalog.TPU_CHIP_INFO,
    }


def test_the_plugins_megascale_histograms_are_served_where_libtpu_is_not_reachable() -> None:
    node = v5p_host(megascale=multislice_histograms())
    with FakeDevicePlugin(node) as fake:
        samples = collection(fake, POD_NAME=HOLDER[1], POD_NAMESPACE=HOLDER[0])
        elsewhere = collection(fake, POD_NAME="serve-0", POD_NAMESPACE="ml")
    served = {s.labels: s.value for s in samples if s.metric is catalog.MEGASCALE_LATENCY}
    expected: dict[tuple[str, str], int] = {}
    for series in node.containers[0].megascale:
        operation, size_label = plugin.HISTOGRAMS[series.family]
        key = (operation, series.labels[size_label])
        expected[key] = expected.get(key, 0) + sum(series.counts)
    assert {labels: h.count for labels, h in served.items()} == expected  # type: ignore[union-attr]
    first = node.containers[0].megascale[0]
    histogram = served[("dcn_transfer", first.labels["buffer_size"])]
    assert histogram.buckets[0][0] == pytest.approx(first.scale / 1e6), "microseconds become seconds"  # type: ignore[union-attr]
    assert catalog.MEGASCALE_LATENCY not in {s.metric for s in elsewhere}, "another pod's histograms are not ours"


# --- auto, the options, the labels -----------------------------------------------------------------------


def test_auto_runs_it_where_the_plugin_answers(device_plugin: FakeDevicePlugin) -> None:
    collector = COLLECTORS[plugin.NAME]
    assert collector.unavailable_here(settings(device_plugin)) is None
    nothing = Settings(device_plugin_address=f"127.0.0.1:{free_port()}")
    assert "no TPU device plugin at" in (collector.unavailable_here(nothing) or "")
    device_plugin.page = Node(chips(), [], ticked=False)  # something answers, with none of the plugin's metrics
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
    device_plugin.page = Node(chips(), [], topology="a slice")  # a value we cannot use: no label, no failure
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
    runtime = FakeTpuServer(FakeTpuRuntime([Chip(d, duty_cycle_percent=70.0) for d in V5P_HOST])).start()
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
        device_plugin.page = Node(chips(), [], ticked=False)  # a plugin that has not collected yet
        state(0, "unknown_metrics")
        device_plugin.page = v5p_host()
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


def test_the_real_scrape_beside_a_libtpu_numbering_chips_404_to_413_names_the_same_4_chips_in_every_family(
    short_tmp: Path,
) -> None:
    """The real plugin's page (duty cycle and HBM by runtime id, TensorCore utilization by the host's index) and the
    runtime of the same host: one sidecar, one set of 4 chips across the families and both sources."""
    runtime = FakeTpuRuntime([Chip(d, duty_cycle_percent=60.0 + n) for n, d in enumerate(V5P_HOST)])
    with (
        FakeDevicePlugin(real_scrape()) as fake,
        FakeTpuServer(runtime) as libtpu,
        SidecarProcess(
            short_tmp / "s.sock",
            "127.0.0.1:0",
            f"--collectors=libtpu,{plugin.NAME}",
            f"--device-plugin-address={fake.address}",
            f"--libtpu-address={libtpu.address}",
            "--collector-interval=0.2",
            "--collector-deadline=0.5",
            env={"POD_NAME": REAL_POD["POD_NAME"], "POD_NAMESPACE": REAL_POD["POD_NAMESPACE"], "TPU_TOPOLOGY": ""},
        ) as sidecar,
    ):
        families = (DUTY, catalog.DEVICE_MEMORY_USED.name, catalog.DEVICE_MEMORY_LIMIT.name, TENSORCORE)

        def complete(scrape: Scrape) -> bool:
            return all(len(list(scrape.find(name))) == 4 for name in families)

        scrape = scrape_until(sidecar.url, complete)
        assert complete(scrape), f"{scrape.text}\n{sidecar.log()}"
        assert scrape.value(UP, collector="libtpu") == 1 and scrape.value(UP, collector=plugin.NAME) == 1
    for name in families:
        assert {s.labels["device"] for s in scrape.find(name)} == {"0", "1", "2", "3"}, name
    assert {s.labels["source"] for s in scrape.find(DUTY)} == {"libtpu"}
    assert {s.labels["source"] for s in scrape.find(TENSORCORE)} == {plugin.SOURCE}
    assert scrape.value(DUTY, device="2") == pytest.approx(0.62), "the runtime's 412 is the host's chip 2"
    assert scrape.value(TENSORCORE, device="2") == pytest.approx(0.03), "the plugin's index 2"
    info = {(s.labels["device"], s.labels["device_id"]) for s in scrape.find(catalog.TPU_CHIP_INFO.name)}
    assert info == {("0", "404"), ("1", "405"), ("2", "412"), ("3", "413")}
    assert scrape.value(catalog.TPU_CHIP_INFO.name, device="0", device_id="404", source="libtpu") == 1
