"""Side-by-side benchmarks of shardloader against Gluon's (and torch's) DataLoader.

Run ``make bench`` or ``python -m benchmarks.run --help``. The modules:

- :mod:`benchmarks.workloads`: the generated datasets (W1-W6, W5's JPEG records) and one
  loader factory per (workload, loader, options) case, ``mx.io.ImageRecordIter`` included;
- :mod:`benchmarks.micro`: the NDArray stacking micro-benchmark (``STACK``);
- :mod:`benchmarks.harness`: :func:`~benchmarks.harness.time_loader`, which times any loader
  factory the same way, and the runner that measures each case (or task) in a fresh process;
- :mod:`benchmarks.summary`: medians, ratios paired per round, comparisons across cells;
- :mod:`benchmarks.targets`: the targets of issues 4 and 13, checked on a summary;
- :mod:`benchmarks.report`: the JSON and markdown results, and publishing them;
- :mod:`benchmarks.plot`: the throughput plot;
- :mod:`benchmarks.run`: the command line and the interleaved plan;
- :mod:`benchmarks.profile_w5`: a diagnostic, not part of the run: where W5's time goes;
- :mod:`benchmarks.peers`: ``make bench-peers``, shardloader against torchvision and FFCV
  on W5/W7's JPEGs; the peers run in their own venv through ``benchmarks/peers_runner.py``.
"""
