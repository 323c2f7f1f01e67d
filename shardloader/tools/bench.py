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
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import inspect
import itertools
import os
import sys
import threading
import time
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

from .bench_report import LOADERS, format_table, plot, recommend

__all__ = ["BenchError", "PeakRSS", "resolve_factory", "measure", "run"]

_MB = 1024.0 * 1024.0
_RSS_INTERVAL_S = 0.02
_DEFAULT_BATCHES = 100
_WARMUP_BATCHES = 3


class BenchError(Exception):
    """A problem with the command's input: printed as a usage error, without a traceback."""


# ------------------------------------------------------------------------------ the dataset
def resolve_factory(spec: str) -> Any:
    """The object that ``'package.module:name'`` or ``'path/to/file.py:name'`` names.

    Parameters
    ----------
    spec : str
        A module path importable from the current directory, or a Python file, then a colon
        and an attribute name (dots allowed, as in ``'module:Class.create'``).

    Returns
    -------
    object
        The attribute: a dataset factory, or a dataset.

    Raises
    ------
    BenchError
        If the module, the file or the attribute cannot be found.
    """
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise BenchError(
            f"--dataset must look like 'package.module:factory' or 'path/to/file.py:factory', "
            f"got {spec!r}"
        )
    if target.endswith(".py") or os.sep in target:
        module = _load_file(target)
    else:
        # As `python -m` does, so a module next to the user's working directory imports.
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise BenchError(f"--dataset: cannot import module {target!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise BenchError(f"--dataset: {target!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _load_file(path: str) -> Any:
    if not os.path.isfile(path):
        raise BenchError(f"--dataset: no such file {path!r}")
    name = os.path.splitext(os.path.basename(path))[0]
    if name in sys.modules:
        name = f"_shardloader_bench_{name}"
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
    if spec is None or spec.loader is None:
        raise BenchError(f"--dataset: cannot load {path!r} as Python")
    module = importlib.util.module_from_spec(spec)
    # Registered, and its folder importable, so its classes pickle for spawn workers.
    sys.modules[name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    return module


# The image pipeline of ``--recordio``: ImageNet's channel statistics, as most users write.
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)
_DEFAULT_CROP = 224


def image_pipeline(rec_path: str, crop: int = _DEFAULT_CROP) -> Any:
    """Gluon's ``ImageRecordDataset`` over ``rec_path`` with the training augmentation most
    Gluon image models use: ``RandomResizedCrop(crop)``, ``RandomFlipLeftRight()``,
    ``ToTensor()``, ``Normalize(mean, std)`` (ImageNet's), applied with ``transform_first``.
    Samples are ``(float32 3 x crop x crop NDArray, label)``."""
    from mxnet.gluon.data.vision import ImageRecordDataset
    from mxnet.gluon.data.vision import transforms as T

    augment = T.Compose(
        [
            T.RandomResizedCrop(crop),
            T.RandomFlipLeftRight(),
            T.ToTensor(),
            T.Normalize(_MEAN, _STD),
        ]
    )
    return ImageRecordDataset(rec_path).transform_first(augment)


def _check_record_files(rec_path: str) -> str:
    """The index path of ``rec_path``, or a BenchError saying what is missing."""
    if os.path.isdir(rec_path):
        raise BenchError(f"--recordio: {rec_path!r} is a directory, not a .rec file")
    if not os.path.isfile(rec_path):
        raise BenchError(f"--recordio: no such file {rec_path!r}")
    idx_path = os.path.splitext(rec_path)[0] + ".idx"
    if not os.path.isfile(idx_path):
        raise BenchError(
            f"--recordio: no index {idx_path!r} next to {rec_path!r}. The benchmark reads "
            "images at random positions, which needs the index; write the records with one "
            "(mx.recordio.MXIndexedRecordIO, im2rec, or shardloader.recordio.pack_images)"
        )
    if os.path.getsize(idx_path) == 0:
        raise BenchError(f"--recordio: the index {idx_path!r} is empty")
    return idx_path


def _first_sample(dataset: Any, rec_path: str, what: str) -> None:
    """Load sample 0 once, so that a file that is not what it should be fails here, in one
    line, and not inside a worker."""
    try:
        sample = dataset[0]
        first = sample[0] if isinstance(sample, (tuple, list)) else sample
        wait = getattr(first, "wait_to_read", None)
        if wait is not None:
            wait()
    except Exception as exc:  # noqa: BLE001 - any failure here is the file's
        raise BenchError(
            f"--recordio: cannot read record 0 of {rec_path!r} as {what}: {_one_line(exc)}"
        ) from None


def _one_line(exc: BaseException) -> str:
    """``Type: last line of the message`` (MXNet's errors carry a C++ trace; the last line
    says what failed, and often starts with the type's name already)."""
    name = type(exc).__name__
    last = (str(exc).strip().splitlines() or [""])[-1].strip()
    while last.startswith(name + ":"):
        last = last[len(name) + 1 :].strip()
    return f"{name}: {last}" if last else name


def _load_dataset(args: argparse.Namespace) -> Tuple[Any, str, Optional[Callable]]:
    """The dataset, a description of it, and the batchify function both loaders get."""
    if args.recordio:
        from ..recordio import ImageRecordDataset, RecordDataset

        _check_record_files(args.recordio)
        if args.raw:
            from ..batchify import List as ListBatchify

            return RecordDataset(args.recordio), f"raw records of {args.recordio}", ListBatchify()
        if getattr(args, "no_transform", False):
            dataset = ImageRecordDataset(args.recordio)
            _first_sample(dataset, args.recordio, "an image")
            return dataset, f"decoded images of {args.recordio}", None
        crop = getattr(args, "crop_size", None) or _DEFAULT_CROP
        dataset = image_pipeline(args.recordio, crop)
        _first_sample(dataset, args.recordio, "an image")
        described = (
            f"{args.recordio} through Gluon's ImageRecordDataset + RandomResizedCrop({crop}), "
            f"RandomFlipLeftRight, ToTensor, Normalize"
        )
        return dataset, described, None
    made = resolve_factory(args.dataset)
    if callable(made):
        _check_no_arguments(made, args.dataset)
        made = made()
    dataset = made
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise BenchError(
            f"--dataset {args.dataset} returned {type(dataset).__name__}, which is not a "
            f"dataset (it needs __len__ and __getitem__)"
        )
    return dataset, f"{type(dataset).__name__} from {args.dataset}", None


def _check_no_arguments(factory: Callable, spec: str) -> None:
    try:
        inspect.signature(factory).bind()
    except TypeError as exc:
        raise BenchError(
            f"--dataset {spec}: the factory is called without arguments, but {exc}; wrap it "
            f"in a function that takes none"
        ) from None
    except ValueError:  # no signature (some builtins): just try the call
        pass


# ------------------------------------------------------------------------------ measuring
class PeakRSS:
    """Peak resident memory of this process and its workers during a ``with`` block."""

    def __init__(self) -> None:
        try:
            import psutil
        except ImportError:
            psutil = None
        self._psutil = psutil
        if psutil is not None:
            self.method = "psutil: this process + its workers, sampled every 20 ms"
        else:
            self.method = (
                "resource.getrusage (psutil is not installed): lifetime peak of this process "
                "+ largest finished child"
            )
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _sample(self) -> None:
        me = self._psutil.Process()
        total = 0
        try:
            procs = [me] + me.children(recursive=True)
        except self._psutil.Error:
            procs = [me]
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except self._psutil.Error:  # exited between listing and reading
                continue
        self.peak_mb = max(self.peak_mb, total / _MB)

    def _loop(self) -> None:
        while not self._stop.wait(_RSS_INTERVAL_S):
            self._sample()

    def __enter__(self) -> PeakRSS:
        self.peak_mb = 0.0
        if self._psutil is not None:
            self._sample()
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="bench-rss", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()
            return
        import resource

        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        self.peak_mb = (own + kids) / 1024.0  # kilobytes on Linux


def touch(batch: Any) -> int:
    """Wait until every NDArray in ``batch`` is readable; return the bytes the batch holds."""
    if isinstance(batch, (list, tuple)):
        return sum(touch(item) for item in batch)
    if isinstance(batch, dict):
        return sum(touch(item) for item in batch.values())
    wait = getattr(batch, "wait_to_read", None)
    if wait is not None:
        import numpy as np

        wait()
        return int(batch.size) * np.dtype(batch.dtype).itemsize
    if isinstance(batch, (bytes, bytearray)):
        return len(batch)
    return int(getattr(batch, "nbytes", 0))


def count_samples(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first array, or its length."""
    node = batch
    while True:
        if hasattr(node, "shape") and len(node.shape) > 0:
            return int(node.shape[0])
        if isinstance(node, dict) and node:
            node = next(iter(node.values()))
        elif (
            isinstance(node, (list, tuple))
            and node
            and (isinstance(node[0], (list, tuple, dict)) or hasattr(node[0], "shape"))
        ):
            node = node[0]
        else:
            return len(node) if isinstance(node, (list, tuple)) else 1


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if close is not None:
        close()


def measure(
    make: Callable[[], Any],
    batches: Optional[int],
    epochs: Optional[int],
    step_s: float = 0.0,
    rss: Optional[PeakRSS] = None,
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
    rss : PeakRSS, optional
        Tracks the peak memory of the run.
    progress : callable, optional
        Called with 1 after every batch (a progress bar's ``update``).

    Returns
    -------
    dict
        ``samples_per_s``, ``stall``, ``first_batch_s``, ``peak_rss_mb``, ``batches``,
        ``samples`` and ``batch_bytes`` (the mean bytes of a batch).
    """
    rss = rss or PeakRSS()
    with rss:
        start = time.perf_counter()
        loader = make()
        try:
            counts = _read(loader, batches, epochs, step_s, start, progress)
        finally:
            _close(loader)
            del loader
            gc.collect()  # Gluon's DataLoader ends its pool in __del__
    counts["peak_rss_mb"] = rss.peak_mb
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


# ------------------------------------------------------------------------------ the command
def _shuffled(args: argparse.Namespace) -> bool:
    """``--shuffle``, or the ``--recordio`` image pipeline, which trains shuffled."""
    pipeline = bool(args.recordio) and not args.raw and not getattr(args, "no_transform", False)
    return bool(args.shuffle) or pipeline


def _factories(dataset, batchify_fn, args) -> Dict[str, Callable[[int], Any]]:
    from mxnet import gluon

    from .. import ShardedDataLoader

    common = dict(batch_size=args.batch_size, shuffle=_shuffled(args), thread_pool=args.thread_pool)
    if batchify_fn is not None:
        common["batchify_fn"] = batchify_fn
    return {
        "shardloader": lambda w: ShardedDataLoader(dataset, num_workers=w, **common),
        "gluon": lambda w: gluon.data.DataLoader(dataset, num_workers=w, **common),
    }


def _measure_one(makers, name: str, workers: int, args, batches, rss, progress=None) -> Dict:
    """One run; a loader that fails on the dataset gives a row with ``error`` (Gluon's record
    datasets, for one, may fail under thread workers), any other problem raises."""
    try:
        return measure(
            partial(makers[name], workers),
            batches,
            args.epochs,
            args.step_ms / 1e3,
            rss,
            progress,
        )
    except BenchError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return {"error": _one_line(exc)[:200]}


def _median_run(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
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


def _planned_batches(dataset_len: int, args: argparse.Namespace, batches) -> Optional[int]:
    if batches is not None:
        per_run = batches
    else:
        per_run = args.epochs * max(1, -(-dataset_len // args.batch_size))
    return per_run * len(args.workers) * len(LOADERS) * args.repeat


def _measure_all(makers, args: argparse.Namespace, batches: Optional[int], total=None) -> List:
    """One row per (workers, loader): the two loaders interleaved, ``--repeat`` rounds."""
    rss = PeakRSS()
    print(f"peak RSS by {rss.method}", flush=True)
    # Untimed: fills the page cache and runs one-time imports before the first timed row.
    for name, make in makers.items():
        try:
            measure(partial(make, 0), _WARMUP_BATCHES, None)
        except Exception as exc:
            if name == "shardloader":
                raise BenchError(f"shardloader failed on this dataset: {_one_line(exc)}") from exc
            # Gluon's own failure shows in its rows.
    runs: Dict[Tuple[int, str], List[Dict[str, Any]]] = {}
    with _progress_bar(total, getattr(args, "progress", None)) as bar:
        for _ in range(args.repeat):
            for i, workers in enumerate(args.workers):
                # Alternate which loader goes first, so neither always inherits a warmer
                # machine.
                for name in LOADERS if i % 2 == 0 else LOADERS[::-1]:
                    bar.set_postfix_str(f"{name}, num_workers={workers}", refresh=False)
                    result = _measure_one(makers, name, workers, args, batches, rss, bar.update)
                    runs.setdefault((workers, name), []).append(result)
    rows = [
        {"loader": name, "workers": workers, **_median_run(results)}
        for (workers, name), results in runs.items()
    ]
    rows.sort(key=lambda r: (r["workers"], LOADERS.index(r["loader"])))
    ours = [r for r in rows if r["loader"] == "shardloader"]
    if all("error" in r for r in ours):
        raise BenchError(f"shardloader failed on this dataset: {ours[0]['error']}")
    return rows


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
    dataset, described, batchify_fn = _load_dataset(args)
    batches = None if args.epochs else (args.batches or _DEFAULT_BATCHES)
    amount = f"{args.epochs} epoch(s)" if args.epochs else f"{batches} batches"
    pool = "threads" if args.thread_pool else "processes"
    step = ", shuffled" if _shuffled(args) else ""
    step += f", {args.step_ms:g} ms simulated step" if args.step_ms else ""
    if args.repeat > 1:
        step += f", the median of {args.repeat} runs per row"
    print(
        f"shardloader bench: {described}, {len(dataset):,} samples, batch size "
        f"{args.batch_size}, {amount} per run, workers are {pool}{step}"
    )
    total = _planned_batches(len(dataset), args, batches)
    rows = _measure_all(_factories(dataset, batchify_fn, args), args, batches, total)
    _report(rows, args)
    if args.plot:
        plot(rows, args.plot, f"{described}, batch {args.batch_size}")
        print(f"plot saved to {args.plot}")
    return 0
