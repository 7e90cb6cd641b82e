"""In-job instrumentation: ``from tpuscope.tracing import Monitor``."""

from tpuscope.tracing.monitor import CheckpointTimer, Monitor, StepTimer
from tpuscope.tracing.sinks import RecordSink, Sink, SocketSink, read_records

__all__ = ["CheckpointTimer", "Monitor", "RecordSink", "Sink", "SocketSink", "StepTimer", "read_records"]
