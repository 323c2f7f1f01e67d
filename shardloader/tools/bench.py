"""``shardloader bench``: time a user's dataset under ShardedDataLoader and Gluon's DataLoader.

For every ``num_workers`` value both loaders run the same configuration, one after the other
(``--repeat`` rounds of that, keeping the run with the median throughput), and the command
prints one table row per configuration, then recommends ``num_workers`` and ``prefetch``.
What each column means:

samples/s
    Samples after the first batch, over the time after the first batch: the steady rate.
data stall
    The share of that time the loop spent in ``next()`` and waiting for the batch to be
    readable (``wait_to_read`` on every NDArray). The loop only sleeps ``--step-ms`` per
    batch besides, so with the default 0 the stall is close to 100% by construction.
first batch
    From the loader's constructor to the first readable batch: worker start-up included
    (Gluon starts its workers in the constructor, shardloader at the first ``iter()``).
peak RSS
    With psutil, the largest sum of RSS over this process and its descendants, sampled every
    20 ms during the run (pages shared between processes count once per process). Without
    psutil, ``resource.getrusage``: the largest RSS this process ever had plus the largest
    of its finished children, since start-up, so it never goes down between rows.

The dataset comes from :mod:`.bench_data`, the runs are timed by :mod:`.bench_timing` with
the kernels of :mod:`.measure`, and :mod:`.bench_report` makes the table, the
recommendation and the plot.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from typing import Dict, List

from .bench_data import BenchError, load_dataset, shuffled
from .bench_report import format_table, plot, recommend
from .bench_timing import factories, measure_all, planned_batches

__all__ = ["BenchError", "run"]

_DEFAULT_BATCHES = 100


def _report(rows: List[Dict], args: argparse.Namespace) -> None:
    print()
    print("\n".join(format_table(rows)))
    print()
    if not args.step_ms:
        print(
            "data stall: share of the time after the first batch spent waiting for data; the "
            "loop does nothing else (no --step-ms), so ~100% is expected."
        )
    workers, prefetch, why = recommend(rows, args.step_ms)
    if workers == 0:
        print("Recommendation: num_workers=0 (prefetch does not apply)")
    else:
        print(f"Recommendation: num_workers={workers}, prefetch={prefetch}")
    for line in why:
        print(f"  {line}")
    engine_threads = os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1")
    if (args.thread_pool or workers == 0) and engine_threads == "1":
        print(
            "  MXNet operators in your samples (image decoding, Gluon transforms) share one "
            "MXNet engine thread in this process unless MXNET_CPU_WORKER_NTHREADS is set "
            "before MXNet is imported: try MXNET_CPU_WORKER_NTHREADS="
            f"{max(2, workers)} (docs/quickstart.md, 'Workers: processes or threads')."
        )


def run(args: argparse.Namespace) -> int:
    """Run ``shardloader bench`` with parsed command-line ``args``.

    Returns
    -------
    int
        The process exit code.

    Raises
    ------
    BenchError
        For a dataset that cannot be found, built or loaded, or ``--plot`` without matplotlib.
    """
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise BenchError(
            "--plot needs matplotlib, which is not installed: pip install matplotlib "
            "(or pip install 'shardloader[bench]')"
        )
    dataset, described, batchify_fn = load_dataset(args)
    batches = None if args.epochs else (args.batches or _DEFAULT_BATCHES)
    amount = f"{args.epochs} epoch(s)" if args.epochs else f"{batches} batches"
    pool = "threads" if args.thread_pool else "processes"
    step = ", shuffled" if shuffled(args) else ""
    step += f", {args.step_ms:g} ms simulated step" if args.step_ms else ""
    if args.repeat > 1:
        step += f", the median of {args.repeat} runs per row"
    print(
        f"shardloader bench: {described}, {len(dataset):,} samples, batch size "
        f"{args.batch_size}, {amount} per run, workers are {pool}{step}"
    )
    total = planned_batches(len(dataset), args, batches)
    rows = measure_all(factories(dataset, batchify_fn, args), args, batches, total)
    _report(rows, args)
    if args.plot:
        plot(rows, args.plot, f"{described}, batch {args.batch_size}")
        print(f"plot saved to {args.plot}")
    return 0
