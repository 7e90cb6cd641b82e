"""tpuscope's own benchmarks: what it costs a job and a host, what it holds under load, and what its rules and
dashboards cost Prometheus at a fleet's size.

``command`` is ``tpuscope bench``: one subcommand per benchmark, each with its own flags. The benchmarks, one
module each, ``run(args)`` their entry point:

- ``perf`` (``bench perf``): every cost against its peer measured in the same run, a table and JSON.
- ``overhead`` (``bench overhead``): the Monitor's cost per step of the JAX workload, on against off.
- ``trace_cost`` (``bench trace-cost``): what spans add to a step, unsampled and sampled.
- ``scrape_latency`` (``bench scrape-latency``): a sidecar's scrape time with every collector on.
- ``flood`` (``bench flood``): jobs at ten times the supported event rate, and what the sidecar held.
- ``soak`` (``bench soak``): the workload under a real Prometheus for minutes, then what was lost.
- ``hangs`` (``bench hangs``): a job whose worker hangs three ways, and the slow clean runs that must not page.
- ``rule_cost`` (``bench rule-cost``): what each rule group costs Prometheus on a backfilled fleet's TSDB.
- ``fleet_scale`` (``bench fleet-scale``): one sidecar's real series on N hosts, with the rules and the boards.

What they share, imported by no command of another:

- ``timing``: an A/B of steps with the Monitor on and off, paced calls, best of rounds, a scrape timed.
- ``verdict``: named checks, the JSON report with the machine, aligned tables.
- ``machine``: the machine a run was on. ``memory``: a process's memory, from /proc or as Prometheus has it.
- ``rule_files``: a rules file, the series its rules read and how far back, Prometheus evaluating it.
- ``fleet_series``: a synthetic fleet's hosts and series, its history (promtool) and its live ``/metrics``.
- ``kube_state``: kube-state-metrics' and Kueue's series of ``fleet_scale``'s fleet.
- ``sidecar-series.prom``: one sidecar's real scrape, the series ``fleet_scale`` replicates.

They drive the demo workload (:mod:`tpuscope.workload`) and the fakes of :mod:`tpuscope.testing`;
nothing in the product imports them.
"""
