"""The ``tpuscope`` command: one subcommand per room, each module imported only when its command runs.

Each command's arguments and entry point live beside the command (``add_arguments(parser)`` and
``main(args) -> int`` in the module named below), as the sidecar's options live beside the sidecar.
Building every subcommand's parser would import every room, gRPC and the OpenTelemetry SDK with them,
for ``tpuscope top`` or ``--version``: so only the chosen command's module is imported, and
``tpuscope --help`` lists the commands from this table alone.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from tpuscope import __version__

# name -> (the line `tpuscope --help` shows, the module with its add_arguments and main)
COMMANDS = {
    "serve": ("run the sidecar exporter", "tpuscope.exporter.daemon"),
    "workload": (
        "run the instrumented demo workload (JAX, or --synthetic) against a sidecar, with faults to inject",
        "tpuscope.workload.runner",
    ),
    "bench": (
        "run one of tpuscope's own benchmarks: its cost, its limits, the rules' cost at scale",
        "tpuscope.bench.command",
    ),
    "fleet-sim": (
        "simulate a fleet: a sidecar per host, a real Prometheus with the rules, injected faults",
        "tpuscope.fleetsim.simulator",
    ),
    "top": (
        "a live terminal view of a sidecar: devices, workloads' step time and phases, alerts",
        "tpuscope.top",
    ),
    "report": (
        "a run report for a post-mortem or a ticket: an HTML page and PNGs, from Prometheus or a recording",
        "tpuscope.report",
    ),
    "hangs": (
        "where a hung job's workers were stuck, and their stacks, from what the sidecars logged",
        "tpuscope.report.hangs",
    ),
    "dashboards": ("write the Grafana dashboards as JSON files", "tpuscope.dashboards"),
    "alerts": ("write the Prometheus rules and the Alertmanager configuration", "tpuscope.alerts"),
    "exclusion": (
        "write a rule that excludes a window from the goodput SLO (maintenance, a pause)",
        "tpuscope.alerts.exclusion",
    ),
    "generate": ("write the committed generated files (docs/metrics.md, ...)", "tpuscope.generate"),
}


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="tpuscope", description="Observability for TPU (and GPU) training fleets.")
    parser.add_argument("--version", action="version", version=f"tpuscope {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in arguments if not a.startswith("-")), None)
    for name, (summary, module_name) in COMMANDS.items():
        command = commands.add_parser(name, help=summary)
        if name == chosen:  # the only module imported: its options are needed to parse
            module = importlib.import_module(module_name)
            module.add_arguments(command)
            command.set_defaults(main=module.main)
    args = parser.parse_args(arguments)
    args.argv = arguments  # for a command that runs itself again in other processes (workload --processes)
    try:
        return int(args.main(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
