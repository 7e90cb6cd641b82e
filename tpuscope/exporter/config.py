"""The sidecar's settings: command-line flags over environment over YAML file over defaults.

Each option is declared once in :data:`OPTIONS`; the flag (``--socket-mode``),
the environment variable (``TPUSCOPE_SOCKET_MODE``) and the YAML key
(``socket_mode``) all derive from its name.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tpuscope import catalog, durations, events, placement
from tpuscope.conventions import DEFAULT_PORT
from tpuscope.exporter.collectors import COLLECTORS, gke_device_plugin
from tpuscope.exporter.collectors.libtpu import addresses_from_environment
from tpuscope.otel import metric_interval_seconds, otlp_protocol
from tpuscope.thresholds import Thresholds

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the setting and where it came from."""


@dataclass(frozen=True)
class Option:
    name: str
    default: Callable[[], str]
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "TPUSCOPE_" + self.name.upper()


OPTIONS = (
    Option(
        "listen",
        lambda: f"localhost:{DEFAULT_PORT}",
        "HOST:PORT to serve /metrics on. The default answers only on this host; in a pod, use "
        f"':{DEFAULT_PORT}' so Prometheus can reach it. Port 0 picks a free port (printed at start).",
    ),
    Option(
        "socket",
        lambda: str(events.default_socket_path()),
        "Unix socket the instrumented job sends events to (the job reads $TPUSCOPE_SOCKET).",
    ),
    Option(
        "socket_mode",
        lambda: "0600",
        "Permissions of the socket, in octal. 0600: only this user's jobs may send; 0660 admits its group.",
    ),
    Option("log_level", lambda: "info", "debug, info, warning or error."),
    Option(
        "collectors",
        lambda: "auto",
        f"Which collectors sample the devices and the host: a comma-separated list of {', '.join(COLLECTORS)}; "
        "'none'; or 'auto', which runs those with something to read here (libtpu when TPU chips or "
        "TPU_RUNTIME_METRICS_PORTS are present, gke-device-plugin when GKE's TPU device plugin answers at "
        "--device-plugin-address, nvml when an NVIDIA driver is, host always).",
    ),
    Option(
        "collector_interval",
        lambda: "5",
        "Seconds between collections: one number for all, and/or NAME=SECONDS per collector (e.g. '5,host=15').",
    ),
    Option(
        "collector_deadline",
        lambda: "2",
        "Seconds a collection may take; past it the collector is marked down (reason 'deadline') and retried "
        "with backoff. /metrics never waits for a collector.",
    ),
    Option(
        "libtpu_address",
        lambda: "",
        "Comma-separated HOST:PORT list of TPU runtime metrics services. Default: localhost and each port in "
        "TPU_RUNTIME_METRICS_PORTS, else localhost:8431.",
    ),
    Option(
        "device_plugin_address",
        lambda: gke_device_plugin.DEFAULT_ADDRESS,
        f"HOST or HOST:PORT (port {gke_device_plugin.DEFAULT_PORT} by default) of GKE's TPU device plugin's "
        "metrics (Prometheus text at /metrics), for the gke-device-plugin collector. It listens on the node's "
        "network: from a pod without hostNetwork, give the node's IP (the downward API's status.hostIP).",
    ),
    Option(
        "tpu_topology",
        lambda: "",
        "The TPU slice's topology (e.g. 4x4, 8x8x16): the label tpu_topology on every series, constant per host. "
        "Default: $TPU_TOPOLOGY (GKE sets it in containers that request TPUs), else what GKE's TPU device plugin "
        "says at start, else none.",
    ),
    Option(
        "core_state_after",
        lambda: durations.prometheus_seconds(Thresholds.stall_seconds),
        "Ask the TPU runtime where each core is (its program and HLO location: tpuscope_tpu_core_state_info) once a "
        "connected workload has made no progress (a step, a checkpoint or a compile stage ending) for this long. "
        "Default: the stall alert's threshold (stall_seconds), so the state is there when TpuscopeWorkloadStalled "
        "fires; set it to match if your alerts' config changes stall_seconds.",
    ),
    Option(
        "hang_after",
        lambda: durations.prometheus_seconds(Thresholds.hang_seconds),
        "The least time a job's process must stay at one place in a step (a phase, or between two) before the "
        "sidecar judges it stuck, asks it for its Python stacks and logs them; the limit is longer for a workload "
        "whose steps are slow (hang_step_factor times its longest recent step). Compiles, checkpoints and the time "
        "between steps are judged against core_state_after. Default: the alerts' hang_seconds.",
    ),
    Option(
        "hang_exit_after",
        lambda: "1m",
        "How long after a stuck process's stacks are logged the sidecar tells it to end, where the job asked for it "
        "(the Monitor's exit_on_hang): time for a few scrapes, so that the verdict leaves the host first.",
    ),
    Option(
        "otlp_metrics",
        lambda: "off",
        "on: also push these metrics over OTLP, for fleets whose OpenTelemetry collector gathers metrics "
        "instead of Prometheus scraping. Where to and how often: the standard OTEL_EXPORTER_OTLP_* and "
        "OTEL_METRIC_EXPORT_INTERVAL variables.",
    ),
    Option(
        "web_config_file",
        lambda: "",
        "Web configuration file in the Prometheus exporter-toolkit format: TLS (tls_server_config) and basic "
        "auth (basic_auth_users, bcrypt hashes) for every HTTP endpoint, as node_exporter's --web.config.file.",
    ),
    Option(
        "max_label_values",
        lambda: "100",
        "Distinct values the sidecar keeps for each label a job sets (workload, device, accelerator, program, "
        "reason). Events with a further value are kept under the value _overflow and counted, so a job that "
        "invents label values cannot grow /metrics without bound.",
    ),
    Option(
        "workload_expiry",
        lambda: "1h",
        "Remove a workload's series once none of its processes is connected and none has sent an event for "
        "this long (seconds, or a duration such as 90s, 15m, 1h); 0 keeps them until the sidecar stops. "
        "Longer than the alerts' windows over rare events (failures, restarts), so a crash is still seen.",
    ),
    Option(
        "shutdown_linger",
        lambda: "25s",
        "After SIGTERM, keep serving until a scrape has read the final state (no job process connected, no "
        "verdict pending on one that ended without a word, and a scrape begun after the last one left), for at "
        "most this long (a duration; 0: stop at once). A job's "
        "last booking (its productive time at a clean stop) is otherwise rarely scraped: scrapes are 15 s apart. "
        "Keep it under the pod's terminationGracePeriodSeconds (30 s by default). It never waits for a sidecar "
        "nothing has scraped, and a second SIGTERM stops it at once.",
    ),
    Option(
        "slice",
        lambda: "",
        "Which slice of a multi-slice job this host is in: the label slice on every series. Default: "
        "$MEGASCALE_SLICE_ID, else 0.",
    ),
    Option(
        "worker",
        lambda: "",
        "This host's index among its slice's hosts: the label worker on every series, which names a straggler. "
        "Default: $TPU_WORKER_ID, else $JOB_COMPLETION_INDEX (an Indexed Job's pod), else $JAX_PROCESS_ID, "
        "else 0.",
    ),
    Option(
        "profile_parser_nice",
        lambda: "19",
        "The nice value (0 to 19) of the child process that parses a job's device-profile capture. 19, the lowest "
        "priority, yields the CPU to everything else in the sidecar's cgroup: the training job first, where they "
        "share one (a VM without containers). Beside processes that keep the CPU busy, a parse at 19 may not finish "
        "within its 120 s, and the job gets no profile; a lower value lets it finish at their cost. In a pod the "
        "sidecar has a cgroup of its own, and its CPU request, not its nice, weighs it against the job.",
    ),
    Option("pid", lambda: "", "Comma-separated pids of the job's processes, for the host collector."),
    Option(
        "pid_file",
        lambda: "",
        "File holding the job's pid, read at every collection (a restarted job is followed). Jobs connected "
        "to the event socket are watched without either.",
    ),
)


@dataclass(frozen=True)
class ServeConfig:
    listen_host: str
    listen_port: int
    socket: Path
    socket_mode: int
    log_level: int
    collectors: tuple[str, ...] | None = None  # None: auto
    collector_intervals: dict[str, float] = field(default_factory=dict)
    collector_deadline: float = 2.0
    libtpu_addresses: tuple[str, ...] = ()
    core_state_after: float = Thresholds.stall_seconds  # seconds without progress before the cores' state is asked
    hang_after: float = Thresholds.hang_seconds  # the least time at one place in a step before a process is stuck
    hang_exit_after: float = 60.0  # after a stuck process's stacks are logged, until it is told to end (if it asked)
    device_plugin_address: str = gke_device_plugin.DEFAULT_ADDRESS
    tpu_topology: str = ""  # empty: unknown, and no label
    pids: tuple[int, ...] = ()
    pid_file: Path | None = None
    otlp_metrics_interval: float | None = None  # seconds between OTLP pushes; None: no pushing
    web_config_file: Path | None = None  # exporter-toolkit web config: TLS and basic auth
    max_label_values: int = 100  # per job-set label; past it, values fold into _overflow
    workload_expiry: float = 3600.0  # seconds; 0: never
    shutdown_linger: float = 25.0  # seconds to wait, after SIGTERM, for a scrape of the final state
    profile_parser_nice: int = 19  # the device-profile parser's nice value: the lowest priority
    slice: str = "0"
    worker: str = "0"

    @property
    def host_labels(self) -> dict[str, str]:
        """The labels every series carries: where in a multi-host job this sidecar runs (and, on TPUs, in what
        shape of slice: constant per host, so it adds no series)."""
        labels = {str(catalog.Label.SLICE): self.slice, str(catalog.Label.WORKER): self.worker}
        if self.tpu_topology:
            labels[str(catalog.Label.TPU_TOPOLOGY)] = self.tpu_topology
        return labels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every option as a flag; defaults stay None so the other sources can apply."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML file with any of the options below as keys (e.g. 'listen: :9478'); "
        "flags and TPUSCOPE_* environment variables override it. Also $TPUSCOPE_CONFIG.",
    )
    for opt in OPTIONS:
        parser.add_argument(
            opt.flag,
            dest=opt.name,
            metavar=opt.name.upper(),
            help=f"{opt.help} [env {opt.env}; default {opt.default()}]",
        )


def resolve(flags: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> ServeConfig:
    """Merge the sources, most specific first, and validate the result."""
    config_file = getattr(flags, "config", None) or environ.get("TPUSCOPE_CONFIG")
    from_file = _read_file(Path(config_file)) if config_file else {}
    raw: dict[str, tuple[str, str]] = {}  # name -> (value, where it came from)
    for opt in OPTIONS:
        if (value := getattr(flags, opt.name, None)) is not None:
            raw[opt.name] = (str(value), opt.flag)
        elif opt.env in environ:
            raw[opt.name] = (environ[opt.env], opt.env)
        elif opt.name in from_file:
            raw[opt.name] = (str(from_file[opt.name]), f"{config_file}: {opt.name}")
        else:
            raw[opt.name] = (opt.default(), "default")
    collectors = _parse(raw["collectors"], _parse_collectors)
    device_plugin_address = _parse(raw["device_plugin_address"], _parse_address)
    return ServeConfig(
        *_parse(raw["listen"], parse_listen),
        socket=Path(raw["socket"][0]),
        socket_mode=_parse(raw["socket_mode"], _parse_mode),
        log_level=_parse(raw["log_level"], _parse_log_level),
        collectors=collectors,
        collector_intervals=_parse(raw["collector_interval"], _parse_intervals),
        collector_deadline=_parse(raw["collector_deadline"], _parse_seconds),
        libtpu_addresses=_parse(raw["libtpu_address"], _parse_list) or addresses_from_environment(environ),
        core_state_after=_parse(raw["core_state_after"], _parse_positive_seconds),
        hang_after=_parse(raw["hang_after"], _parse_positive_seconds),
        hang_exit_after=_parse(raw["hang_exit_after"], _parse_positive_seconds),
        device_plugin_address=device_plugin_address,
        tpu_topology=_parse(raw["tpu_topology"], _parse_topology)
        or _topology_found(environ, device_plugin_address if _reads_device_plugin(collectors) else None),
        pids=_parse(raw["pid"], _parse_pids),
        pid_file=Path(raw["pid_file"][0]) if raw["pid_file"][0] else None,
        otlp_metrics_interval=_otlp_interval(_parse(raw["otlp_metrics"], _parse_switch), environ),
        web_config_file=Path(raw["web_config_file"][0]) if raw["web_config_file"][0] else None,
        max_label_values=_parse(raw["max_label_values"], _parse_positive_int),
        workload_expiry=_parse(raw["workload_expiry"], parse_expiry),
        shutdown_linger=_parse(raw["shutdown_linger"], parse_expiry),
        profile_parser_nice=_parse(raw["profile_parser_nice"], _parse_nice),
        slice=_parse(raw["slice"], _parse_host_label) or _from_environment(environ, placement.SLICE_VARIABLES),
        worker=_parse(raw["worker"], _parse_host_label) or _from_environment(environ, placement.WORKER_VARIABLES),
    )


def _from_environment(environ: Mapping[str, str], names: tuple[str, ...]) -> str:
    """The first of the TPU environment's ``names`` that is set, checked as a flag would be; else 0."""
    if found := placement.first_set(environ, names):
        variable, value = found
        return _parse((value, variable), _parse_host_label)
    return "0"


def _parse_host_label(value: str) -> str:
    """A slice or worker: a short printable name (an index, usually), the same on every series."""
    value = value.strip()
    if len(value) > 63 or not value.isprintable():
        raise ValueError(f"expected a short name such as 0 or 3, got {value!r}")
    return value


def _parse_topology(value: str) -> str:
    """A TPU topology: two or three chip counts joined by x (``4x4``, ``8x8x16``), or empty for none."""
    value = value.strip()
    dims = value.split("x")
    if value and not (2 <= len(dims) <= 3 and all(d.isdigit() and len(d) <= 4 for d in dims)):
        raise ValueError(f"expected a TPU topology such as 2x4 or 4x4x8, got {value!r}")
    return value


def _reads_device_plugin(collectors: tuple[str, ...] | None) -> bool:
    return collectors is None or gke_device_plugin.NAME in collectors


def _topology_found(environ: Mapping[str, str], device_plugin: str | None) -> str:
    """The topology from GKE's TPU environment, else from the device plugin (when its collector may run): both
    come from the node pool's configuration; the variable first, as it costs no request."""
    if value := environ.get("TPU_TOPOLOGY", "").strip():
        return _parse((value, "TPU_TOPOLOGY"), _parse_topology)
    found = gke_device_plugin.topology_from(device_plugin) if device_plugin else None
    try:
        return _parse_topology(found or "")
    except ValueError:  # the plugin's label is a nicety: a value we cannot use is left out, not fatal
        return ""


def _parse_address(value: str) -> str:
    """The device plugin's ``HOST:PORT``, or a bare ``HOST`` at its default port: the downward API's
    ``status.hostIP``, an IPv6 address without brackets on an IPv6 node."""
    value = value.strip()
    if value.count(":") > 1 and "[" not in value:
        value = f"[{value}]"
    if not re.search(r":\d+$", value):
        value = f"{value}:{gke_device_plugin.DEFAULT_PORT}"
    host, port = parse_listen(value)
    if not value.rpartition(":")[0]:
        raise ValueError(f"expected HOST or HOST:PORT, got {value!r}")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (every interface) or ``[v6]:port``."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _parse_list(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _parse_collectors(value: str) -> tuple[str, ...] | None:
    names = _parse_list(value)
    if names == ("auto",):
        return None
    if names == ("none",):
        return ()
    if unknown := [n for n in names if n not in COLLECTORS]:
        raise ValueError(f"unknown collector(s) {', '.join(unknown)}; known: {', '.join(COLLECTORS)}, auto, none")
    return names


def _parse_seconds(value: str) -> float:
    """A collector's interval or deadline: ``5``, ``0.5``, ``30s``, ``2m``; more than 0, less than a day."""
    seconds = durations.parse(value)
    if not 0 < seconds < 86400:
        raise ValueError(f"expected a number of seconds between 0 and a day, got {value!r}")
    return seconds


def _parse_positive_seconds(value: str) -> float:
    """A duration above 0: ``10``, ``90s``, ``10m``."""
    seconds = durations.parse(value)
    if seconds <= 0:
        raise ValueError(f"expected a duration above 0, got {value!r}")
    return seconds


def parse_expiry(value: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``1h`` or ``1d``; ``0`` is allowed (off)."""
    seconds = durations.parse(value)
    if not 0 <= seconds <= 365 * 86400:
        raise ValueError(f"expected a duration between 0 and a year, got {value!r}")
    return seconds


def _parse_positive_int(value: str) -> int:
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"expected a whole number of at least 1, got {value!r}")
    return int(value)


def _parse_nice(value: str) -> int:
    """A nice value the sidecar may set without privileges on a child of its own: its own (0, as it runs) to 19."""
    if not value.strip().isdigit() or int(value) > 19:
        raise ValueError(f"expected a nice value from 0 to 19, got {value!r}")
    return int(value)


def _parse_intervals(value: str) -> dict[str, float]:
    """'5,host=15' -> {libtpu: 5, nvml: 5, host: 15}."""
    intervals = {name: collector.default_interval for name, collector in COLLECTORS.items()}
    for item in _parse_list(value):
        name, sep, seconds = item.rpartition("=")
        if sep and name not in COLLECTORS:
            raise ValueError(f"unknown collector {name!r} in {value!r}")
        for target in [name] if sep else list(COLLECTORS):
            intervals[target] = _parse_seconds(seconds)
    return intervals


def _otlp_interval(on: bool, environ: Mapping[str, str]) -> float | None:
    if not on:
        return None
    try:
        otlp_protocol("METRICS", environ)
        return metric_interval_seconds(environ)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _parse_switch(value: str) -> bool:
    if value.lower() in ("on", "true", "1"):
        return True
    if value.lower() in ("off", "false", "0"):
        return False
    raise ValueError(f"expected on or off, got {value!r}")


def _parse_pids(value: str) -> tuple[int, ...]:
    pids = tuple(int(p) for p in _parse_list(value))
    if any(p <= 0 for p in pids):
        raise ValueError(f"expected process ids, got {value!r}")
    return pids


def _parse_mode(value: str) -> int:
    mode = int(value, 8)
    if mode & ~0o777:
        raise ValueError(f"{value!r} is not a permission mode")
    if mode & 0o002:
        raise ValueError(f"{value!r} would let any user on the host send events")
    return mode


def _parse_log_level(value: str) -> int:
    level = logging.getLevelName(value.upper())
    if not isinstance(level, int):
        raise ValueError(f"unknown log level {value!r}")
    return level


def _parse(item: tuple[str, str], parser: Callable[[str], T]) -> T:
    value, origin = item
    try:
        return parser(value)
    except ValueError as e:
        raise ConfigError(f"{origin}: {e}") from None


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of option names to values")
    unknown = set(data) - {opt.name for opt in OPTIONS}
    if unknown:
        known = ", ".join(opt.name for opt in OPTIONS)
        raise ConfigError(f"{path}: unknown option(s) {', '.join(sorted(unknown))}; known: {known}")
    return data
