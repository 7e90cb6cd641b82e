"""tpuscope: observability for TPU (and GPU) training fleets."""

from typing import Any


def __getattr__(name: str) -> Any:
    """``tpuscope.__version__``, read from the installed package when asked: importlib.metadata is about a quarter
    of the in-job library's import time, which every job would pay for a string it never reads."""
    if name != "__version__":
        raise AttributeError(f"module 'tpuscope' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tpuscope")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+unknown"
