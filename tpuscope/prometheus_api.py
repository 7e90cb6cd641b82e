"""A client of Prometheus' HTTP API (``/api/v1``): what ``tpuscope report`` and ``top`` read, and what the
tests and benchmarks ask of the Prometheus they run."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class PrometheusError(RuntimeError):
    """Prometheus could not be reached, or refused the request; the message says which and why."""


class PrometheusAPI:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def get(self, endpoint: str, parameters: dict[str, Any] | None = None) -> Any:
        """The ``data`` of a successful answer to ``GET /api/v1/ENDPOINT?PARAMETERS``."""
        url = f"{self.url}/api/v1/{endpoint}"
        if parameters:
            url += "?" + urllib.parse.urlencode(parameters, doseq=True)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:  # Prometheus answers a bad query with 400 and says why in JSON
            try:
                why = json.loads(e.read()).get("error", e.reason)
            except ValueError:
                why = e.reason
            raise PrometheusError(f"Prometheus at {self.url} refused {endpoint} {parameters or ''}: {why}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            why = getattr(e, "reason", e)
            raise PrometheusError(f"cannot read Prometheus at {self.url}: {why}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"Prometheus at {self.url} answered {endpoint} with {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query; each item of the result vector has ``metric`` and ``value``."""
        parameters: dict[str, Any] = {"query": expr}
        if at is not None:
            parameters["time"] = at
        return list(self.get("query", parameters)["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query, as Grafana runs a time series panel; each item has ``metric`` and ``values``."""
        return list(self.get("query_range", {"query": expr, "start": start, "end": end, "step": step})["result"])

    def label_values(self, label: str, match: str, start: float | None = None, end: float | None = None) -> list[str]:
        """What Grafana's ``label_values(match, label)`` variable query lists."""
        parameters: dict[str, Any] = {"match[]": match}
        if start is not None and end is not None:
            parameters.update(start=start, end=end)
        return list(self.get(f"label/{label}/values", parameters))
