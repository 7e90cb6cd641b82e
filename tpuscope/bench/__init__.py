"""tpuscope's own benchmarks: what it costs a job and a host, and what it holds under load.

- ``perf`` (``tpuscope bench perf``): each cost against its peer measured in the same run (a bare
  ``Histogram.observe``, an OTel span, a bare socket send, node_exporter), printed as ratios beside
  the absolute figures; ``verdict`` writes the table and the JSON.
- ``overhead`` (``--overhead``), ``trace_cost`` (``--trace-cost``), ``scrape_latency``
  (``--scrape-latency``): the Monitor's cost per step, the spans' cost, a full sidecar's scrape time.
- ``flood`` and ``soak``: jobs sending ten times the supported event rate, and hours of the workload
  under a real Prometheus, then what was lost.

They drive the demo workload (:mod:`tpuscope.workload`) and the fakes of :mod:`tpuscope.testing`;
nothing in the product imports them.
"""
