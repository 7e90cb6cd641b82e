"""Settings: flags over environment over file over defaults, and clear errors."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from tpuscope.conventions import DEFAULT_PORT
from tpuscope.exporter import config


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults() -> None:
    resolved = config.resolve(parse(), environ={})
    assert (resolved.listen_host, resolved.listen_port) == ("localhost", DEFAULT_PORT)
    assert resolved.socket_mode == 0o600


def test_flag_beats_environment_beats_file(tmp_path: Path) -> None:
    file = tmp_path / "tpuscope.yaml"
    file.write_text("listen: ':1111'\nsocket: /from/file.sock\nsocket_mode: '0640'\n")
    env = {"TPUSCOPE_SOCKET": "/from/env.sock", "TPUSCOPE_LISTEN": "127.0.0.1:2222"}
    resolved = config.resolve(parse("--config", str(file), "--listen", "[::1]:3333"), environ=env)
    assert (resolved.listen_host, resolved.listen_port) == ("::1", 3333)
    assert resolved.socket == Path("/from/env.sock")
    assert resolved.socket_mode == 0o640
    from_file_only = config.resolve(parse(), environ={"TPUSCOPE_CONFIG": str(file)})
    assert (from_file_only.listen_host, from_file_only.listen_port) == ("0.0.0.0", 1111)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--listen", "nowhere"], {}, "--listen: expected HOST:PORT"),
        ([], {"TPUSCOPE_LISTEN": "x:99999"}, "TPUSCOPE_LISTEN: expected HOST:PORT"),
        (["--socket-mode", "0666"], {}, "any user on the host"),
        (["--socket-mode", "rw"], {}, "--socket-mode"),
        (["--log-level", "loud"], {}, "unknown log level"),
        (["--collector-interval", "host=2d"], {}, "--collector-interval: expected a number of seconds between"),
        ([], {"TPUSCOPE_WORKLOAD_EXPIRY": "soon"}, "TPUSCOPE_WORKLOAD_EXPIRY: expected seconds or a duration"),
        (["--workload-expiry", "2y"], {}, "--workload-expiry: expected a duration between 0 and a year"),
    ],
)
def test_bad_values_name_their_source(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.resolve(parse(*argv), environ=env)


def test_durations_read_as_everywhere_else() -> None:
    resolved = config.resolve(parse("--collector-interval", "30s,host=1m", "--workload-expiry", "1h30m"), environ={})
    assert resolved.collector_intervals["host"] == 60 and resolved.collector_intervals["libtpu"] == 30
    assert resolved.workload_expiry == 5400


@pytest.mark.parametrize(
    ("argv", "env", "where"),
    [
        ([], {}, ("0", "0")),
        ([], {"MEGASCALE_SLICE_ID": "2", "TPU_WORKER_ID": "5", "JOB_COMPLETION_INDEX": "9"}, ("2", "5")),
        ([], {"JOB_COMPLETION_INDEX": "9", "TPU_WORKER_ID": " "}, ("0", "9")),
        (["--slice", "a", "--worker", "w1"], {"MEGASCALE_SLICE_ID": "2", "TPU_WORKER_ID": "5"}, ("a", "w1")),
        ([], {"TPUSCOPE_WORKER": "4", "TPU_WORKER_ID": "5"}, ("0", "4")),
    ],
)
def test_slice_and_worker_come_from_flags_or_the_tpu_environment(
    argv: list[str], env: dict[str, str], where: tuple[str, str]
) -> None:
    resolved = config.resolve(parse(*argv), environ=env)
    assert (resolved.slice, resolved.worker) == where
    assert resolved.host_labels == {"slice": where[0], "worker": where[1]}


def test_a_bad_worker_names_the_variable_it_came_from() -> None:
    with pytest.raises(config.ConfigError, match="TPU_WORKER_ID: expected a short name"):
        config.resolve(parse(), environ={"TPU_WORKER_ID": "x" * 100})


def test_unknown_file_keys_are_errors(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("listen: ':1'\nlisten_port: 2\n")
    with pytest.raises(config.ConfigError, match=r"unknown option.*listen_port"):
        config.resolve(parse("--config", str(file)), environ={})


def test_the_parser_is_niced_to_19_unless_told_a_value_from_0_to_19() -> None:
    assert config.resolve(parse(), environ={}).profile_parser_nice == 19
    assert config.resolve(parse(), environ={"TPUSCOPE_PROFILE_PARSER_NICE": "0"}).profile_parser_nice == 0
    for bad in ("20", "-1", "low"):
        with pytest.raises(config.ConfigError, match=r"--profile-parser-nice: expected a nice value from 0 to 19"):
            config.resolve(parse(f"--profile-parser-nice={bad}"), environ={})


def test_serve_help_explains_every_option() -> None:
    out = subprocess.run([sys.executable, "-m", "tpuscope", "serve", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    help_text = " ".join(out.stdout.split())  # argparse wraps lines
    for option in config.OPTIONS:
        assert option.flag in help_text and option.env in help_text
    assert "--config" in help_text


def test_cli_reports_config_errors_without_a_traceback() -> None:
    out = subprocess.run([sys.executable, "-m", "tpuscope", "serve", "--listen", "bad"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "error: --listen: expected HOST:PORT" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_sidecar_guide_documents_every_option() -> None:
    guide = (Path(__file__).resolve().parents[1] / "docs" / "sidecar.md").read_text()
    for option in config.OPTIONS:
        assert f"| `{option.flag}` | `{option.env}` |" in guide, option.flag
