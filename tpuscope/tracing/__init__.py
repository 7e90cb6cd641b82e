"""In-job instrumentation: ``from tpuscope.tracing import Monitor``."""

from tpuscope.tracing.monitor import CheckpointTimer, Monitor, StepTimer
from tpuscope.tracing.sinks import Sink, SocketSink

__all__ = ["CheckpointTimer", "Monitor", "Sink", "SocketSink", "StepTimer"]
