"""Time any loader the same way, in a fresh process per measurement.

:func:`time_loader` is the one measuring function: every loader, every workload and every
option go through it, so the numbers are comparable by construction.

- **Epochs.** The loader is built, then iterated one full warm-up epoch, which absorbs
  worker start-up (Gluon forks in its constructor, shardloader at the first ``iter()``) and
  yields the first-batch latency (W5 inline, with no workers to start and seconds per
  epoch, times its first epoch instead). Timed epochs follow until they add up to ``min_time_s``
  (0.5 s; at least one), so a 20 ms epoch is not timed once. An epoch's wall time runs from
  just before ``iter(loader)`` to its ``StopIteration``: it includes filling the prefetch
  queue and ending the epoch. Throughput is timed samples over the timed epochs' wall time.
- **CPU per sample** is the CPU time (user + system) of the measuring process and its live
  descendants (workers, their threads included) over the timed epochs, per sample
  (``cpu_ms_per_sample``): what a sample costs the machine, which other load changes less
  than it changes the throughput.
- **Touching the data.** Every step goes through ``adapt`` (the user's per-step work, e.g.
  ``split_and_load`` for Gluon on W4), then ``wait_to_read()`` on every NDArray in it
  (:func:`shardloader.tools.measure.touch`, which ``shardloader bench`` uses too), so
  asynchronous copies are paid for where they happen and lazy evaluation cannot flatter
  anyone.
- **Batch latency** is the time from calling ``next()`` until the step is adapted and every
  array in it is readable: the time a training loop would wait for its data.
- **First-batch latency** runs from just before the loader is constructed to the first
  readable batch of the first epoch.
- **Peak RSS** is the largest sum of RSS over this process and all of its descendants
  (workers, and their helpers), sampled every 5 ms by a background psutil thread
  (:class:`shardloader.tools.measure.PeakMemory`) from just before the loader is constructed
  until the last timed epoch ends. Shared pages count once per process that maps them;
  ``peak_pss_mb`` (sampled every 100 ms) counts them once in all. That thread takes about
  0.2 of a core beside an image loader; ``memory=False`` measures without it (the memory
  figures are then None), as :mod:`benchmarks.peers` does, whose peers run without it.

:func:`run_isolated` runs one :class:`~benchmarks.workloads.Case` in a fresh process, forked
from a fork server that has imported MXNet and nothing else, with a deadline: no run inherits
another's allocator state, pools or threads, and a hung loader becomes an error, not a hang.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional

import numpy as np

__all__ = ["time_loader", "run_isolated", "tree_cpu_s", "group_alive"]

_MB = 1024.0 * 1024.0
_KILL_GRACE_S = 5.0
_LEFTOVER_GRACE_S = 2.0  # how long a finished run's workers may take to exit
_MIN_TIMED_S = 0.5  # timed epochs add up to at least this much wall time
_MAX_TIMED_EPOCHS = 20


def _percentile_us(values: List[float], q: float) -> Optional[float]:
    return float(np.percentile(values, q) * 1e6) if values else None


def _epoch(
    loader: Any, adapt: Optional[Callable[[Any], Any]], check: Optional[Callable[[Any], None]]
) -> Dict[str, Any]:
    from shardloader.tools.measure import count_step_samples, touch  # see time_loader

    latencies: List[float] = []
    samples = nbytes = 0
    first_ready: Optional[float] = None
    start = time.perf_counter()
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        if adapt is not None:
            batch = adapt(batch)
        nbytes += touch(batch)
        ready = time.perf_counter()
        latencies.append(ready - t)
        if first_ready is None:
            first_ready = ready
            if check is not None:
                check(batch)
        samples += count_step_samples(batch)
        del batch  # drop the step before waiting for the next, as a training loop does
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "batches": len(latencies),
        "samples": samples,
        "bytes": nbytes,
        "first_ready": first_ready,
        "latencies": latencies,
    }


def time_loader(
    factory: Callable[[], Any],
    *,
    adapt: Optional[Callable[[Any], Any]] = None,
    check: Optional[Callable[[Any], None]] = None,
    expect_samples: Optional[int] = None,
    warmup_epochs: int = 1,
    min_time_s: float = _MIN_TIMED_S,
    max_epochs: int = _MAX_TIMED_EPOCHS,
    memory: bool = True,
) -> Dict[str, Any]:
    """Build a loader with ``factory`` and time it (see the module docstring).

    Parameters
    ----------
    factory : callable
        Returns a fresh loader: anything iterable once per epoch.
    adapt : callable, optional
        Per-step work of the user's loop that belongs to data delivery, timed with ``next()``.
    check : callable, optional
        Called with the first step of every epoch; raises if the data is wrong.
    expect_samples : int, optional
        Raise ``RuntimeError`` if an epoch delivers a different number of samples.
    warmup_epochs : int
        Untimed epochs first (the first one gives the first-batch latency).
    min_time_s, max_epochs : float, int
        Timed epochs follow until they add up to ``min_time_s`` (at least one, at most
        ``max_epochs``), so that short epochs are not timed on a single noisy sample.
    memory : bool
        Sample the peak memory (a thread reading ``/proc`` every 5 ms, and the PSS every
        100 ms: about 0.2 of a core beside an image loader with two workers, measured with
        ``perf``). ``False`` leaves the machine to the loader; the memory figures are None.

    Returns
    -------
    dict
        Plain numbers (JSON-ready): ``samples_per_s``, ``batches_per_s``, ``mb_per_s``,
        ``us_per_batch``, ``lat_p50_us``, ``lat_p99_us``, ``first_batch_ms``, ``peak_rss_mb``,
        ``peak_pss_mb`` and more, plus the loader's own ``stats()`` where it has them.
    """
    if warmup_epochs < 0 or max_epochs < 1:
        raise ValueError(
            f"need warmup_epochs >= 0 and max_epochs >= 1, got {warmup_epochs}, {max_epochs}"
        )
    # Imported by the measuring process only: importing shardloader imports MXNet, which the
    # benchmark's main process (benchmarks.run) never does, so as not to change its own
    # state, the W3 calibration included.
    from shardloader.tools.measure import PeakMemory

    warm: List[Dict[str, Any]] = []
    timed: List[Dict[str, Any]] = []
    mem = PeakMemory() if memory else None
    with mem if mem is not None else contextlib.nullcontext():
        built = time.perf_counter()
        loader = factory()
        try:
            while len(warm) < warmup_epochs or not _enough(timed, min_time_s, max_epochs):
                cpu = tree_cpu_s()
                run = _epoch(loader, adapt, check)
                run["cpu_s"] = tree_cpu_s() - cpu
                if expect_samples is not None and run["samples"] != expect_samples:
                    raise RuntimeError(
                        f"an epoch delivered {run['samples']} samples, expected {expect_samples}"
                    )
                (warm if len(warm) < warmup_epochs else timed).append(run)
            stats_fn = getattr(loader, "stats", None)
            loader_stats = stats_fn() if callable(stats_fn) else None
        finally:
            close = getattr(loader, "close", None)
            if callable(close):
                close()
            del loader
    first = (warm or timed)[0]["first_ready"]
    wall = sum(r["wall_s"] for r in timed)
    samples = sum(r["samples"] for r in timed)
    batches = sum(r["batches"] for r in timed)
    nbytes = sum(r["bytes"] for r in timed)
    cpu = sum(r["cpu_s"] for r in timed)
    latencies = [t for r in timed for t in r["latencies"]]
    return {
        "epochs": len(timed),
        "samples": samples,
        "batches": batches,
        "bytes": nbytes,
        "timed_s": wall,
        "samples_per_s": samples / wall,
        # CPU time of this process and its workers over the timed epochs, per sample: what
        # the loader costs the machine, which other load does not change much.
        "timed_cpu_s": cpu,
        "cpu_ms_per_sample": cpu / samples * 1e3 if samples else None,
        "batches_per_s": batches / wall,
        "mb_per_s": nbytes / _MB / wall,
        "us_per_batch": wall / max(batches, 1) * 1e6,
        "lat_p50_us": _percentile_us(latencies, 50),
        "lat_p99_us": _percentile_us(latencies, 99),
        "lat_max_us": _percentile_us(latencies, 100),
        "first_batch_ms": (first - built) * 1e3 if first is not None else None,
        "cold_epoch_s": (warm or timed)[0]["wall_s"],
        "peak_rss_mb": mem.peak_rss_mb if mem else None,
        "base_rss_mb": mem.base_rss_mb if mem else None,
        "peak_pss_mb": mem.peak_pss_mb if mem else None,
        "peak_processes": mem.peak_processes if mem else None,
        "memory_samples": mem.samples if mem else None,
        "loader_stats": _jsonable(loader_stats),
    }


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and its live descendants so far."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # gone meanwhile
            continue
        total += t.user + t.system
    return total


def _enough(timed: List[Dict[str, Any]], min_time_s: float, max_epochs: int) -> bool:
    if not timed:
        return False
    return len(timed) >= max_epochs or sum(r["wall_s"] for r in timed) >= min_time_s


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    return repr(value)


# ---------------------------------------------------------------------------- isolation
# Imported once by the fork server, so that each measured process starts in milliseconds
# instead of importing MXNet (~0.8 s) again. torch is left out: it would sit in every run's
# RSS; torch runs import it themselves, before anything is measured.
_PRELOAD = [
    "numpy",
    "psutil",
    "mxnet",
    "mxnet.gluon.data",
    "mxnet.gluon.utils",
    "mxnet.gluon.data.vision",
    "shardloader",
    # The package imports its modules on first use: the loader (and with it the engine).
    "shardloader.loader",
    # Imported lazily by the loader: preloading them too makes every run of a benchmark use
    # the code as it was when the benchmark started, even if it is edited meanwhile.
    "shardloader._engine.ipc.table",
    "shardloader._engine.device",
    "shardloader.prefetch",
    "benchmarks.images",
    "benchmarks.workloads",
    "benchmarks.micro",
    "benchmarks.harness",
]
_context: Optional[Any] = None


def run_case(
    case_dict: Dict[str, Any], min_time_s: float = _MIN_TIMED_S, memory: bool = True
) -> Dict[str, Any]:
    """Measure one case in this process (what the child of :func:`run_isolated` does).

    ``case_dict`` is a :class:`~benchmarks.workloads.Case` as a dict, or a task that is not
    a loader: ``{"task": name, **kwargs}`` with ``name`` one of ``stacking`` (the NDArray
    stacking micro-benchmark), ``jpeg_per_sample`` (W5's single-process rate through Gluon's
    pipeline), ``fused_per_sample`` (decode + crop in shardloader's fused image code, one
    process), ``jpeg_records`` (writes W5's records if they are missing) and ``jpeg_folder``
    (writes W7's class folders if they are missing) and ``placement`` (one cell of
    :mod:`benchmarks.gpu`). An ``env`` key (a dict) sets those environment variables in this
    process first (e.g. ``SHARDLOADER_CV2_THREADS``, read by the loader's workers).
    """
    case_dict = dict(case_dict)
    os.environ.update(case_dict.pop("env", None) or {})
    if "task" in case_dict:
        kwargs = dict(case_dict)
        return _tasks()[kwargs.pop("task")](**kwargs)
    from .workloads import Case, build

    case = Case(**case_dict)
    prepared = build(case)
    return time_loader(
        prepared.factory,
        adapt=prepared.adapt,
        check=prepared.check,
        expect_samples=prepared.samples,
        warmup_epochs=prepared.warmup_epochs,
        min_time_s=min_time_s,
        memory=memory,
    )


def _tasks() -> Dict[str, Callable[..., Dict[str, Any]]]:
    from .gpu import placement
    from .images import fused_per_sample, jpeg_folder, jpeg_per_sample, jpeg_records
    from .micro import stacking

    def records(folder: str, n: int) -> Dict[str, Any]:
        return {"rec_path": jpeg_records(folder, n)}

    def folders(folder: str, n: int) -> Dict[str, Any]:
        return {"folder": jpeg_folder(folder, n)}

    return {
        "stacking": stacking,
        "jpeg_per_sample": jpeg_per_sample,
        "fused_per_sample": fused_per_sample,
        "jpeg_records": records,
        "jpeg_folder": folders,
        "placement": placement,
    }


def _isolated_main(
    case_dict: Dict[str, Any], min_time_s: float, conn: Any, memory: bool = True
) -> None:
    import multiprocessing

    # Its own process group, so a timeout can kill its workers with it, in the caller's
    # session: scheduled with what the caller runs (benchmarks/background.py, "Sessions").
    os.setpgid(0, 0)
    # A child of the fork server inherits "forkserver" as its default start method; a user's
    # main process on Linux has "fork", which is what Gluon's Pool (and torch) then use.
    multiprocessing.set_start_method("fork", force=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = run_case(case_dict, min_time_s, memory)
        t = os.times()  # the loader is closed: its workers have been reaped and count here
        result["tree_cpu_s"] = t.user + t.system + t.children_user + t.children_system
        # Recorded, not printed: e.g. torch's advice about num_workers on a 2-core machine.
        result["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    except BaseException as exc:
        tail = traceback.format_exc().strip().splitlines()[-12:]
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": tail}
    conn.send(result)
    conn.close()


def _fork_context() -> Any:
    global _context
    if _context is None:
        import multiprocessing

        ctx = multiprocessing.get_context("forkserver")
        # Has no effect if this process's fork server already runs (then each child
        # imports what it needs itself, still before anything is measured).
        ctx.set_forkserver_preload(_PRELOAD)
        _context = ctx
    return _context


def run_isolated(
    case_dict: Dict[str, Any],
    *,
    min_time_s: float = _MIN_TIMED_S,
    timeout_s: float = 180.0,
    memory: bool = True,
) -> Dict[str, Any]:
    """Run :func:`run_case` in a fresh process; never raises for the loader's failures.
    ``memory``: sample the peak memory (see :func:`time_loader`).

    The process is forked from a fork server that has imported MXNet and the loaders but
    never run a loader, so no run inherits another's allocator state, pools or threads.
    Returns the result dict, or one with ``error`` when the run raised, died, or outlived
    ``timeout_s`` (its whole process group is then killed). As with any start method but
    ``fork``, the calling script must keep its work under ``if __name__ == "__main__":``.
    """
    ctx = _fork_context()
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_isolated_main, args=(case_dict, min_time_s, send, memory))
    started = time.perf_counter()
    cpu_before = _busy_cpu_s()
    proc.start()  # not a daemon: daemonic processes may not start the loaders' workers
    send.close()
    result: Dict[str, Any]
    try:
        if recv.poll(timeout_s):
            result = recv.recv()
        else:
            result = {"error": f"timed out after {timeout_s:.0f} s"}
    except (EOFError, OSError):
        proc.join(_KILL_GRACE_S)
        result = {"error": f"the measuring process died (exit code {proc.exitcode})"}
    except BaseException:  # Ctrl-C or SIGTERM of the benchmark: take the run down with it
        _kill_group(proc.pid)
        raise
    finally:
        recv.close()
    proc.join(_KILL_GRACE_S)
    wall = time.perf_counter() - started
    if "tree_cpu_s" in result:
        # Cores kept busy by other processes meanwhile: the noise this run was measured in.
        result["foreign_cores"] = max(0.0, _busy_cpu_s() - cpu_before - result["tree_cpu_s"]) / wall
    if proc.is_alive() or "timed out" in str(result.get("error", "")):
        _kill_group(proc.pid)
    elif group_alive(proc.pid, _LEFTOVER_GRACE_S):
        # The run returned but left processes behind (workers that outlived their loader).
        result["leftover_processes"] = True
        _kill_group(proc.pid)
    result["process_s"] = time.perf_counter() - started
    return result


def _busy_cpu_s() -> float:
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def group_alive(pgid: int, wait_s: float = 0.0) -> bool:
    """Whether process group ``pgid`` still has a process after waiting up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.02)


def _kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if not group_alive(pgid, _KILL_GRACE_S):
            return


def _main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.harness",
        description="Measure one benchmark case in this process and print the result.",
    )
    parser.add_argument(
        "case", help='the Case as JSON, e.g. \'{"workload": "W1", "loader": "ours"}\''
    )
    parser.add_argument("--min-time-s", type=float, default=_MIN_TIMED_S)
    args = parser.parse_args(argv)
    print(json.dumps(run_case(json.loads(args.case), min_time_s=args.min_time_s), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
