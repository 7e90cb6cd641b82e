"""A hang verdict reaches an OpenTelemetry collector as a log record, where an OTLP endpoint is set: a real
sidecar, a real job stuck in its input pipeline, a real OTLP receiver (gRPC)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from otlp import Receiver, attributes

from tpuscope.testing.waiting import wait_for
from tpuscope.workload.sidecar import SidecarProcess

STUCK_JOB = """
import os, sys, time
from tpuscope.tracing import Hooks, Monitor

def read_that_never_returns():
    reader, writer = os.pipe()
    return os.read(reader, 1)

mon = Monitor("otlp-hang", socket=sys.argv[1], traces=False, hooks=Hooks(profile_period="off"))
for n in range(100):
    with mon.step(n) as s:
        with s.phase("io"):
            if n == 3:
                read_that_never_returns()
"""


def test_a_stuck_process_is_sent_as_a_log_record_with_its_stacks(short_tmp: Path) -> None:
    receiver = Receiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    env["OTEL_BLRP_SCHEDULE_DELAY"] = "200"  # the batch processor's wait, in ms: sent soon after it is said
    job = None
    try:
        with SidecarProcess(short_tmp / "s.sock", "127.0.0.1:0", "--hang-after", "2s", env=env) as sidecar:
            script = short_tmp / "job.py"
            script.write_text(STUCK_JOB)
            job = subprocess.Popen([sys.executable, str(script), str(sidecar.socket)])

            def stuck() -> list[tuple[dict[str, object], object]]:
                return [(r, rec) for r, rec in receiver.log_records() if "stuck" in rec.body.string_value]

            wait_for(stuck, 60, "the verdict's log record", detail=sidecar.log)
            resource, record = stuck()[0]
            said = attributes(record)
            assert record.severity_number == 13  # WARN, as OpenTelemetry numbers severities
            assert resource["service.name"] == "tpuscope"
            assert said["tpuscope.workload"] == "otlp-hang" and said["tpuscope.phase"] == "io"
            assert said["tpuscope.step"] == 3
            assert "read_that_never_returns" in str(said["tpuscope.frames"])
            threads = json.loads(str(said["tpuscope.threads"]))
            assert any(f["function"] == "read_that_never_returns" for f in threads[0]["frames"]), threads
    finally:
        if job is not None:
            job.kill()
            job.wait()
        receiver.stop()
