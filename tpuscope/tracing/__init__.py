"""In-job instrumentation: ``from tpuscope.tracing import Monitor``."""

from tpuscope.events import read_records
from tpuscope.tracing.failures import failure_reason
from tpuscope.tracing.hooks import Hooks
from tpuscope.tracing.monitor import CheckpointTimer, Monitor, StepTimer, Traces
from tpuscope.tracing.orbax_checkpoints import OrbaxCheckpoints
from tpuscope.tracing.preemption import Preempted
from tpuscope.tracing.sinks import RecordSink, Sink, SocketSink

__all__ = [
    "CheckpointTimer",
    "Hooks",
    "Monitor",
    "OrbaxCheckpoints",
    "Preempted",
    "RecordSink",
    "Sink",
    "SocketSink",
    "StepTimer",
    "Traces",
    "failure_reason",
    "read_records",
]
