"""In-job instrumentation: ``from tpuscope.tracing import Monitor``."""

from tpuscope.events import read_records
from tpuscope.tracing.failures import Preempted, failure_reason
from tpuscope.tracing.monitor import CheckpointTimer, Monitor, StepTimer
from tpuscope.tracing.orbax_checkpoints import OrbaxCheckpoints
from tpuscope.tracing.sinks import RecordSink, Sink, SocketSink

__all__ = [
    "CheckpointTimer",
    "Monitor",
    "OrbaxCheckpoints",
    "Preempted",
    "RecordSink",
    "Sink",
    "SocketSink",
    "StepTimer",
    "failure_reason",
    "read_records",
]
