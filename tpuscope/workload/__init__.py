"""The demo workload behind ``tpuscope workload``: an instrumented JAX training job and its fault injection.

``runner`` is the command: it finds or starts a sidecar (``sidecar``), runs the loop, prints a run
summary (``summary``) and what the sidecar serves. ``training`` is the loop, in split mode (a
program per phase, so each phase is timed) or fused (one program a step, as a TPU job runs);
``model``, ``data`` and ``checkpoints`` (Orbax) are its parts (the peak FLOP/s and FLOPs come from
:mod:`tpuscope.tracing.jax_costs`, as a user's job gets them); ``faults`` the faults
``--inject`` causes; ``synthetic`` a JAX-free loop of realistic phase timings for tests and the
fleet simulator. It uses only what a user's job would: :mod:`tpuscope.tracing`.
"""
