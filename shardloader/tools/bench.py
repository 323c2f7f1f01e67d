"""``shardloader bench``: time a user's dataset under ShardedDataLoader and Gluon's DataLoader.

The command measures as the repository's benchmarks do (``benchmarks/harness.py``): every
run in a fresh process, warm-up batches untimed, and ``--rounds`` alternating rounds, each
running both loaders back to back for every ``num_workers`` value. It prints one row per
configuration with the median over the rounds and the range, the conditions it measured
in, then recommends ``num_workers`` and ``prefetch``, or says why it cannot. What each
column means:

samples/s, (min-max)
    Samples over the time after the warm-up batches: the steady rate; the median over the
    rounds, and the slowest and fastest round.
data stall
    The share of that time the loop spent in ``next()`` and waiting for the batch to be
    readable (``wait_to_read`` on every NDArray). The loop only sleeps ``--step-ms`` per
    batch besides, so with the default 0 the stall is close to 100% by construction.
first batch
    From the loader's constructor to the first readable batch: worker start-up included
    (Gluon starts its workers in the constructor, shardloader at the first ``iter()``).
peak RSS
    With psutil, the largest sum of RSS over the run's process and its workers, sampled
    every 20 ms (pages shared between processes count once per process); the highest of
    the rounds. Without psutil, ``resource.getrusage`` of the run's process.
vs gluon (min-max)
    shardloader's samples/s over Gluon's, round by round (the two ran back to back, under
    the same load): the median ratio and its range.

The dataset comes from :mod:`.bench_data`, the runs are timed by :mod:`.bench_timing` with
the kernels of :mod:`.measure`, the conditions come from :mod:`.bench_conditions`, and
:mod:`.bench_report` makes the table, the recommendation and the plot.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import textwrap
from typing import Any, Dict, List

from .._extras import install_hint
from .bench_conditions import Conditions, default_workers, usable_cores
from .bench_data import BenchError, image_pipeline_loaders, load_dataset, shuffled, uses_mxnet
from .bench_report import against_record_iter, format_table, plot, recommend, summarize
from .bench_timing import factories, measure_all, planned_batches

__all__ = ["BenchError", "run"]

_DEFAULT_BATCHES = 100
# Decoding and augmenting images costs milliseconds a sample: fewer timed batches a run keep
# --recordio's four loaders within the default --budget-s.
_DEFAULT_IMAGE_BATCHES = 20
_WIDTH = 100


def _say(text: str, indent: str = "") -> None:
    """Print prose wrapped at 100 columns; lines after the first indented two more."""
    print(
        textwrap.fill(
            text,
            _WIDTH,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_long_words=False,  # paths and options stay whole
            break_on_hyphens=False,
        )
    )


def _report(rows: List[Dict], conditions: Conditions, args: argparse.Namespace, mxnet_ops: bool):
    print()
    print("\n".join(format_table(rows)))
    for line in against_record_iter(rows):
        print(line)
    print()
    _say(conditions.describe())
    if conditions.busy:
        _say(
            "Other programs kept the machine busy: every number above is about them too. "
            "The paired ratios (vs gluon) suffer least.",
            "  ",
        )
    if args.rounds == 1:
        _say("One round: the spread is unknown (--rounds 3 or more to see it).", "  ")
    if not args.step_ms:
        _say(
            "data stall: share of the time after the warm-up spent waiting for data; the loop "
            "does nothing else (no --step-ms), so ~100% is expected."
        )
    advice = recommend(rows, args.step_ms)
    if advice.workers is None:
        print("Too noisy to decide: no recommendation.")
    elif not advice.met_target:
        print(
            f"No setting meets the target. Closest: num_workers={advice.workers}"
            + (f", prefetch={advice.prefetch}" if advice.workers else "")
        )
    elif advice.workers == 0:
        print("Recommendation: num_workers=0 (prefetch does not apply)")
    else:
        print(f"Recommendation: num_workers={advice.workers}, prefetch={advice.prefetch}")
    for line in advice.why:
        _say(line, "  ")
    workers = advice.workers or 0
    engine_threads = os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1")
    if mxnet_ops and (args.thread_pool or workers == 0) and engine_threads == "1":
        _say(
            "Your samples are MXNet arrays (MXNet operators, such as image decoding and Gluon "
            "transforms, make them): with thread workers or none, they share one MXNet engine "
            "thread in this process unless MXNET_CPU_WORKER_NTHREADS is set before MXNet is "
            f"imported: try MXNET_CPU_WORKER_NTHREADS={max(2, workers)} (docs/quickstart.md, "
            "'Workers: processes or threads').",
            "  ",
        )


def image_path(dataset: Any, batchify_fn: Any) -> str:
    """Which path shardloader runs ``dataset``'s images on (``stats()['image_path']``): a
    loader built here, inline, which loads nothing."""
    from ..loader import ShardedDataLoader

    kwargs = {} if batchify_fn is None else {"batchify_fn": batchify_fn}
    with ShardedDataLoader(dataset, batch_size=1, **kwargs) as loader:
        return loader.stats()["image_path"]


def _workers(args: argparse.Namespace) -> None:
    """Fill in the default worker counts for this machine, or note counts beyond it."""
    cores = usable_cores()
    if args.workers is None:
        args.workers = default_workers(cores)
        return
    beyond = [w for w in args.workers if w > cores]
    if beyond:
        _say(
            f"note: num_workers={','.join(map(str, beyond))} on {cores} core"
            f"{'s' if cores != 1 else ''}, as asked: the workers and the training loop will "
            "share the cores"
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
            "--plot needs matplotlib, which is not installed; the 'bench' extra has it: "
            + install_hint("bench")
        )
    _workers(args)
    dataset, described, batchify_fn = load_dataset(args)
    default = _DEFAULT_IMAGE_BATCHES if image_pipeline_loaders(args) else _DEFAULT_BATCHES
    batches = None if args.epochs else (args.batches or default)
    amount = f"{args.epochs} epoch(s)" if args.epochs else f"{batches} batches"
    pool = "threads" if args.thread_pool else "processes"
    step = ", shuffled" if shuffled(args) else ""
    step += f", {args.step_ms:g} ms simulated step" if args.step_ms else ""
    _say(
        f"shardloader bench: {described}, {len(dataset):,} samples, batch size "
        f"{args.batch_size}, {amount} timed per run after a warm-up, workers are {pool}"
        f"{step}; num_workers {','.join(map(str, args.workers))}, {args.rounds} round"
        f"{'s' if args.rounds != 1 else ''}"
        + (f" at most, within --budget-s {args.budget_s:g}" if args.budget_s else "")
        + ", each run in a fresh process"
    )
    path = image_path(dataset, batchify_fn)
    if path != "exact":  # only where images are concerned: fused, or why not
        _say(f"images: {path} (stats()['image_path']; docs/vision.md)")
    makers = factories(dataset, batchify_fn, args)
    if len(makers) > 2:
        _say(f"also measured: {', '.join(list(makers)[2:])}, with the same crop and flip")
    total = planned_batches(len(dataset), args, batches, len(makers))
    measured: Dict[str, Any] = measure_all(makers, args, batches, total)
    args.rounds = measured["rounds"]  # fewer when the budget ran out
    rows = summarize(measured["runs"])
    ours = [r for r in rows if r["loader"] == "shardloader"]
    if all("error" in r for r in ours):
        raise BenchError(f"shardloader failed on this dataset: {ours[0]['error']}")
    _report(rows, measured["conditions"], args, uses_mxnet(dataset, args))
    if args.plot:
        plot(rows, args.plot, f"{described}, batch {args.batch_size}")
        print(f"plot saved to {args.plot}")
    return 0
