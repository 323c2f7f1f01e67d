"""Side-by-side benchmarks of shardloader against Gluon's (and torch's) DataLoader.

Run ``make bench`` or ``python -m benchmarks.run --help``. The modules:

- :mod:`benchmarks.workloads`: the generated datasets (W1-W4) and one loader factory per
  (workload, loader, options) case;
- :mod:`benchmarks.harness`: :func:`~benchmarks.harness.time_loader`, which times any loader
  factory the same way, and the runner that measures each case in a fresh process;
- :mod:`benchmarks.report`: medians, ratios, targets, the JSON/markdown results and the plot;
- :mod:`benchmarks.run`: the command line and the interleaved plan.
"""
