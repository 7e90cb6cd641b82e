"""Run VictoriaMetrics (Debian's ``victoria-metrics``, ``vmagent``, ``vmalert``) on loopback beside Prometheus.

The tests use it to run tpuscope's generated rules on a second engine: vmagent scrapes the sidecars and
remote-writes to victoria-metrics, vmalert evaluates the rules against it and writes recording rules and
alert state back. Each is a real process on a free loopback port with its data under a given directory,
ready when ``/-/ready`` answers, as :class:`~tpuscope.testing.prometheus.ServerProcess` runs Prometheus.

These binaries take Go-style flags (``-httpListenAddr``, ``-loggerLevel``), not Prometheus' ``--web.*``,
so only the start differs from the base class; readiness, stopping and the query API are the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tpuscope.prometheus_api import PrometheusAPI
from tpuscope.testing.prometheus import ServerProcess, free_port

PACKAGE = "victoria-metrics"  # Debian's package: all three binaries
JOB = "tpuscope"  # the scrape job, as PrometheusServer names it


class VictoriaProcess(ServerProcess):
    """One VictoriaMetrics binary on loopback, its output in ``workdir/BINARY.log``."""

    LISTEN_FLAG = "-httpListenAddr={}"
    QUIET_FLAGS = ("-loggerLevel=WARN",)
    READY_SECONDS = 60.0  # a loaded 2-core machine starts them slowly

    def __init__(self, binary: str, flags: list[str], workdir: Path) -> None:
        super().__init__(binary, PACKAGE, flags, workdir)
        self.api = PrometheusAPI(self.url, timeout=10)  # each serves Prometheus' HTTP API, or its part of it


class VictoriaMetricsServer(VictoriaProcess):
    """``with VictoriaMetricsServer(workdir) as vm: vm.query("up")``: single-node storage and query engine.

    ``flags`` go to its command line; :data:`PROMPT_QUERY_FLAGS` make the freshest samples visible at once."""

    def __init__(self, workdir: Path, flags: list[str] = ()) -> None:  # type: ignore[assignment]
        storage = [f"-storageDataPath={workdir / 'data'}", "-retentionPeriod=1d"]
        super().__init__("victoria-metrics", [*storage, *flags], workdir)
        self.write_url = self.url + "/api/v1/write"  # the remote-write receiver vmagent and vmalert send to

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at now; returns the result vector (each item has ``metric`` and ``value``)."""
        return self.api.query(expr)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self.api.query_range(expr, start, end, step)


# What a test needs of victoria-metrics' query engine, and why (docs/fleet.md, VictoriaMetrics):
# - an instant query near now is answered as of now minus -search.latencyOffset (30 s by default), so that
#   samples still in flight from vmagent do not read as gaps: every rule would see the fleet 30 s late;
# - the response cache keeps range results for -search.cacheTimestampOffset: a test reads what was just written.
PROMPT_QUERY_FLAGS = ["-search.latencyOffset=1s", "-search.disableCache"]


class VMAgent(VictoriaProcess):
    """Scrapes targets, as Prometheus would, and remote-writes every sample to ``write_url``.

    ``discovered`` targets come from a file (file_sd) that :meth:`discover` rewrites, as a pod's target comes
    and goes with the pod; vmagent then writes staleness markers for the target that went, as Prometheus does."""

    def __init__(
        self,
        workdir: Path,
        targets: list[str],
        write_url: str,
        scrape_interval: str = "1s",
        *,
        discovered: bool = False,
        flags: list[str] = (),  # type: ignore[assignment]
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self._targets_file = workdir / "targets.json"
        if discovered:
            self.discover(targets)
            found: dict[str, Any] = {"file_sd_configs": [{"files": [str(self._targets_file)]}]}
        else:
            found = {"static_configs": [{"targets": targets}]}
        config = {
            "global": {"scrape_interval": scrape_interval},
            "scrape_configs": [{"job_name": JOB, **found}],
        }
        (workdir / "vmagent.yml").write_text(yaml.safe_dump(config))
        command = [
            f"-promscrape.config={workdir / 'vmagent.yml'}",
            f"-remoteWrite.url={write_url}",
            f"-remoteWrite.tmpDataPath={workdir / 'queue'}",
            "-promscrape.fileSDCheckInterval=1s",  # a vanished pod's target goes within a scrape or so
            "-remoteWrite.flushInterval=200ms",  # samples reach storage within the scrape that took them
            *flags,
        ]
        super().__init__("vmagent", command, workdir)

    def discover(self, targets: list[str]) -> None:
        """The targets service discovery lists now: written whole, then renamed, never read half written."""
        written = self._targets_file.with_suffix(".tmp")
        written.write_text(json.dumps([{"targets": targets}]))
        written.replace(self._targets_file)


class VMAlert(VictoriaProcess):
    """Evaluates ``rule_files`` against ``datasource`` every ``interval``; writes recording rules' results and
    the alerts' state (``ALERTS``, ``ALERTS_FOR_STATE``) to ``write_url``, reads that state back at restart."""

    def __init__(
        self,
        workdir: Path,
        rule_files: list[Path],
        datasource: str,
        write_url: str,
        interval: str = "1s",
        flags: list[str] = (),  # type: ignore[assignment]
        notifier: str = "",
    ) -> None:
        """``notifier``: an Alertmanager's URL. vmalert refuses to start alerting rules without one; none given,
        a loopback port nobody listens on, and the alerts are read from vmalert's own API instead."""
        rules = [f"-rule={Path(rule_file).resolve()}" for rule_file in rule_files]
        command = [
            *rules,
            f"-evaluationInterval={interval}",
            f"-datasource.url={datasource}",
            f"-remoteWrite.url={write_url.removesuffix('/api/v1/write')}",
            f"-remoteRead.url={datasource}",
            f"-notifier.url={notifier or f'http://127.0.0.1:{free_port()}'}",
            *flags,
        ]
        super().__init__("vmalert", command, workdir)

    def alerts(self) -> list[dict[str, Any]]:
        """Every active alert (pending or firing): ``labels``, ``state``, ``activeAt``, as Prometheus' API."""
        return list(self.api.get("alerts").get("alerts") or [])

    def rule_errors(self) -> dict[str, str]:
        """Each rule whose last evaluation failed, and its error."""
        groups = self.api.get("rules")["groups"]
        return {rule["name"]: rule["lastError"] for group in groups for rule in group["rules"] if rule["lastError"]}


# What vmalert needs to evaluate tpuscope's rules as Prometheus does, and why (docs/fleet.md, VictoriaMetrics):
# - each query carries step=-datasource.queryStep (5m by default), and an instant selector in MetricsQL looks
#   back as far as the step: a series that stopped (a vanished pod's, a recording rule's vmalert no longer
#   writes) stays visible for 5 minutes. Its evaluation interval instead: as long as a scrape or two;
# - results go out every -remoteWrite.flushInterval (5 s by default); the rules that read other rules' results
#   see them that much later;
VMALERT_FLAGS = ["-datasource.queryStep=0s", "-remoteWrite.flushInterval=200ms", "-disableAlertgroupLabel"]
