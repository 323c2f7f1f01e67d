"""How ``shardloader bench`` times the two loaders: :func:`measure` reads one loader, and
:func:`measure_all` runs every ``(num_workers, loader)`` configuration ``--repeat`` times.

What each measured column means is told in :mod:`shardloader.tools.bench`.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import time
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

from .bench_data import BenchError, one_line, shuffled
from .bench_report import LOADERS
from .measure import PeakMemory, count_samples, touch

__all__ = ["peak_memory", "measure", "factories", "measure_all", "median_run", "planned_batches"]

_RSS_INTERVAL_S = 0.02
_WARMUP_BATCHES = 3


def peak_memory() -> PeakMemory:
    """Peak RSS as the command measures it: psutil every 20 ms, no PSS (reading it is slow),
    the workers listed at every sample; ``resource.getrusage`` without psutil."""
    return PeakMemory(_RSS_INTERVAL_S, pss_every=None, children_refresh_s=0.0, rusage_fallback=True)


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if close is not None:
        close()


def measure(
    make: Callable[[], Any],
    batches: Optional[int],
    epochs: Optional[int],
    step_s: float = 0.0,
    memory: Optional[PeakMemory] = None,
    progress: Optional[Callable[[int], Any]] = None,
) -> Dict[str, Any]:
    """Build a loader with ``make`` and read ``batches`` batches (or ``epochs`` epochs).

    Parameters
    ----------
    make : callable
        Returns a fresh loader.
    batches, epochs : int or None
        How much to read: ``batches`` batches across as many epochs as that takes, or else
        ``epochs`` whole epochs.
    step_s : float
        Seconds to sleep after each batch, standing in for a training step.
    memory : PeakMemory, optional
        Tracks the peak memory of the run (default: a new :func:`peak_memory`).
    progress : callable, optional
        Called with 1 after every batch (a progress bar's ``update``).

    Returns
    -------
    dict
        ``samples_per_s``, ``stall``, ``first_batch_s``, ``peak_rss_mb``, ``batches``,
        ``samples`` and ``batch_bytes`` (the mean bytes of a batch).
    """
    memory = memory or peak_memory()
    with memory:
        start = time.perf_counter()
        loader = make()
        try:
            counts = _read(loader, batches, epochs, step_s, start, progress)
        finally:
            _close(loader)
            del loader
            gc.collect()  # Gluon's DataLoader ends its pool in __del__
    counts["peak_rss_mb"] = memory.peak_rss_mb
    return counts


def _read(loader, batches, epochs, step_s, start, progress=None) -> Dict[str, Any]:
    first_at = None
    waited = steady = 0.0
    count = samples = steady_samples = nbytes = 0
    for _ in range(epochs) if epochs else itertools.count():
        before = count
        for batch in _timed(loader):
            data, t_asked = batch
            nbytes += touch(data)
            now = time.perf_counter()
            size = count_samples(data)
            if first_at is None:
                first_at = now
            else:
                waited += now - t_asked
                steady_samples += size
            count, samples = count + 1, samples + size
            del data, batch
            if progress is not None:
                progress(1)
            if batches is not None and count >= batches:
                break
            if step_s:
                time.sleep(step_s)
        if count == before or (batches is not None and count >= batches):
            break
    end = time.perf_counter()
    if first_at is None:
        raise BenchError("the loader yielded no batch: is the dataset empty?")
    steady = end - first_at
    rate = steady_samples / steady if steady_samples else samples / (end - start)
    return {
        "samples_per_s": rate,
        "stall": min(1.0, waited / steady) if steady_samples else None,
        "first_batch_s": first_at - start,
        "batches": count,
        "samples": samples,
        "batch_bytes": nbytes / count,
    }


def _timed(loader):
    """Yield ``(batch, time next() was called)`` for one epoch of ``loader``."""
    it = iter(loader)
    try:
        while True:
            asked = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            yield batch, asked
    finally:
        _close(it)


def factories(dataset, batchify_fn, args) -> Dict[str, Callable[[int], Any]]:
    """For each loader of :data:`LOADERS`, a function of ``num_workers`` that builds it."""
    from mxnet import gluon

    from .. import ShardedDataLoader

    common = dict(batch_size=args.batch_size, shuffle=shuffled(args), thread_pool=args.thread_pool)
    if batchify_fn is not None:
        common["batchify_fn"] = batchify_fn
    return {
        "shardloader": lambda w: ShardedDataLoader(dataset, num_workers=w, **common),
        "gluon": lambda w: gluon.data.DataLoader(dataset, num_workers=w, **common),
    }


def _measure_one(makers, name: str, workers: int, args, batches, memory, progress=None) -> Dict:
    """One run; a loader that fails on the dataset gives a row with ``error`` (Gluon's record
    datasets, for one, may fail under thread workers), any other problem raises."""
    try:
        return measure(
            partial(makers[name], workers),
            batches,
            args.epochs,
            args.step_ms / 1e3,
            memory,
            progress,
        )
    except BenchError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return {"error": one_line(exc)[:200]}


def median_run(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The run with the median throughput, with the highest peak RSS of all runs; a failure
    if any run failed."""
    failed = [r for r in runs if "error" in r]
    if failed:
        note = f" ({len(failed)} of {len(runs)} runs)" if len(runs) > 1 else ""
        return {"error": failed[0]["error"] + note}
    ranked = sorted(runs, key=lambda r: r["samples_per_s"])
    return {**ranked[len(ranked) // 2], "peak_rss_mb": max(r["peak_rss_mb"] for r in runs)}


def _progress_bar(total: Optional[int], enabled: Optional[bool]) -> Any:
    """A tqdm bar over every measured batch, on stderr. ``enabled=None``: only on a
    terminal, and only once the run has lasted a second (short runs never show one)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="batch",
        desc="bench",
        disable=False if enabled else None if enabled is None else True,
        delay=1.0 if enabled is None else 0.0,
        leave=False,
        dynamic_ncols=True,
    )


def planned_batches(dataset_len: int, args: argparse.Namespace, batches) -> Optional[int]:
    """The batches of the whole command: every run of every configuration."""
    if batches is not None:
        per_run = batches
    else:
        per_run = args.epochs * max(1, -(-dataset_len // args.batch_size))
    return per_run * len(args.workers) * len(LOADERS) * args.repeat


def _warm_up(makers: Dict[str, Callable[[int], Any]]) -> None:
    """Untimed: fills the page cache and runs one-time imports before the first timed row."""
    for name, make in makers.items():
        try:
            measure(partial(make, 0), _WARMUP_BATCHES, None)
        except Exception as exc:
            if name == "shardloader":
                raise BenchError(f"shardloader failed on this dataset: {one_line(exc)}") from exc
            # Gluon's own failure shows in its rows.


def measure_all(makers, args: argparse.Namespace, batches: Optional[int], total=None) -> List:
    """One row per (workers, loader): the two loaders interleaved, ``--repeat`` rounds."""
    memory = peak_memory()
    print(f"peak RSS by {memory.method}", flush=True)
    _warm_up(makers)
    runs: Dict[Tuple[int, str], List[Dict[str, Any]]] = {}
    with _progress_bar(total, getattr(args, "progress", None)) as bar:
        for _ in range(args.repeat):
            for i, workers in enumerate(args.workers):
                # Alternate which loader goes first, so neither always inherits a warmer
                # machine.
                for name in LOADERS if i % 2 == 0 else LOADERS[::-1]:
                    bar.set_postfix_str(f"{name}, num_workers={workers}", refresh=False)
                    result = _measure_one(makers, name, workers, args, batches, memory, bar.update)
                    runs.setdefault((workers, name), []).append(result)
    rows = [
        {"loader": name, "workers": workers, **median_run(results)}
        for (workers, name), results in runs.items()
    ]
    rows.sort(key=lambda r: (r["workers"], LOADERS.index(r["loader"])))
    ours = [r for r in rows if r["loader"] == "shardloader"]
    if all("error" in r for r in ours):
        raise BenchError(f"shardloader failed on this dataset: {ours[0]['error']}")
    return rows
