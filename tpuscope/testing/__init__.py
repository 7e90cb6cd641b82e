"""Fakes at the protocol boundaries, and the real servers' process wrappers, for tests and benchmarks.

- ``fake_tpu``: the TPU runtime's metrics service over gRPC on tpu-info's own stubs
  (``python -m tpuscope.testing.fake_tpu --port 8431`` to try the libtpu collector without a TPU);
- ``fake_nvml``: an NVML library (``fake_nvml.c``, built with gcc) that pynvml loads;
- ``prometheus``: Debian's Prometheus and promtool run on a temporary directory.

Nothing in the product imports this package (an import-linter contract in pyproject.toml).
"""
