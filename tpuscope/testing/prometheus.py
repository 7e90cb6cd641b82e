"""Run a real Prometheus server (Debian's ``prometheus``) scraping sidecars on loopback.

The tests use it to prove what Prometheus really sees, and so do the soak
benchmark and the fleet simulator. It is a thin wrapper: a config file, a
process, and the HTTP query API.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any, Self

import yaml

from tpuscope.prometheus_api import PrometheusAPI, PrometheusError
from tpuscope.testing.waiting import wait_for

PORT_ATTEMPTS = 3  # ports a server is started on before its failure to bind is the test's


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def target_of(metrics_url: str) -> str:
    """``http://127.0.0.1:9478/metrics`` -> ``127.0.0.1:9478``."""
    return urllib.parse.urlsplit(metrics_url).netloc


class ServerProcess:
    """A Prometheus-project server binary on loopback: started with its flags, ready when ``/-/ready``
    answers, stopped on ``__exit__``. Its output goes to ``log_path``, for the tests' failure messages."""

    # The flags that say where it listens and how much it logs; other projects' binaries spell them otherwise.
    LISTEN_FLAG = "--web.listen-address={}"
    QUIET_FLAGS: tuple[str, ...] = ("--log.level=warn",)
    READY_SECONDS = 30.0

    def __init__(self, binary: str, package: str, flags: list[str], workdir: Path) -> None:
        path = shutil.which(binary)
        if path is None:
            raise PrometheusError(f"{binary} not found: install Debian's {package} package (`make test` does)")
        workdir.mkdir(parents=True, exist_ok=True)
        self.name = binary
        self.log_path = workdir / f"{binary}.log"
        # A free port is free when asked, not when the server binds it: a process beside (another test's) may take it
        # between the two (a fresh-clone run: vmalert's "bind: address already in use"). Then another port.
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.port = free_port()
            self.address = f"127.0.0.1:{self.port}"
            self.url = f"http://{self.address}"
            with open(self.log_path, "w") as log:
                self.proc = subprocess.Popen(
                    [path, self.LISTEN_FLAG.format(self.address), *self.QUIET_FLAGS, *flags],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            try:
                self._wait_ready(timeout=self.READY_SECONDS)
                return
            except PrometheusError as e:
                if attempt == PORT_ATTEMPTS or "address already in use" not in str(e):
                    raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"{self.name} exited with {self.proc.returncode}: {self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:  # not listening yet, or a port another process holds and does not answer on
                pass
            time.sleep(0.1)
        raise PrometheusError(f"{self.name} not ready after {timeout}s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class PrometheusServer(ServerProcess):
    """``with PrometheusServer(workdir, ["127.0.0.1:9478"]) as prom: prom.query("up")``"""

    def __init__(
        self,
        workdir: Path,
        targets: list[str],
        scrape_interval: str = "1s",
        binary: str = "prometheus",
        *,
        evaluation_interval: str = "",
        labels: dict[str, str] | None = None,
        rule_files: list[Path] = (),  # type: ignore[assignment]
        alertmanager: str = "",
        scrape: dict[str, Any] | None = None,
        external_labels: dict[str, str] | None = None,
        remote_write: list[dict[str, Any]] = (),  # type: ignore[assignment]
        flags: list[str] = (),  # type: ignore[assignment]
        discovered: bool = False,
        scrape_configs: list[dict[str, Any]] = (),  # type: ignore[assignment]
    ):
        """``labels`` are added to every target (as a fleet's relabelling adds pod and namespace);
        ``scrape`` is merged into the scrape config (``scheme``, ``tls_config``, ``basic_auth``, ...);
        ``external_labels`` and ``remote_write`` are the configuration's own sections; ``flags`` go to the
        command line (``--web.enable-remote-write-receiver`` for a central one). No targets: it scrapes nothing.
        ``discovered``: the targets come from a file (file_sd) that :meth:`discover` rewrites, as a pod's target
        comes and goes with the pod; otherwise they are static, listed even while down. ``scrape_configs``: scrape
        jobs of the caller's own, beside (or, with no targets, instead of) the tpuscope one. ``evaluation_interval``:
        the rules', where it is not the scrapes'."""
        workdir.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": scrape_interval,
                "evaluation_interval": evaluation_interval or scrape_interval,
            },
            # Prometheus reads rule_files relative to its config file, which lives in workdir: absolute paths.
            "rule_files": [str(Path(rule_file).resolve()) for rule_file in rule_files],
        }
        self._targets_file = workdir / "targets.json"
        self._labels = labels
        if discovered:
            self.discover(targets)
            found = {"file_sd_configs": [{"files": [str(self._targets_file)], "refresh_interval": "1s"}]}
            config["scrape_configs"] = [{"job_name": "tpuscope", **found, **(scrape or {})}]
        elif targets:
            static = [self._group(targets)]
            config["scrape_configs"] = [{"job_name": "tpuscope", "static_configs": static, **(scrape or {})}]
        if scrape_configs:  # whole scrape jobs of the caller's, after the tpuscope job
            config["scrape_configs"] = [*config.get("scrape_configs", []), *scrape_configs]
        if external_labels:
            config["global"]["external_labels"] = external_labels
        if remote_write:
            config["remote_write"] = list(remote_write)
        if alertmanager:  # host:port of an Alertmanager to send alerts to
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        command = [f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}", *flags]
        super().__init__(binary, "prometheus", command, workdir)
        self.api = PrometheusAPI(self.url, timeout=10)

    def discover(self, targets: list[str]) -> None:
        """The targets service discovery lists now (``discovered`` servers): written whole, then renamed, so that
        Prometheus never reads half a file."""
        written = self._targets_file.with_suffix(".tmp")
        written.write_text(json.dumps([self._group(targets)]))
        written.replace(self._targets_file)

    def _group(self, targets: list[str]) -> dict[str, Any]:
        """A target group, static or discovered: the targets, and the labels added to each."""
        return {"targets": targets, **({"labels": self._labels} if self._labels else {})}

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; returns the result vector (each item has ``metric`` and ``value``)."""
        return self.api.query(expr)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query, as Grafana runs a time series panel; each item has ``metric`` and ``values``."""
        return self.api.query_range(expr, start, end, step)

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's ``label_values(match, label)`` variable query lists."""
        return self.api.label_values(label, match)

    def scraped_at(self) -> float:
        """When Prometheus began the latest scrape of every target: the oldest target's (0 before every first)."""
        started = [float(sample["value"][1]) for sample in self.query("timestamp(up)")]
        return min(started, default=0.0)

    def evaluated_at(self) -> float:
        """When Prometheus began the latest evaluation of every rule group of the quickest pace: the oldest such
        group's (0 without rules). A group of a slower pace of its own (the SLO's ratios over days, every 5
        minutes) is not waited for: a test cannot wait its interval."""
        groups = self.api.get("rules")["groups"]
        quickest = min((group["interval"] for group in groups), default=0.0)
        return min(
            (datetime.fromisoformat(g["lastEvaluation"]).timestamp() for g in groups if g["interval"] == quickest),
            default=0.0,
        )

    def catch_up(self, scrapes: int = 1, rules: bool = False, timeout: float = 60.0) -> None:
        """Wait until every target has been scraped ``scrapes`` times since now (and, with ``rules``, every rule
        group evaluated after that): what a test waits for before it asks about the events it has just made.

        A scrape that began before now may have read a counter before the last event: only one that began
        after it holds it. Waiting on the timestamps themselves, not for a number of seconds, holds as well on
        a loaded machine where a scrape comes late."""
        since = time.time()
        for count in range(1, scrapes + 1):
            since = self._scraped_after(since, timeout, f"scrape {count} of every target")
        if rules:
            wait_for(lambda: self.evaluated_at() > since, timeout, "rule evaluation after the last scrape")

    def _scraped_after(self, since: float, timeout: float, what: str) -> float:
        """Wait until every target's latest scrape began after ``since``; when it began."""
        wait_for(lambda: self.scraped_at() > since, timeout, what)
        return self.scraped_at()

    def scalar(self, expr: str) -> float | None:
        """The value of a query that yields at most one series, or None when it yields none."""
        result = self.query(expr)
        if len(result) > 1:
            raise PrometheusError(f"query {expr!r} returned {len(result)} series, expected one")
        return float(result[0]["value"][1]) if result else None
