"""``tpuscope fleet-sim``: a fleet on one machine, to see the rules and the sidecars at scale.

``simulator`` starts a real sidecar per simulated host on a fake TPU runtime, a real Prometheus on
the generated rules (every duration divided by ``--time-scale``, by ``rules``), and ``jobs``: lockstep
synthetic workloads with one straggler and one stall injected; then it checks what the alerts named.
"""
