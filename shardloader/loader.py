"""``ShardedDataLoader``: Gluon's DataLoader signature over shardloader's data path.

    batch sampler --(seq, indices)--> pool --> reorder buffer --> pin/device --> user

This module holds the arguments, the epoch bookkeeping (epoch number, batches handed out,
prestarted epochs) and checkpoints. ``_pipeline`` puts the stages together; each stage lives
in its own module (docs/design.md, "The data path").
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional

from mxnet.gluon.data import DataLoader as _GluonDataLoader

from . import _checkpoint
from . import batchify as _batchify
from ._compat import MX2, gluon_positional_order
from ._engine import interrupts as _interrupts
from ._engine import options as _options
from ._engine.device import check_shards_fit
from ._engine.epoch import LoaderEpoch
from ._engine.gluon_cpp import cpp_pipeline
from ._engine.stats import Stats
from ._errors import ClosedIteratorError
from ._pipeline import Pipeline, build_batch_sampler
from ._validate import check_int
from .recordio import thread_safe

__all__ = ["ShardedDataLoader", "DataLoader"]


class ShardedDataLoader(_GluonDataLoader):
    """Loads mini-batches from a dataset, with Gluon's ``DataLoader`` signature.

    Code written for ``mxnet.gluon.data.DataLoader`` (1.9.1's or 2.x's) runs unchanged and
    gets the same batches in the same order. The positional parameters are those of the
    installed MXNet's Gluon: under MXNet 2.x the 14th is ``try_nopython`` and
    ``auto_reload`` is keyword-only. It *is* a Gluon ``DataLoader``
    (``isinstance`` holds, so ``Estimator`` accepts it), with Gluon's private attributes
    (``_dataset``, ``_batch_sampler``, ``_pin_memory``, ...) for code that reads them.
    Beyond Gluon it never hangs (dead workers and timeouts become errors within seconds),
    never leaks shared memory, yields per-device shards whose steps are always full, and
    can checkpoint and resume in the middle of an epoch.

    Parameters
    ----------
    dataset : Dataset
        Anything with ``__len__`` and ``__getitem__`` (a Gluon ``Dataset``, a numpy array,
        an NDArray, a list).
    batch_size : int
        Samples per batch. Required unless ``batch_sampler`` is given.
    shuffle : bool, default False
        Shuffle the samples every epoch (seeded by ``seed`` and the epoch number).
    sampler : Sampler
        Yields sample indices. Not together with ``shuffle``.
    last_batch : {'keep', 'discard', 'rollover'}, default 'keep'
        What to do with an incomplete last batch (and, with ``num_shards``, an incomplete
        last group of shards).
    batch_sampler : Sampler
        Yields lists of indices (a batch) or lists of lists of indices (a sharded step: one
        batch per shard). Not together with ``batch_size``, ``shuffle``, ``sampler`` or
        ``last_batch``.
    batchify_fn : callable
        Merges a list of samples into a batch. Defaults to the installed Gluon's default:
        ``shardloader.batchify.default_batchify_fn`` under MXNet 1.x; under 2.x, 2.x's
        ``batchify.Stack()``, which also splits list samples into fields. Gluon's own
        batchify functions run as shardloader's equivalents (``batchify.gluon_equivalent``).
    num_workers : int, default 0
        Worker processes (or threads, with ``thread_pool``). 0 loads in the calling thread.
    pin_memory : bool, default False
        Return batches in ``mx.cpu_pinned(pin_device_id)``, copied as the loop receives them
        (a plain memcpy for host memory; Gluon copies there too).
    pin_device_id : int, default 0
        The device id of the pinned memory.
    prefetch : int, optional
        Batches in flight ahead of the consumer; defaults to 2 * num_workers. 0 is valid
        (one batch is still loaded when the consumer asks for it).
    thread_pool : bool, default False
        Use threads instead of processes.
    timeout : float or None, default 120
        Seconds a batch may take before ``shardloader.LoaderTimeoutError``.
    auto_reload : bool, default False
        Start loading the next epoch as soon as the current one ends (and at construction).
    try_nopython : bool, optional
        MXNet 2.x's switch to its C++ pipeline. ``None`` and ``False``: shardloader's own
        workers, with the batches of Gluon's Python pipeline. ``True`` with ``num_workers >
        0``, under MXNet 2.x: Gluon's C++ pipeline loads the batches where Gluon can use it
        (else Gluon's ``RuntimeError``), and options it cannot honour raise ``ValueError``.
        Under MXNet 1.x, ``True`` raises ``ValueError``: 1.x has no C++ pipeline.
    seed : int, optional
        Makes the batch order a pure function of ``(seed, epoch)``. Before every sample is
        loaded, ``random`` and ``numpy.random`` are seeded from ``(seed, epoch, sample
        index)``, and MXNet's RNG once per batch from ``(seed, epoch, batch)`` (reseeding
        MXNet costs about a millisecond), so random augmentation is reproducible for any
        ``num_workers`` and pool type.
    mxnet_seed : {'batch', 'sample'}, default 'batch'
        With ``seed``: reseed MXNet's RNG once per batch, or before every sample as well
        (then a sample's MXNet draws do not depend on its batch, at about 1 ms per sample).
    num_shards : int, default 0
        Group every ``num_shards`` batches into one step (a list of batches, one per shard).
    num_parts : int, default 1
        Split every epoch into this many disjoint parts (one per machine in distributed
        training: ``num_parts=kv.num_workers``).
    part_index : int, default 0
        The part this loader reads (``part_index=kv.rank``).
    even_size : bool, default False
        Give every part the same number of samples (see ``PartitionSampler``).
    worker_init_fn : callable, optional
        Called as ``worker_init_fn(worker_id)`` in each worker, after seeding.
    start_method : {'fork', 'forkserver', 'spawn'}, default 'fork' on Linux
        How worker processes start.
    ctx : Context or list of Context, optional
        Place each batch on ``ctx``, or shard ``i`` of each step on ``ctx[i]``, on a
        background thread, so the step the user receives is already on its devices.
    device : Device or list of Device, optional
        MXNet 2.x's name for ``ctx``; give one of the two.
    on_worker_death : {'raise', 'restart'}, default 'raise'
        When a worker process dies: raise ``shardloader.WorkerDiedError``, or start a
        new worker, re-send its lost batches and finish the epoch with nothing lost.

    Examples
    --------
    >>> import numpy as np
    >>> from mxnet.gluon.data import ArrayDataset
    >>> data = ArrayDataset(np.arange(10, dtype="float32"), np.arange(10) % 2)
    >>> loader = ShardedDataLoader(data, batch_size=4, last_batch="discard")
    >>> [x.asnumpy().tolist() for x, y in loader]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    """

    @gluon_positional_order
    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = None,
        shuffle: bool = False,
        sampler: Any = None,
        last_batch: Optional[str] = None,
        batch_sampler: Any = None,
        batchify_fn: Optional[Callable] = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        pin_device_id: int = 0,
        prefetch: Optional[int] = None,
        thread_pool: bool = False,
        timeout: Optional[float] = 120,
        auto_reload: bool = False,
        try_nopython: Optional[bool] = None,
        *,
        seed: Optional[int] = None,
        mxnet_seed: str = "batch",
        num_shards: int = 0,
        num_parts: int = 1,
        part_index: int = 0,
        even_size: bool = False,
        worker_init_fn: Optional[Callable] = None,
        start_method: Optional[str] = None,
        ctx: Any = None,
        on_worker_death: str = "raise",
        device: Any = None,
    ) -> None:
        # Every parameter but the dataset, as given, validated in one place (options).
        arguments = {k: v for k, v in locals().items() if k not in ("self", "dataset")}
        opts = self._opts = _options.validate(**arguments)
        self._length = _options.check_dataset(dataset)
        self._dataset = dataset
        if opts.thread_pool and opts.num_workers > 0:
            self._dataset = thread_safe(dataset)  # Gluon's record datasets share one handle
        self._stats = Stats()
        self._batch_sampler = build_batch_sampler(opts, self._length, sampler, batch_sampler)
        watch = getattr(self._batch_sampler, "_watch_repeats", None)
        if callable(watch):
            watch(self, "_stats")  # samples repeated to fill a step go to stats()
        cpp = self._set_batchify(batchify_fn, dataset, sampler, batch_sampler, start_method)
        _interrupts.install()
        self._pipeline = Pipeline(
            opts, self._dataset, self._length, self._batch_fn, self._stats, cpp
        )
        check_shards_fit(self._pipeline.ctx, opts.num_shards, self._batch_sampler, opts.ctx_name)
        self._closed = False
        self._next_epoch = 0
        self._resume: Optional[Dict[str, Any]] = None
        # Where the epoch being consumed stands: for state_dict().
        self._position: Dict[str, Any] = {
            "epoch": 0,
            "consumed": 0,
            "sampler": _checkpoint.sampler_state(self._batch_sampler),
        }
        self._prestarted: Optional[LoaderEpoch] = None
        self._open: weakref.WeakSet[LoaderEpoch] = weakref.WeakSet()
        if opts.auto_reload:
            self._prestarted = self._start_epoch()

    def _set_batchify(self, batchify_fn, dataset, sampler, batch_sampler, start_method):
        """Sets Gluon's ``_batchify_fn`` and what the workers run; MXNet 2.x's C++ pipeline
        where ``try_nopython=True`` asks for it and Gluon can use it, else None."""
        if batchify_fn is None:
            # Gluon's default: default_batchify_fn in MXNet 1.x, batchify.Stack() in 2.x,
            # which splits list samples into fields as it does tuples.
            batchify_fn = _batchify._FieldStack() if MX2 else _batchify.default_batchify_fn
        self._batchify_fn = batchify_fn
        # What the workers run: Gluon's own batchify functions swapped for ours.
        self._batch_fn = _batchify.gluon_equivalent(batchify_fn)
        return cpp_pipeline(
            self._opts,
            dataset,
            sampler,
            batch_sampler,
            batchify_fn,
            start_method,
            default_batchify=isinstance(batchify_fn, _batchify._FieldStack),
        )

    # ------------------------------------------------------------------ epochs
    def _start_epoch(self) -> LoaderEpoch:
        if self._closed:
            raise ClosedIteratorError("Trying to iterate a closed ShardedDataLoader")
        epoch, skip, sampler_state = self._next_epoch, 0, None
        if self._resume is not None:
            epoch, skip = self._resume["epoch"], self._resume["consumed"]
            sampler_state = self._resume["sampler"]
            self._resume = None
        self._next_epoch = epoch + 1
        bs = self._batch_sampler
        if sampler_state is not None and hasattr(bs, "load_state_dict"):
            bs.load_state_dict(sampler_state)
        if hasattr(bs, "set_epoch"):
            bs.set_epoch(epoch)
        start_state = _checkpoint.sampler_state(bs)
        source = self._pipeline.open(itertools.islice(enumerate(bs), skip, None), epoch, skip)
        pin = self._pipeline.pin
        it = LoaderEpoch(self, source, epoch, skip, start_state, pin, self._stats)
        self._open.add(it)
        return it

    def __iter__(self) -> Iterator[Any]:
        it, self._prestarted = self._prestarted, None
        if it is None:
            it = self._start_epoch()
        self._position = {"epoch": it.epoch, "consumed": it.consumed, "sampler": it.start_state}
        return it

    def _batch_consumed(self, it: LoaderEpoch) -> None:
        if self._position.get("epoch") == it.epoch:
            self._position["consumed"] = it.consumed

    def _epoch_finished(self, it: LoaderEpoch) -> None:
        self._position = {
            "epoch": it.epoch + 1,
            "consumed": 0,
            "sampler": _checkpoint.sampler_state(self._batch_sampler),
        }
        if self._opts.auto_reload and self._prestarted is None and not self._closed:
            self._prestarted = self._start_epoch()

    def refresh(self) -> None:
        """Start loading the next epoch now (Gluon 1.9.1's name); ``iter()`` then uses it."""
        if self._prestarted is None:
            self._prestarted = self._start_epoch()

    def clean(self) -> None:
        """Drop an epoch started by ``refresh()`` or ``auto_reload`` (Gluon 1.9.1's name)."""
        if self._prestarted is not None:
            self._prestarted.close()
            self._prestarted = None
            self._next_epoch -= 1  # the dropped epoch was never handed out

    def __len__(self) -> int:
        return len(self._batch_sampler)

    @property
    def batch_size(self) -> Optional[int]:
        """Samples per batch (per shard with ``num_shards``); None with a ``batch_sampler``."""
        return self._opts.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run epoch ``epoch`` (later ones follow from it)."""
        self._next_epoch = check_int("epoch", epoch)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> Dict[str, Any]:
        """Where the current epoch stands, as a small JSON-serialisable dict.

        Batches already prefetched but not handed to the user are not counted.
        """
        self._refuse_with_cpp("state_dict()")
        return {
            "version": _checkpoint.STATE_VERSION,
            "epoch": self._position["epoch"],
            "consumed": self._position["consumed"],
            "sampler": self._position["sampler"],
            "seed": self._opts.seed,
            "dataset_len": self._length,
            "batch_size": self._opts.batch_size,
            "sampler_type": type(self._batch_sampler).__name__,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Make the next ``iter()`` yield exactly the batches that remained in ``state``'s
        epoch, then continue with the following epochs as an uninterrupted run would.

        Raises
        ------
        ValueError
            If ``state`` is not a state from ``state_dict()`` of a loader built like this one:
            a field missing, of the wrong type or out of range (``consumed`` beyond the
            batches of its epoch, say), or another dataset length, ``batch_size``, ``seed``
            or batch sampler. The message names the field. Every field is checked before
            anything changes, so a refused state leaves the loader as it was.
        """
        self._refuse_with_cpp("load_state_dict()")
        resume = _checkpoint.check_state(
            state, self.state_dict(), self._batch_sampler, self._length
        )
        if self._prestarted is not None:
            self._prestarted.close()
            self._prestarted = None
        self._resume = resume
        self._position = dict(resume)
        self._next_epoch = resume["epoch"]

    def _refuse_with_cpp(self, what: str) -> None:
        if self._pipeline.cpp is not None:
            raise RuntimeError(
                f"{what} needs shardloader's own pipeline: with try_nopython=True this loader's "
                "batches come from MXNet's C++ pipeline, whose order shardloader can neither "
                "record nor replay; use try_nopython=None to checkpoint mid-epoch"
            )

    # ------------------------------------------------------------------ stats & lifecycle
    def stats(self) -> Dict[str, Any]:
        """Batches and bytes delivered, time the consumer waited for data and its share of
        wall-clock time (``data_stall``), per-worker busy time, the reorder depth, and
        ``repeated_samples``: how many samples the batch sampler repeated to give a last step
        ``num_shards`` shards (or, with ``FixedBucketSampler(last_group='pad')``, to pad it),
        counted as the step is sent to be loaded."""
        return self._stats.snapshot()

    def reset_stats(self) -> None:
        self._stats.reset()

    def close(self) -> None:
        """Stop every open epoch and the workers, and release all shared memory.
        Idempotent; iterating afterwards raises ``ClosedIteratorError``."""
        self._closed = True
        for it in list(self._open):
            it.close()
        self._prestarted = None
        self._pipeline.close()

    def __enter__(self) -> ShardedDataLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Gluon's DataLoader attributes, which its subclasses and tools built on it (gluoncv,
    # gluon-nlp) read: the same names, with Gluon's meaning. ``_worker_pool`` is None
    # because there is no multiprocessing.Pool to terminate (Gluon's ``__del__`` checks it).
    _worker_pool = None
    _num_workers = property(lambda self: self._opts.num_workers)
    _pin_memory = property(lambda self: self._opts.pin_memory)
    _pin_device_id = property(lambda self: self._opts.pin_device_id)
    _thread_pool = property(lambda self: self._opts.thread_pool)
    _timeout = property(lambda self: self._opts.timeout)
    _prefetch = property(lambda self: self._opts.prefetch)
    _iter = property(lambda self: self._prestarted)
    auto_reload = property(lambda self: self._opts.auto_reload)
    # MXNet 2.x's: Gluon's C++ pipeline where try_nopython=True uses it, else None.
    _mx_iter = property(lambda self: self._pipeline.cpp)

    def worker_pids(self) -> List[int]:
        """PIDs of the live worker processes (empty for inline or thread workers)."""
        return self._pipeline.worker_pids()


DataLoader = ShardedDataLoader
