"""In-job instrumentation: ``from tpuscope.tracing import Monitor``."""

from tpuscope.events import read_records
from tpuscope.tracing.monitor import CheckpointTimer, Monitor, StepTimer
from tpuscope.tracing.orbax_checkpoints import OrbaxCheckpoints
from tpuscope.tracing.sinks import RecordSink, Sink, SocketSink

__all__ = [
    "CheckpointTimer",
    "Monitor",
    "OrbaxCheckpoints",
    "RecordSink",
    "Sink",
    "SocketSink",
    "StepTimer",
    "read_records",
]
