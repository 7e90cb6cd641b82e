"""The sidecar's settings: command-line flags over environment over YAML file over defaults.

Each option is declared once in :data:`OPTIONS`; the flag (``--socket-mode``),
the environment variable (``TPUSCOPE_SOCKET_MODE``) and the YAML key
(``socket_mode``) all derive from its name.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tpuscope import events

DEFAULT_PORT = 9478
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
        "Unix datagram socket the instrumented job sends events to (the job reads $TPUSCOPE_SOCKET).",
    ),
    Option(
        "socket_mode",
        lambda: "0600",
        "Permissions of the socket, in octal. 0600: only this user's jobs may send; 0660 admits its group.",
    ),
    Option("log_level", lambda: "info", "debug, info, warning or error."),
)


@dataclass(frozen=True)
class ServeConfig:
    listen_host: str
    listen_port: int
    socket: Path
    socket_mode: int
    log_level: int


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
    return ServeConfig(
        *_parse(raw["listen"], parse_listen),
        socket=Path(raw["socket"][0]),
        socket_mode=_parse(raw["socket_mode"], _parse_mode),
        log_level=_parse(raw["log_level"], _parse_log_level),
    )


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (every interface) or ``[v6]:port``."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


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
