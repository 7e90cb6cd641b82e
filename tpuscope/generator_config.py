"""What a team sets for the generated rules, routing and dashboards: thresholds, where pages and tickets go, links.

One YAML file, the same for ``tpuscope alerts --config FILE`` and ``tpuscope dashboards --config FILE``,
so a panel is coloured at the threshold its alert fires at; every key is optional::

    thresholds:             # any field of tpuscope.thresholds.Thresholds
      stall_seconds: 600
      goodput_objective: 0.95
    exporter_job: tpuscope  # the Prometheus job(s) scraping sidecars, a regex
    page_webhook_url: https://pager.example/hook
    ticket_webhook_url: https://tickets.example/hook
    runbook_url: https://wiki.example/tpuscope/alerts    # each alert links to <runbook_url>#<alertname>
    grafana_url: https://grafana.example                 # dashboards linked from alerts
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from tpuscope.thresholds import Thresholds


@dataclass(frozen=True)
class GeneratorConfig:
    thresholds: Thresholds = field(default_factory=Thresholds)
    exporter_job: str = "tpuscope.*"
    page_webhook_url: str = "http://alert-receiver.monitoring.svc:8080/page"
    ticket_webhook_url: str = "http://alert-receiver.monitoring.svc:8080/ticket"
    runbook_url: str = "https://tpuscope.example/docs/alerts"
    grafana_url: str = "http://grafana.monitoring.svc"

    @classmethod
    def load(cls, path: Path | None) -> GeneratorConfig:
        if path is None:
            return cls()
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ValueError(f"{path}: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a mapping of settings")
        known = {f.name for f in fields(cls)}
        if unknown := set(raw) - known:
            raise ValueError(
                f"{path}: unknown settings {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})"
            )
        settings: dict[str, Any] = {k: v for k, v in raw.items() if k != "thresholds"}
        for name, value in settings.items():
            if not isinstance(value, str):
                raise ValueError(f"{path}: {name} must be a string")
        config = replace(cls(), **settings)
        if "thresholds" in raw:
            try:
                config = replace(config, thresholds=Thresholds.override(raw["thresholds"] or {}))
            except ValueError as e:
                raise ValueError(f"{path}: {e}") from None
        return config


def add_arguments(parser: argparse.ArgumentParser, out: str) -> None:
    """``--out`` and ``--config``, the same for every generator command; ``out`` says what goes in the directory."""
    parser.add_argument("--out", type=Path, required=True, help=f"directory to write {out} into")
    parser.add_argument(
        "--config",
        type=Path,
        help="YAML: thresholds, webhook URLs, runbook and Grafana URLs (one file for alerts and dashboards)",
    )


def write_files(
    command: str, args: argparse.Namespace, write: Callable[[Path, GeneratorConfig], Iterable[Path]]
) -> int:
    """Load ``--config`` (a bad file: the reason and exit 2, nothing written), write into ``--out``, say what."""
    try:
        config = GeneratorConfig.load(args.config)
    except ValueError as e:
        print(f"tpuscope {command}: {e}", file=sys.stderr)
        return 2
    for path in write(args.out, config):
        print(f"wrote {path}")
    return 0
