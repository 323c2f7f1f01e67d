"""How ``shardloader bench`` times the two loaders, the way the repository's benchmarks do
(``benchmarks/harness.py``):

- **A fresh process per run.** Every run is forked from the command's process, which has
  loaded the dataset and imported MXNet but never run a loader with workers, so no run
  inherits another's pools, threads, shared memory or allocator state.
- **Warm-up first.** The first batches of a run (worker start-up, the first touch of every
  buffer, the prefetch queue filling) are read untimed; only the batches after them are timed.
- **Paired, alternating rounds.** A round runs every ``(num_workers, loader)`` configuration
  once, the two loaders of a worker count back to back, their order alternating between
  counts and between rounds, so that a burst of load elsewhere hits both loaders of a pair.
  :mod:`.bench_report` takes the medians and the paired ratios.

:func:`measure` reads one loader (in the run's process); :func:`measure_all` runs the rounds.
What each measured column means is told in :mod:`shardloader.tools.bench`.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import mmap
import multiprocessing
import struct
import time
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .bench_conditions import Conditions
from .bench_data import (
    BenchError,
    RecordIterLoader,
    image_pipeline_loaders,
    one_line,
    record_loader,
    shuffled,
)
from .bench_report import RECORD_LOADERS
from .measure import PeakMemory, count_samples, touch

__all__ = [
    "peak_memory",
    "measure",
    "warmup_batches",
    "factories",
    "run_isolated",
    "warm_up",
    "measure_all",
    "planned_batches",
]

_RSS_INTERVAL_S = 0.02
# Listing a process's descendants reads every process of the machine in /proc (~5 ms with a
# hundred processes, far more on a desktop); at every 20 ms sample that took a fifth of a
# core from the loaders on a 2-core machine.
_CHILDREN_REFRESH_S = 0.1
_POLL_S = 0.1


def peak_memory() -> PeakMemory:
    """Peak RSS as the command measures it: psutil every 20 ms, no PSS (reading it is slow),
    the workers listed again every 100 ms; ``resource.getrusage`` without psutil."""
    return PeakMemory(
        _RSS_INTERVAL_S,
        pss_every=None,
        children_refresh_s=_CHILDREN_REFRESH_S,
        rusage_fallback=True,
    )


def warmup_batches(workers: int) -> int:
    """Untimed batches at the start of a run: enough for every worker to have started and
    delivered, and for the prefetch queue (2 batches a worker by default) to fill twice."""
    return max(5, 4 * workers)


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if close is not None:
        close()


def measure(
    make: Callable[[], Any],
    batches: Optional[int],
    epochs: Optional[int],
    step_s: float = 0.0,
    warmup: int = 0,
    memory: Optional[PeakMemory] = None,
    progress: Optional[Callable[[int], Any]] = None,
) -> Dict[str, Any]:
    """Build a loader with ``make``, read ``warmup`` batches untimed, then time ``batches``
    batches (across as many epochs as that takes), or else the rest of ``epochs`` epochs.

    Parameters
    ----------
    make : callable
        Returns a fresh loader.
    batches, epochs : int or None
        How much to time.
    step_s : float
        Seconds to sleep after each batch, standing in for a training step.
    warmup : int
        Batches read first and not timed (at least the first batch always is).
    memory : PeakMemory, optional
        Tracks the peak memory of the run (default: a new :func:`peak_memory`).
    progress : callable, optional
        Called with 1 after every batch.

    Returns
    -------
    dict
        ``samples_per_s``, ``stall``, ``first_batch_s``, ``peak_rss_mb``, ``batches``
        (timed), ``samples`` (timed) and ``batch_bytes`` (the mean bytes of a batch).
    """
    memory = memory or peak_memory()
    with memory:
        start = time.perf_counter()
        loader = make()
        try:
            counts = _read(loader, batches, epochs, step_s, start, max(1, warmup), progress)
        finally:
            _close(loader)
            del loader
            gc.collect()  # Gluon's DataLoader ends its pool in __del__
    counts["peak_rss_mb"] = memory.peak_rss_mb
    return counts


def _read(loader, batches, epochs, step_s, start, warmup, progress=None) -> Dict[str, Any]:
    first_at = timed_from = None
    waited = 0.0
    count = timed = samples = nbytes = 0
    for _ in range(epochs) if epochs else itertools.count():
        before = count
        for data, asked in _timed(loader):
            nbytes += touch(data)
            now = time.perf_counter()
            size = count_samples(data)
            del data
            count += 1
            if first_at is None:
                first_at = now
            if count == warmup:
                timed_from = now  # the clock starts when the last warm-up batch is ready
            elif count > warmup:
                waited += now - asked
                timed, samples = timed + 1, samples + size
            if progress is not None:
                progress(1)
            if batches is not None and timed >= batches:
                break
            if step_s:
                time.sleep(step_s)
        if count == before or (batches is not None and timed >= batches):
            break
    end = time.perf_counter()
    if first_at is None:
        raise BenchError("the loader yielded no batch: is the dataset empty?")
    if not timed:
        raise BenchError(
            f"nothing left to time after the {warmup} warm-up batches: ask for more batches "
            f"or epochs, or use a larger dataset"
        )
    assert timed_from is not None  # set with the first timed batch
    steady = end - timed_from
    return {
        "samples_per_s": samples / steady,
        "stall": min(1.0, waited / steady),
        "first_batch_s": first_at - start,
        "batches": timed,
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
    """For each loader to measure, a function of ``num_workers`` that builds it: shardloader
    and Gluon's DataLoader; for the ``--recordio`` image pipeline also ``mx.io.ImageRecordIter``
    and ``ImageRecordLoader``, with the same crop, flip and normalisation."""
    from mxnet import gluon

    from .. import ShardedDataLoader

    common = dict(batch_size=args.batch_size, shuffle=shuffled(args), thread_pool=args.thread_pool)
    if batchify_fn is not None:
        common["batchify_fn"] = batchify_fn
    makers: Dict[str, Callable[[int], Any]] = {
        "shardloader": lambda w: ShardedDataLoader(dataset, num_workers=w, **common),
        "gluon": lambda w: gluon.data.DataLoader(dataset, num_workers=w, **common),
    }
    if image_pipeline_loaders(args):
        iter_name, loader_name = RECORD_LOADERS
        makers[iter_name] = partial(RecordIterLoader, args)
        makers[loader_name] = partial(record_loader, args)
    return makers


# ------------------------------------------------------------------------------ isolation
def _child(task: Callable[[Callable[[int], Any]], Dict], counter: Any, conn: Any) -> None:
    """The run's process: do ``task`` and send back its result, or what went wrong."""

    def progress(n: int) -> None:
        struct.pack_into("q", counter, 0, struct.unpack_from("q", counter)[0] + n)

    try:
        result = task(progress)
    except BenchError as exc:
        result = {"bench_error": str(exc)}
    except KeyboardInterrupt:
        result = {"error": "interrupted"}
    except BaseException as exc:  # noqa: BLE001 - a loader's failure is reported in the table
        result = {"error": one_line(exc)[:200]}
    try:
        conn.send(result)
    except (OSError, KeyboardInterrupt):  # the command is gone (Ctrl-C): nobody to tell
        pass
    finally:
        conn.close()


def run_isolated(
    task: Callable[[Callable[[int], Any]], Dict], progress: Optional[Callable[[int], Any]] = None
) -> Dict[str, Any]:
    """Run ``task(progress)`` in a process forked from this one and return its result dict
    (one with ``error`` when the task raised or its process died). A ``BenchError`` in the
    task is raised here."""
    ctx = multiprocessing.get_context("fork")
    # Batches read so far, written by the run's process only: an anonymous shared mapping,
    # which (unlike multiprocessing.Value's heap) holds no file open afterwards.
    counter = mmap.mmap(-1, 8)
    recv, send = ctx.Pipe(duplex=False)
    # Not a daemon: daemonic processes may not start the loaders' workers.
    proc = ctx.Process(target=_child, args=(task, counter, send), name="shardloader-bench-run")
    proc.start()
    send.close()
    shown = 0
    result: Optional[Dict[str, Any]] = None
    try:
        while not recv.poll(_POLL_S):
            shown = _forward(counter, shown, progress)
            if not proc.is_alive() and not recv.poll(_POLL_S):
                break
        result = recv.recv() if recv.poll() else None
    except EOFError:
        result = None
    finally:
        recv.close()
        proc.join(None if result is not None else 5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
        exitcode = proc.exitcode
        proc.close()
    _forward(counter, shown, progress)
    counter.close()
    if result is None:
        return {"error": f"the measuring process died (exit code {exitcode})"}
    if "bench_error" in result:
        raise BenchError(result["bench_error"])
    return result


def _forward(counter: Any, shown: int, progress: Optional[Callable[[int], Any]]) -> int:
    now = struct.unpack_from("q", counter)[0]
    if progress is not None and now > shown:
        progress(now - shown)
    return now


def _run_task(make, batches, epochs, step_s, warmup, progress) -> Dict[str, Any]:
    return measure(make, batches, epochs, step_s, warmup, progress=progress)


def _progress_bar(total: Optional[int], enabled: Optional[bool]) -> Any:
    """A tqdm bar over every batch read, on stderr. ``enabled=None``: only on a terminal,
    and only once the command has run for a second (short runs never show one)."""
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


def planned_batches(
    dataset_len: int, args: argparse.Namespace, batches, loaders: int = 2
) -> Optional[int]:
    """The batches the whole command reads: every run of every round, warm-up included."""
    per_epoch = max(1, -(-dataset_len // args.batch_size))
    total = 0
    for workers in args.workers:
        warmup = warmup_batches(workers)
        per_run = warmup + batches if batches is not None else max(warmup, args.epochs * per_epoch)
        total += per_run
    return total * loaders * args.rounds


def _order(names: Sequence[str], index: int, round_: int) -> Sequence[str]:
    """The loaders of a worker count in the order they run, back to back: reversed every
    other worker count and round, so that none always goes first."""
    return names if (index + round_) % 2 == 0 else names[::-1]


def _line(round_: int, rounds: int, workers: int, name: str, result: Dict[str, Any]) -> str:
    """One finished measurement, for output that is not a terminal."""
    what = (
        f"failed: {result['error']}"
        if "error" in result
        else f"{result['samples_per_s']:,.0f} samples/s"
    )
    return f"round {round_ + 1}/{rounds}: num_workers={workers} {name}: {what}"


def measure_all(makers, args: argparse.Namespace, batches: Optional[int], total=None) -> Dict:
    """Every ``(workers, loader)`` run of up to ``args.rounds`` rounds, each in a fresh
    process. No round starts that would end past ``args.budget_s`` seconds (0: no budget;
    going by the last round's time); the first always runs.

    Progress goes to a bar on a terminal (``args.progress``), otherwise a line a measurement.

    Returns
    -------
    dict
        ``runs``: ``{(workers, loader): [result of each round]}``; ``conditions``: the
        :class:`~.bench_conditions.Conditions` the runs were made in; ``rounds``: how many
        ran.
    """
    started = time.monotonic()
    budget = getattr(args, "budget_s", 0.0) or 0.0
    memory = peak_memory()
    print(f"peak RSS by {memory.method}", flush=True)
    warm_up(makers)
    names = list(makers)
    runs: Dict[Tuple[int, str], List[Dict[str, Any]]] = {}
    conditions = Conditions()
    rounds = 0
    with conditions, _progress_bar(total, getattr(args, "progress", None)) as bar:
        for round_ in range(args.rounds):
            round_start = time.monotonic()
            for i, workers in enumerate(args.workers):
                for name in _order(names, i, round_):
                    bar.set_postfix_str(f"{name}, num_workers={workers}", refresh=False)
                    task = partial(
                        _run_task,
                        partial(makers[name], workers),
                        batches,
                        args.epochs,
                        args.step_ms / 1e3,
                        warmup_batches(workers),
                    )
                    result = run_isolated(task, bar.update)
                    runs.setdefault((workers, name), []).append(result)
                    if bar.disable:
                        print(_line(round_, args.rounds, workers, name, result), flush=True)
            rounds += 1
            now = time.monotonic()
            if budget and rounds < args.rounds and now + (now - round_start) > started + budget:
                bar.clear()
                print(
                    f"stopped after {rounds} of {args.rounds} rounds: another would end past "
                    f"--budget-s {budget:g} ({now - started:.0f} s so far)",
                    flush=True,
                )
                break
    return {"runs": runs, "conditions": conditions, "rounds": rounds}


def warm_up(makers: Dict[str, Callable[[int], Any]]) -> None:
    """Untimed, each loader in a process of its own: fills the page cache before the first
    timed run, and stops the command at once if shardloader fails on the dataset."""
    for name, make in makers.items():
        result = run_isolated(partial(_run_task, partial(make, 0), 1, None, 0.0, 2))
        if "error" in result and name == "shardloader":
            raise BenchError(f"shardloader failed on this dataset: {result['error']}")
        # Gluon's own failure shows in its rows.
