"""The instrumented benchmark workloads behind ``tpuscope bench``."""

from tpuscope.bench.runner import run_bench

__all__ = ["run_bench"]
