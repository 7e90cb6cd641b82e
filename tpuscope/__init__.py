"""tpuscope: observability for TPU (and GPU) training fleets."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tpuscope")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
