"""The dashboards: well-formed for Grafana, named from the catalogue, and every query proven on real data."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PROFILE_PROMPTLY, require
from dashboard_helpers import BOARDS, panel_titled, step_values, substitute

from tpuscope import alerts, catalog, conventions
from tpuscope.alerts import rule_groups
from tpuscope.dashboards import queries
from tpuscope.dashboards.panels import panels_of
from tpuscope.generator_config import GeneratorConfig
from tpuscope.testing import bench as testing_bench
from tpuscope.testing import grafana
from tpuscope.testing.fake_nvml import FakeGpu, FakeNvmlState, environment
from tpuscope.testing.fake_tpu import Chip, FakeTpuRuntime, FakeTpuServer, default_megascale
from tpuscope.testing.prometheus import PrometheusServer, target_of
from tpuscope.testing.waiting import wait_for
from tpuscope.tracing import Monitor
from tpuscope.workload.sidecar import SidecarProcess

ROOT = Path(__file__).resolve().parents[1]
VARIABLES = {"datasource", queries.WORKLOAD, queries.SLICE, queries.WORKER, queries.ACCELERATOR}
# Panel types Grafana has replaced (graph -> timeseries, singlestat -> stat, table-old -> table, ...).
DEPRECATED = {"graph", "singlestat", "table-old", "grafana-piechart-panel", "grafana-worldmap-panel", "graph-old"}
CORE = {"timeseries", "stat", "bargauge", "heatmap", "table", "state-timeline", "gauge", "text"}
# The histogram series and the catalogue's names; anything else named tpuscope_* is a typo.
KNOWN = {m.name for m in catalog.CATALOG} | {
    m.series(s) for m in catalog.CATALOG if m.kind is catalog.Kind.HISTOGRAM for s in ("bucket", "sum", "count")
}

# Every group's records: the straggler's and a hang's sit in the alerts group, ahead of the alerts that read them.
RECORDED = {rule["record"] for group in rule_groups(GeneratorConfig()) for rule in group["rules"] if "record" in rule}
RECORDED_NAME = r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+"


def targets(board: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in panels_of(board):
        for target in panel.get("targets", []):
            yield panel["title"], target


def variable_queries(board: dict[str, Any]) -> list[str]:
    return [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]


def tpuscope_dashboards(*args: str) -> subprocess.CompletedProcess[str]:
    """The real command, as a team runs it."""
    return subprocess.run([sys.executable, "-m", "tpuscope", "dashboards", *args], capture_output=True, text=True)


def test_every_metric_a_query_names_is_in_the_catalogue() -> None:
    texts = [
        text
        for board in BOARDS.values()
        for text in [*(t["expr"] for _, t in targets(board)), *variable_queries(board)]
    ]
    # A recording rule's name (level:metric:operations) holds a metric's name: it must be one of our rules.
    recorded = {name for text in texts for name in re.findall(RECORDED_NAME, text)}
    assert recorded <= RECORDED, sorted(recorded - RECORDED)
    named = {name for text in texts for name in re.findall(r"\btpuscope_[a-z0-9_]+", re.sub(RECORDED_NAME, "", text))}
    assert named, "no query names a tpuscope metric"
    assert named <= KNOWN, sorted(named - KNOWN)
    # And the dashboards use the catalogue broadly, not a corner of it.
    assert len({n for n in named if n in {m.name for m in catalog.CATALOG}}) >= 25


@pytest.mark.parametrize("name", BOARDS)
def test_panels_are_current_types_with_descriptions_units_and_thresholds(name: str) -> None:
    board = BOARDS[name]
    assert {v["name"] for v in board["templating"]["list"]} >= VARIABLES
    assert board["uid"] == name and board["title"].startswith("tpuscope / ")
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels_of(board):
        title = panel["title"]
        assert panel["type"] in CORE and panel["type"] not in DEPRECATED, title
        assert len(panel.get("description", "")) > 40, f"{title}: say what it means and what to do"
        defaults = panel["fieldConfig"]["defaults"]
        unit = panel["options"]["yAxis"]["unit"] if panel["type"] == "heatmap" else defaults.get("unit")
        assert unit, f"{title}: no unit"
        assert "color" in json.dumps(defaults["thresholds"]), f"{title}: no thresholds"
        assert panel["datasource"]["uid"] == "${datasource}", title
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), title
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, title


def test_step_panels_show_exemplars() -> None:
    job = BOARDS["tpuscope-job"]
    step_series = catalog.STEP_DURATION.series("bucket")
    with_exemplars = [title for title, t in targets(job) if step_series in t["expr"] and t.get("exemplar")]
    assert {"Step time p50 / p95 / p99", "Step time distribution"} <= set(with_exemplars)


def test_training_health_sits_below_the_workloads_health_and_leaves_the_other_panels_ids() -> None:
    """Where the divergence alerts' runbooks send the on-call: the Training health row, under Steps and Hangs. Added
    above the rows that were there, it is numbered after them, so that their panels keep their ids (a link to one
    still opens it)."""
    panels = BOARDS["tpuscope-job"]["panels"]
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert rows[:3] == ["Steps", "Hangs", catalog.TRAINING_GROUP]
    start = next(i for i, p in enumerate(panels) if p["title"] == catalog.TRAINING_GROUP)
    end = next(i for i, p in enumerate(panels) if i > start and p["type"] == "row")
    health = {p["id"] for p in panels[start:end]}
    others = [p["id"] for p in panels if p["id"] not in health]
    assert others == list(range(1, len(others) + 1)), "the other panels are numbered in order"
    assert sorted(health) == list(range(len(others) + 1, len(panels) + 1))
    # Every metric of the group is on the row, but the count of values the job dropped unread (the job's own
    # health, not the run's).
    exprs = " ".join(t["expr"] for p in panels[start:end] for t in p.get("targets", []))
    shown = {m for m in catalog.CATALOG if m.group == catalog.TRAINING_GROUP and m.name in exprs}
    assert {m for m in catalog.CATALOG if m.group == catalog.TRAINING_GROUP} - shown == {catalog.TRAINING_VALUES_UNREAD}


# The device-profile panels, beside the host-timed phases on the boards that show both.
PROFILE_PANELS = {
    "tpuscope-job": {
        "Device profile: where the step's device time went",
        "Device profile: exposed collective share",
        "Device profile: compute and exposed collective per step, by worker",
        "Device profile: compute over the workload's median, by worker",
        "Device profile: collective overlap",
        "Device profile: device imbalance, by worker",
        "Device profile: step-to-step spread, by part",
        "Device profile: measured steps averaged",
        "Device ops told by name only",
        "Device profile captures, by result",
        "Device profile capture cost",
        "Age of the latest device profile",
        "Device trace size per capture",
    },
    "tpuscope-oncall": {
        "Device profile: slowest worker of each workload, against the median",
        "Device profile: each worker's compute and collective wait per step",
        "Device profile: exposed collective time against its baseline, by workload",
    },
}
PROFILE_METRICS = {m.name for m in catalog.CATALOG if m.group == catalog.PROFILE_GROUP}


def test_the_device_profile_is_shown_beside_the_host_timed_phases_and_says_which_is_which() -> None:
    """Two answers to "where did the step go" sit on one board: each panel says whether it is the host's timing
    of every step or a sampled device trace (and where its age is); the job board reads every profile metric."""
    for name, titles in PROFILE_PANELS.items():
        board = BOARDS[name]
        for panel in panels_of(board):
            exprs = " ".join(t["expr"] for t in panel["targets"])
            reads_profile = any(metric in exprs for metric in PROFILE_METRICS)
            assert reads_profile == (panel["title"] in titles), panel["title"]
            if reads_profile:
                assert "device" in panel["title"].lower(), panel["title"]
                assert "sampled" in panel["description"].lower(), f"{panel['title']}: say the profile is a sample"
            elif catalog.STEP_PHASE_DURATION.name in exprs and 'phase="io"' not in exprs:
                assert "host-timed" in panel["title"].lower(), f"{panel['title']}: say it is the host's timing"
    job = " ".join(t["expr"] for _, t in targets(BOARDS["tpuscope-job"]))
    assert {m for m in PROFILE_METRICS if m not in job} == set()
    # The on-call straggler bars read what TpuscopeStraggler reads: fresh profiles of running workers only.
    oncall = PROFILE_PANELS["tpuscope-oncall"]
    slowest, each = (next(title for title in oncall if words in title) for words in ("slowest", "collective wait"))
    (target,) = panel_titled(BOARDS["tpuscope-oncall"], slowest)["targets"]
    assert conventions.PROFILE_OVER_MEDIAN in target["expr"]
    assert all(conventions.PROFILE_FRESH in t["expr"] for t in panel_titled(BOARDS["tpuscope-oncall"], each)["targets"])


def test_the_committed_files_and_configmaps_are_what_the_command_writes(short_tmp: Path) -> None:
    out = tpuscope_dashboards("--out", str(short_tmp))
    assert out.returncode == 0, out.stderr
    for name in BOARDS:
        written = (short_tmp / f"{name}.json").read_text()
        assert written == (ROOT / "deploy/grafana" / f"{name}.json").read_text(), name
    maps = list(yaml.safe_load_all((ROOT / "deploy/kubernetes/grafana-dashboards.yaml").read_text()))
    assert len(maps) == len(BOARDS)
    for config_map in maps:
        assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((file_name, content),) = config_map["data"].items()
        assert json.loads(content) == json.loads((short_tmp / file_name).read_text())
        assert len(content) < 1_000_000, "a ConfigMap holds at most 1 MiB"


# The panels coloured and described by straggler_factor (default 1.2) and goodput_objective (default 0.90).
STRAGGLER_PANELS = [
    ("tpuscope-job", "Host-timed compute over the workload's median, by worker"),
    ("tpuscope-job", "Device profile: compute over the workload's median, by worker"),
    ("tpuscope-oncall", "Host-timed: slowest worker of each workload, against the median"),
    ("tpuscope-oncall", "Device profile: slowest worker of each workload, against the median"),
]
GOODPUT_PANELS = [
    ("tpuscope-fleet", "Goodput"),
    ("tpuscope-fleet", "Goodput, by workload"),
    ("tpuscope-fleet", "Goodput objective: compliance over the range"),
]


def test_the_dashboards_are_coloured_at_the_thresholds_of_config(short_tmp: Path) -> None:
    """The file tpuscope alerts reads: a team that tunes a threshold sees its panels turn red where its alert fires."""
    config = short_tmp / "tpuscope.yaml"
    config.write_text("thresholds:\n  straggler_factor: 1.7\n  goodput_objective: 0.95\n")
    out = tpuscope_dashboards("--config", str(config), "--out", str(short_tmp / "boards"))
    assert out.returncode == 0, out.stderr
    tuned = {name: json.loads((short_tmp / "boards" / f"{name}.json").read_text()) for name in BOARDS}

    for name, title in STRAGGLER_PANELS:
        default, panel = panel_titled(BOARDS[name], title), panel_titled(tuned[name], title)
        assert max(step_values(default)) == 1.2 and "1.2" in default["description"], f"{title}: not the panel"
        assert max(step_values(panel)) == 1.7 and 1.2 not in step_values(panel), f"{title}: red at the default"
        assert "1.7" in panel["description"] and "1.2" not in panel["description"], title
    for name, title in GOODPUT_PANELS:
        default, panel = panel_titled(BOARDS[name], title), panel_titled(tuned[name], title)
        assert step_values(default) == [0.9] and "90%" in default["description"], f"{title}: not the panel"
        assert step_values(panel) == [0.95], f"{title}: coloured at the default objective"
        assert "95%" in panel["description"] and "90%" not in panel["description"], title
    # The objective's budget (5% of wall time) is in a query too, and in the job dashboard's text.
    budget = panel_titled(tuned["tpuscope-fleet"], "Goodput objective: error budget left")
    assert budget["targets"][0]["expr"].endswith(") / 0.05") and "(5% of wall time)" in budget["description"]
    wall_time = panel_titled(tuned["tpuscope-job"], "Wall time by category")["description"]
    assert "The objective is 95% productive" in wall_time
    # And nothing the file leaves alone moves.
    assert tuned["tpuscope-serving"] == BOARDS["tpuscope-serving"]


@pytest.mark.parametrize(
    ("thresholds", "said"),
    [
        ("straggler_factr: 1.7", "unknown thresholds: straggler_factr"),
        # The latency SLI counts one bucket of the request histogram: a bound between two matches nothing.
        ("inference_latency_seconds: 0.3", "inference_latency_seconds must be one of (0.005,"),
    ],
)
def test_a_bad_config_writes_no_dashboards(thresholds: str, said: str, short_tmp: Path) -> None:
    config = short_tmp / "tpuscope.yaml"
    config.write_text(f"thresholds:\n  {thresholds}\n")
    out = tpuscope_dashboards("--config", str(config), "--out", str(short_tmp / "boards"))
    assert out.returncode == 2
    assert out.stderr.startswith("tpuscope dashboards: ") and said in out.stderr
    assert not (short_tmp / "boards").exists()


# --- every query against real data ---------------------------------------------------------
WORKLOAD = "dash"
SERVING = "dash-serving"


def bench(socket: Path, run_dir: Path, cache: Path, *faults: str) -> subprocess.CompletedProcess[str]:
    """The JAX workload with the faults that make every panel's series exist: the first run stalls,
    recompiles, has its gradients go NaN at step 145 (its loss from the next step: non-finite values and their
    onsets) and fails to compile a program (a compile failure, and a failure of reason compile_error); run
    again, it resumes from its last checkpoint, saved every 20 steps, so from before the NaN (a restart, lost work,
    steps rolled back, cache hits; a resumed run poisons nothing)."""
    return testing_bench.run(
        "--inject=stall=3",
        "--inject=recompile=25",
        "--inject=nan=145",
        "--inject=compile-error=150",
        *faults,
        # Device profiles from step 32 (the first multiple of K=16 past the 20 warm steps). A capture costs about
        # 0.3 s, so the job widens its period past the run: that one capture must be parsed, scraped and recorded
        # while the job still runs (a finished job's profile is not fresh, and the straggler's record drops it).
        # From step 32 to 75 a slow machine had too little of that time (CI, stop 45); to 150 it has seconds.
        profile_period="0.3s",
        workload=WORKLOAD,
        steps=200,
        checkpoint_every=20,
        socket=socket,
        run_dir=run_dir,
        compile_cache=cache,
        env=PROFILE_PROMPTLY,
    )


def serve_requests(monitor: Monitor, stop: threading.Event) -> None:
    """A batched-inference loop on a TPU v5e, once it has loaded its model: some batches answer within the objective,
    some do not. It reports its chips' memory as jax's memory_stats() has it on a TPU (the CPU has none)."""
    monitor.model_loaded("v1")  # its age on the serving board
    n = 0
    while not stop.is_set():
        n += 1
        for device in range(2):
            monitor.device_memory(str(device), "v5e", used_bytes=n % 7 << 30, limit_bytes=16 << 30, peak_bytes=9 << 30)
        monitor.inference_batch(8 + n % 8, queue_depth=n % 5, request_seconds=[0.05, 0.2, 0.7 if n % 4 == 0 else 0.1])
        time.sleep(0.05)  # the loop's pace: a batch every 50 ms


def selections(board: dict[str, Any], prom: PrometheusServer) -> Iterator[tuple[str, dict[str, str]]]:
    """The variable values to run the panels with, as Grafana fills them from its variable queries: All
    (a variable's custom all value, or every value found), then one value of each; for the accelerator,
    each value in turn (a GPU-only panel is empty with a TPU selected, and should be)."""
    opened = grafana.variables(board, prom.label_values)
    nothing = [name for name, values in opened.listed.items() if not values]
    assert not nothing, f"{board['title']}: variables {nothing} list nothing"
    first = {**opened.sent, **{name: grafana.regex_escape(values[0]) for name, values in opened.listed.items()}}
    yield "All", opened.sent
    for accelerator in opened.listed[queries.ACCELERATOR]:
        yield f"accelerator {accelerator}", {**first, queries.ACCELERATOR: grafana.regex_escape(accelerator)}


NONFINITE = "Non-finite values over the range, by worker: how many, and the step each went at"
# Instant panels that read only running workers: evaluated after the bench has ended, they are empty, and must be.
ONLY_WHILE_RUNNING = {
    "Device profile: slowest worker of each workload, against the median",
    "Device profile: each worker's compute and collective wait per step",
}
# Targets ("dashboard / panel (ref)") that no run of this test can give data, and why.
NEEDS_HISTORY = {
    "tpuscope / On-call / Device profile: exposed collective time against its baseline, by workload (B)": (
        "its baseline is the 6 hours before the last 30 minutes: no test run is that long"
    ),
    "tpuscope / Job debug / What stragglers cost: chips kept waiting, and the straggler's cause (B)": (
        "the straggler is one worker of several that holds the others back, and this run's workload has one process: "
        "tests/test_multihost.py has a 4-process job name it, test_dashboard_queries the panel's values"
    ),
    "tpuscope / Job debug / Where each worker is stuck (A)": (
        "a process is stuck after a minute at one place at least, and the bench's stall lasts 3 s: no process of "
        "this run is ever stuck"
    ),
}


# Panels of the fleet board (issue 57) that no run of this test can give data, and why; tests/test_dashboard_queries.py
# gives them a cluster's series and checks their values, tests/test_platform_goodput.py the rules behind them.
KUBERNETES = "it reads kube-state-metrics' series of the cluster's objects, and no cluster serves them here"
DAY = "it reads the factors of the last day, which the slow group records every 5 minutes, after this run's data"
LEDGER = (
    "it reads the bad-host ledger, which the slow group records every 5 minutes, after this run's data: "
    "tests/test_bad_hosts.py evaluates its queries on the ledger of known evidence"
)
NEEDS_KUBERNETES = {
    "Scheduling goodput of every JobSet": KUBERNETES,
    "Scheduling goodput, last 1d": KUBERNETES,
    "Runtime goodput, last 1d": DAY,
    "Program goodput, last 1d": DAY,
    "ML productivity goodput, last 1d": KUBERNETES,
    "The three factors and their product, by workload, over the last 1d": KUBERNETES,
    "Scheduling badput over the range, by JobSet and state": KUBERNETES,
    "Kueue's admission wait, by ClusterQueue": "it reads Kueue's own series, and no Kueue runs here",
    "Chips the cluster has": KUBERNETES,
    "Idle chips: cost per hour": KUBERNETES,
    "Chips by node pool: held, reporting, idle": KUBERNETES,
    "Suspect nodes, last 7d": LEDGER,
    "Evidence on the suspect nodes, last 7d": LEDGER,
    "Suspect nodes by block and sub-block": LEDGER,
}


def needs_kubernetes(name: str) -> bool:
    """Whether ``name`` ("tpuscope / Fleet overview / TITLE (A)") is a panel of :data:`NEEDS_KUBERNETES`."""
    return any(f" / {title} (" in name for title in NEEDS_KUBERNETES)


def only_while_running(name: str) -> bool:
    """Whether ``name`` ("tpuscope / On-call / TITLE (A)") is one of :data:`ONLY_WHILE_RUNNING`: the on-call
    board's profile panels read the recording rules the straggler alert reads, which keep fresh profiles of
    connected workers only, so that a finished job's last capture leaves no straggler behind."""
    return any(f" / {title}" in name for title in ONLY_WHILE_RUNNING)


# Alone: the device-profile panels need a capture of the JAX job, taken and parsed while it runs; beside the suite's
# other JAX jobs on 2 cores, none lived (Makefile, `test`).
@pytest.mark.alone
def test_every_panel_query_returns_data_from_the_workload_the_sidecar_and_prometheus(
    short_tmp: Path, fake_nvml_lib: Path
) -> None:
    require("prometheus")
    nvml = FakeNvmlState(short_tmp / "nvml.state", gpus=[FakeGpu(), FakeGpu()])
    nvml.xid(1, 79)
    nvml.write()
    rules = short_tmp / "rules.yml"  # tpuscope's own rules: the failure fires TpuscopeWorkloadFailed
    rules.write_text(alerts.rules_file(GeneratorConfig()))
    with (
        FakeTpuServer(FakeTpuRuntime([Chip(d) for d in range(4)], default_megascale())) as runtime,
        SidecarProcess(
            short_tmp / "s.sock",
            "127.0.0.1:0",
            "--collectors=libtpu,nvml,host",
            f"--libtpu-address={runtime.address}",
            "--collector-interval=0.5",
            "--slice=slice-0",  # the sidecar labels every series with its slice, and worker 0 by default
            "--tpu-topology=2x2",  # and with its TPU slice's topology: the board's variable lists it
            # The device-profile panels need the job's capture parsed while it runs, on a loaded machine too.
            env={**environment(fake_nvml_lib, nvml), "TPU_ACCELERATOR_TYPE": "v5litepod-4", **PROFILE_PROMPTLY},
        ) as sidecar,
        PrometheusServer(short_tmp / "prom", [target_of(sidecar.url)], rule_files=[rules]) as prom,
    ):
        # The range begins once Prometheus has scraped the sidecar: a counter born later (the failure's) is then
        # new in the range; before any scrape, a query cannot tell it from one that was already there.
        wait_for(lambda: bool(prom.query("up")), 30, "scrape of the sidecar")
        prom.catch_up(scrapes=2)  # and the range's first point holds a scrape: the panels' 1 s step reads one
        started = time.time()
        stop = threading.Event()
        with Monitor(SERVING, socket=sidecar.socket, traces=False) as serving:
            loop = threading.Thread(target=serve_requests, args=(serving, stop))
            loop.start()
            try:
                first = bench(sidecar.socket, short_tmp / "run", short_tmp / "cache")
                second = bench(sidecar.socket, short_tmp / "run", short_tmp / "cache", "--inject=ckpt-fail")
            finally:
                stop.set()
                loop.join()
        assert first.returncode == 3, f"the compile-error fault did not end the first run:\n{first.stderr[-3000:]}"
        assert second.returncode == 0, second.stderr[-3000:]
        prom.catch_up(scrapes=2, rules=True)  # two more scrapes and a rule evaluation after the last events
        end = time.time()
        range_seconds = int(end - started) + 1
        failing = []
        shown: dict[str, list[float]] = {}  # "dashboard / panel" -> its first target's values, All selected
        for board in BOARDS.values():
            empty: dict[str, list[str]] = {}  # target -> the selections it had no data with
            runs = 0
            for selection, values in selections(board, prom):
                runs += 1
                for title, target in targets(board):
                    expr = substitute(target["expr"], values, range_seconds)
                    result = prom.query(expr) if target.get("instant") else prom.query_range(expr, started, end, 2)
                    numbers = [float(v[1]) for r in result for v in r.get("values", [r.get("value")]) if v]
                    if not numbers:
                        empty.setdefault(f"{board['title']} / {title} ({target['refId']})", []).append(
                            f"{selection}: {expr}"
                        )
                    if selection == "All" and target["refId"] == "A":
                        shown[f"{board['title']} / {title}"] = numbers
            # Empty with All is a wrong query; empty with every single selection, too.
            failing += [
                f"{name}\n    " + "\n    ".join(why)
                for name, why in empty.items()
                if (why[0].startswith("All") or len(why) == runs - 1)
                and not only_while_running(name)
                and not needs_kubernetes(name)
                and name not in NEEDS_HISTORY
            ]
    # What the runs' own summaries say of their device profiles: an empty profile panel is read with them.
    said = [
        line.strip()
        for run in (first, second)
        for line in (run.stdout + run.stderr).splitlines()
        if "captures" in line or "device trace" in line or "device-profile" in line or "device profile" in line
    ]
    assert not failing, "panels without data:\n" + "\n".join(failing) + "\nthe runs said:\n" + "\n".join(said)
    lingering = [name for name, numbers in shown.items() if only_while_running(name) and numbers]
    assert not lingering, f"a finished job's profile still names a straggler: {lingering}"
    # And the values are right where the faults say what they must be.
    assert shown["tpuscope / Fleet overview / Failures over the range"] == [1], "one failure, counted from the first"
    assert shown["tpuscope / On-call / Failures over the range, by workload and reason"] == [1]
    assert shown["tpuscope / On-call / Compile failures over the range, by stage and reason"] == [1]
    # An instant query at the time it ran (after the others): the model loaded after the test started.
    assert 0 <= shown["tpuscope / Serving / Model age, by workload and version"][0] < time.time() - started
    assert max(shown["tpuscope / Fleet overview / Restarts per hour, by workload and reason"]) == 1
    assert max(shown["tpuscope / On-call / Firing tpuscope alerts"]) >= 1
    assert 0 < shown["tpuscope / Job debug / Compilation cache hit ratio"][0] < 1, "the rerun hits the cache"
    assert 0 < shown["tpuscope / Serving / Requests within the objective"][0] < 1
    assert 0 < shown["tpuscope / Fleet overview / Cost per step, by workload"][0] < 1
    assert shown["tpuscope / Job debug / Time since the last good checkpoint"][0] < range_seconds
    # The NaN at step 145: its values read non-finite; the resume from its last checkpoint threw away the steps after.
    assert min(shown[f"tpuscope / Job debug / {NONFINITE}"]) >= 1
    assert shown["tpuscope / Job debug / Rolled back by restores over the range"][0] >= 1
    # The bench samples device profiles (every 0.3 s of steps here, see bench() above): the split shows.
    assert 0 < shown["tpuscope / Job debug / Device profile: exposed collective share"][0] < 1
    assert max(shown["tpuscope / Job debug / Device profile captures, by result"]) >= 1
