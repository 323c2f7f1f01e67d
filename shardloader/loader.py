"""``ShardedDataLoader``: Gluon's DataLoader signature over shardloader's data path.

    batch sampler --(seq, indices)--> pool --> reorder buffer --> pin/device --> user

This module wires the stages together and keeps the per-epoch bookkeeping (epoch number,
batches handed out, stats, checkpoint state). The stages live in their own modules.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import multiprocessing as mp
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from mxnet.gluon.data import DataLoader as _GluonDataLoader

from . import batchify as _batchify
from ._compat import MX2
from ._engine import interrupts as _interrupts
from ._engine import options as _options
from ._engine.device import pin
from ._engine.epoch import Hub, InlineEpoch, PooledEpoch, Stats
from ._engine.ipc.alloc import numpy_flags
from ._engine.pools import ProcessPool, ThreadPool
from ._engine.worker import BatchMaker, is_sharded
from ._errors import ClosedIteratorError
from ._validate import check_int
from .sampler import (
    BatchSampler,
    PartitionSampler,
    RandomSampler,
    SequentialSampler,
    ShardGroupSampler,
)

__all__ = ["ShardedDataLoader", "DataLoader"]

_STATE_VERSION = 1
# The fields of ShardedDataLoader.state_dict(), all required by load_state_dict().
_STATE_KEYS = (
    "version",
    "epoch",
    "consumed",
    "sampler",
    "seed",
    "dataset_len",
    "batch_size",
    "sampler_type",
)


def _gluon_positional_order(init: Callable) -> Callable:
    """``init`` with the positional parameters of the installed MXNet's Gluon DataLoader.

    ``ShardedDataLoader.__init__`` is written with MXNet 1.x's order, whose 14th parameter is
    ``auto_reload``. MXNet 2.x's Gluon has no ``auto_reload`` and its 14th parameter is
    ``try_nopython``; there ``auto_reload`` becomes keyword-only, so that a positional call
    written for either version's Gluon means the same here.
    """
    if not MX2:
        return init
    signature = inspect.signature(init)
    params = [p for p in signature.parameters.values() if p.name != "auto_reload"]
    first_keyword = next(i for i, p in enumerate(params) if p.kind is p.KEYWORD_ONLY)
    moved = signature.parameters["auto_reload"].replace(kind=inspect.Parameter.KEYWORD_ONLY)
    params.insert(first_keyword, moved)
    gluon_order = signature.replace(parameters=params)

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        arguments = gluon_order.bind(self, *args, **kwargs).arguments
        arguments.pop("self")
        init(self, **arguments)

    __init__.__signature__ = gluon_order  # type: ignore[attr-defined]
    return __init__


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

    @_gluon_positional_order
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
        opts = _options.validate(
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            last_batch=last_batch,
            batch_sampler=batch_sampler,
            batchify_fn=batchify_fn,
            num_workers=num_workers,
            pin_memory=pin_memory,
            pin_device_id=pin_device_id,
            prefetch=prefetch,
            thread_pool=thread_pool,
            timeout=timeout,
            auto_reload=auto_reload,
            try_nopython=try_nopython,
            seed=seed,
            mxnet_seed=mxnet_seed,
            num_shards=num_shards,
            num_parts=num_parts,
            part_index=part_index,
            even_size=even_size,
            worker_init_fn=worker_init_fn,
            start_method=start_method,
            ctx=ctx,
            on_worker_death=on_worker_death,
            device=device,
        )
        self._opts = opts
        self._dataset = dataset
        self._length = _options.check_dataset(dataset)
        if opts.thread_pool and opts.num_workers > 0:
            from .recordio import thread_safe  # Gluon's record datasets share one file handle

            self._dataset = thread_safe(dataset)
        if num_parts > 1 and shuffle and seed is None:
            raise ValueError(
                "num_parts > 1 with shuffle=True needs seed=<int>, so that every machine "
                "draws the same permutation and the parts stay disjoint"
            )
        self._batch_sampler = self._build_batch_sampler(sampler, batch_sampler)
        if batchify_fn is None:
            # Gluon's default: default_batchify_fn in MXNet 1.x, batchify.Stack() in 2.x,
            # which splits list samples into fields as it does tuples.
            batchify_fn = _batchify._FieldStack() if MX2 else _batchify.default_batchify_fn
        self._batchify_fn = batchify_fn
        # What the workers run: Gluon's own batchify functions swapped for ours.
        self._batch_fn = _batchify.gluon_equivalent(batchify_fn)
        # MXNet 2.x's C++ pipeline, when try_nopython=True asks for it and Gluon can use it.
        self._cpp = _cpp_pipeline(opts, dataset, sampler, batch_sampler, batchify_fn, start_method)
        _interrupts.install()
        # Like Gluon, workers take MXNet's numpy mode from when the loader was made; inline
        # loading follows the consuming thread's mode at each batch.
        self._numpy_flags = numpy_flags()
        self._ctx = _placement(opts)
        self._pin = _pin_context(opts)
        _check_shards_fit(self._ctx, opts.num_shards, self._batch_sampler, opts.ctx_name)
        self._stats = Stats()
        self._hub: Optional[Hub] = None
        self._closed = False
        self._next_epoch = 0
        self._resume: Optional[Dict[str, Any]] = None
        # Where the epoch being consumed stands: for state_dict().
        self._position: Dict[str, Any] = {
            "epoch": 0,
            "consumed": 0,
            "sampler": _sampler_state(self._batch_sampler),
        }
        self._prestarted: Optional[_EpochIterator] = None
        self._open: weakref.WeakSet[_EpochIterator] = weakref.WeakSet()
        if opts.auto_reload:
            self._prestarted = self._start_epoch()

    # ------------------------------------------------------------------ construction
    def _build_batch_sampler(self, sampler, batch_sampler):
        opts = self._opts
        if batch_sampler is None:
            if sampler is None:
                sampler = (
                    RandomSampler(self._length, seed=opts.seed)
                    if opts.shuffle
                    else SequentialSampler(self._length)
                )
            if opts.num_parts > 1:
                sampler = PartitionSampler(
                    sampler, opts.num_parts, opts.part_index, even_size=opts.even_size
                )
            batch_sampler = BatchSampler(sampler, opts.batch_size, opts.last_batch or "keep")
        elif opts.num_parts > 1:
            batch_sampler = PartitionSampler(
                batch_sampler, opts.num_parts, opts.part_index, even_size=opts.even_size
            )
        if opts.num_shards:
            # 'keep' gives every step num_shards shards, spreading a short tail over them.
            batch_sampler = ShardGroupSampler(
                batch_sampler, opts.num_shards, last_group=opts.last_batch or "keep"
            )
        watch = getattr(batch_sampler, "_watch_repeats", None)
        if callable(watch):
            watch(self, "_stats")  # samples repeated to fill a step go to stats()
        return batch_sampler

    def _get_hub(self) -> Hub:
        hub = self._hub
        if hub is not None and hub.broken is None and not hub.pool.closed:
            return hub
        if hub is not None:
            hub.pool.close()  # a dead or stuck worker: start over with a fresh pool
        opts = self._opts
        if not opts.thread_pool and mp.current_process().daemon:
            raise RuntimeError(
                "ShardedDataLoader(num_workers>0) cannot start worker processes here: this "
                "is a daemonic process (a worker of a loader or of a multiprocessing.Pool), "
                "and those may not have children. Inside a worker, use num_workers=0 or "
                "thread_pool=True."
            )
        pool_cls = ThreadPool if opts.thread_pool else ProcessPool
        pool = pool_cls(
            opts.num_workers,
            self._dataset,
            self._batch_fn,
            raw=_batchify.is_native(self._batch_fn),
            seed=opts.seed,
            worker_init_fn=opts.worker_init_fn,
            start_method=opts.start_method,
            mxnet_per_sample=opts.mxnet_seed == "sample",
            numpy_flags=self._numpy_flags,
        )
        self._hub = Hub(pool, opts.on_worker_death, self._stats)
        return self._hub

    # ------------------------------------------------------------------ epochs
    def _start_epoch(self) -> _EpochIterator:
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
        start_state = _sampler_state(bs)
        items = itertools.islice(enumerate(bs), skip, None)
        if isinstance(self._ctx, list):
            items = _require_steps(items, len(self._ctx), self._opts.ctx_name)
        opts = self._opts
        # An empty dataset has no batches (as in Gluon): no worker is started for it. A batch
        # sampler that yields an index anyway gets the usual IndexError, inline.
        if self._cpp is not None:
            source = iter(self._cpp)  # Gluon's C++ pipeline: it pins, and starts over, itself
        elif opts.num_workers == 0 or self._length == 0:
            source = InlineEpoch(items, self._inline_maker(epoch), self._stats)
        else:
            source = PooledEpoch(
                self._get_hub(), items, skip, epoch, opts.prefetch, opts.timeout, self._stats
            )
        if self._ctx is not None:
            from .prefetch import DevicePrefetcher

            source = DevicePrefetcher(self._ctx, buffer_size=max(1, opts.prefetch or 1)).prefetch(
                source
            )
        pin = None if self._cpp is not None else self._pin
        it = _EpochIterator(self, source, epoch, skip, start_state, pin)
        self._open.add(it)
        return it

    def _inline_maker(self, epoch: int) -> Callable[[Sequence], Any]:
        maker = BatchMaker(
            self._dataset,
            self._batch_fn,
            self._opts.seed,
            shared_process=True,
            mxnet_per_sample=self._opts.mxnet_seed == "sample",
            # With ctx, batches are made on the placement thread: give it the numpy mode of
            # the thread that started the epoch. Otherwise the consumer's own mode applies.
            numpy_flags=numpy_flags() if self._ctx is not None else None,
        )
        return lambda indices: maker.make(indices, epoch)

    def __iter__(self) -> Iterator[Any]:
        it, self._prestarted = self._prestarted, None
        if it is None:
            it = self._start_epoch()
        self._position = {"epoch": it.epoch, "consumed": it.consumed, "sampler": it.start_state}
        return it

    def _epoch_finished(self, it: _EpochIterator) -> None:
        self._position = {
            "epoch": it.epoch + 1,
            "consumed": 0,
            "sampler": _sampler_state(self._batch_sampler),
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
            "version": _STATE_VERSION,
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
        resume = self._checked_state(state)
        if self._prestarted is not None:
            self._prestarted.close()
            self._prestarted = None
        self._resume = resume
        self._position = dict(resume)
        self._next_epoch = resume["epoch"]

    def _refuse_with_cpp(self, what: str) -> None:
        if self._cpp is not None:
            raise RuntimeError(
                f"{what} needs shardloader's own pipeline: with try_nopython=True this loader's "
                "batches come from MXNet's C++ pipeline, whose order shardloader can neither "
                "record nor replay; use try_nopython=None to checkpoint mid-epoch"
            )

    def _checked_state(self, state: Any) -> Dict[str, Any]:
        """Check every field of ``state`` against this loader, changing nothing; return the
        point to resume from (a copy, so that the caller's dict may change afterwards)."""
        import copy

        from .sampler._base import check_state_int, same_value

        if not isinstance(state, dict) or not same_value(state.get("version"), _STATE_VERSION):
            raise ValueError(
                f"state must be a dict from ShardedDataLoader.state_dict() "
                f"(version {_STATE_VERSION}), got {state!r:.200}"
            )
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(
                f"state lacks the field(s) {missing}; a state from state_dict() has the fields "
                f"{list(_STATE_KEYS)}, got {sorted(map(str, state))}"
            )
        mine = self.state_dict()
        for key in ("dataset_len", "batch_size", "sampler_type", "seed"):
            if not same_value(state[key], mine[key]):
                raise ValueError(
                    f"state is from an incompatible loader: {key} is "
                    f"{state[key]!r:.100} in the state but {mine[key]!r} here"
                )
        for key in ("epoch", "consumed"):
            check_state_int(f"state[{key!r}]", state[key])
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        total = self._batches_of(epoch, state["sampler"])
        if consumed > total:
            raise ValueError(
                f"state['consumed'] must be an int in [0, {total}], the number of batches of "
                f"epoch {epoch}, got {consumed}"
            )
        return {"epoch": epoch, "consumed": consumed, "sampler": copy.deepcopy(state["sampler"])}

    def _batches_of(self, epoch: int, sampler_state: Any) -> int:
        """How many batches epoch ``epoch`` has when the batch sampler starts it from
        ``sampler_state``, which is checked first; nothing is changed."""
        from .sampler import Sampler
        from .sampler._base import StateTypeError, same_value

        bs = self._batch_sampler
        name = type(bs).__name__
        if not callable(getattr(bs, "state_dict", None)):
            if sampler_state is not None:
                raise ValueError(
                    f"state['sampler'] must be None: this loader's batch sampler ({name}) has "
                    f"no state_dict; got {sampler_state!r:.100}"
                )
            return len(bs)
        if not isinstance(sampler_state, dict):
            raise StateTypeError(
                f"state['sampler'] must be the state_dict() of this loader's batch sampler "
                f"({name}), a dict; got {sampler_state!r:.100}"
            )
        load = getattr(bs, "load_state_dict", None)
        if not callable(load):
            return len(bs)  # nothing to restore: resuming skips the consumed batches
        if not isinstance(bs, Sampler):
            # A batch sampler of the user's own: its load_state_dict is the only check there
            # is, and it loads the state as it checks it.
            try:
                load(sampler_state)
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"state is from an incompatible loader: {exc}") from exc
            return len(bs)
        probe = bs._probe()  # a copy to try the state on (see Sampler.load_state_dict)
        try:
            probe._load_state(sampler_state)
        except ValueError as exc:
            kind = StateTypeError if isinstance(exc, StateTypeError) else ValueError
            raise kind(f"state['sampler'] does not fit this loader's batch sampler: {exc}") from exc
        # The loader saves its batch sampler's state as the epoch starts: at that epoch, at
        # offset 0 (the loader counts the batches taken since, in 'consumed').
        for key, expected in (("epoch", epoch), ("offset", 0)):
            if not same_value(sampler_state[key], expected):
                raise ValueError(
                    f"state['sampler'][{key!r}] must be {expected}, as a loader saves its batch "
                    f"sampler's state at the start of epoch state['epoch']={epoch}; got "
                    f"{sampler_state[key]!r:.100}"
                )
        length = self._length
        for index in _carried_indices(probe):
            if not 0 <= index < length:
                raise ValueError(
                    f"state['sampler'] carries index {index} into epoch {epoch}, outside the "
                    f"dataset's range [0, {length})"
                )
        return len(probe)

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
        self._cpp = None  # its C++ threads stop when MXNet frees the iterator
        if self._hub is not None:
            self._hub.pool.close()
            self._hub = None

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
    _mx_iter = property(lambda self: self._cpp)

    def worker_pids(self) -> List[int]:
        """PIDs of the live worker processes (empty for inline or thread workers)."""
        return self._hub.pool.pids() if self._hub is not None else []


DataLoader = ShardedDataLoader


class _EpochIterator:
    """What ``iter(loader)`` returns: counts batches for checkpoints and time for stats."""

    def __init__(
        self, loader: ShardedDataLoader, source, epoch: int, consumed: int, start_state, pin
    ) -> None:
        self._loader_ref = weakref.ref(loader)
        self._pin = pin
        self._source = source
        self._stats = loader._stats
        self.epoch = epoch
        self.consumed = consumed
        self.start_state = start_state
        self._done = False
        # One consumer at a time: two threads advancing one epoch would race on its state.
        self._busy = threading.Lock()

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Any:
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(
                "this loader iterator is being advanced by another thread; an epoch "
                "iterator belongs to one consumer at a time (give each thread its own "
                "iter(loader), or hand the iterator over between batches)"
            )
        try:
            return self._next()
        finally:
            self._busy.release()

    def _next(self) -> Any:
        if _interrupts.pending:
            _interrupts.raise_pending()
        start = time.perf_counter()
        if self._stats.started is None:
            self._stats.started = start
        try:
            batch = next(self._source)
        except StopIteration:
            self._finish()
            raise
        if self._pin is not None:
            # On this thread, like Gluon: a host copy is a plain memcpy here (see _device),
            # cheaper than handing every batch across threads; a GPU copy is asynchronous.
            batch = pin(batch, self._pin)  # Gluon's containers: tuples become lists
        if _interrupts.pending:  # swallowed while this batch was on its way: not consumed
            _interrupts.raise_pending()
        stats = self._stats
        waited = time.perf_counter() - start
        stats.wait_s += waited
        if stats.first_batch_s is None:
            stats.first_batch_s = waited
        stats.batches += 1
        self.consumed += 1
        loader = self._loader_ref()
        if loader is not None and loader._position.get("epoch") == self.epoch:
            loader._position["consumed"] = self.consumed
        return batch

    next = __next__

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        loader = self._loader_ref()
        if loader is not None:
            loader._epoch_finished(self)

    def close(self) -> None:
        self._done = True
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def __len__(self) -> int:
        loader = self._loader_ref()
        return len(loader) if loader is not None else 0


def _placement(opts: _options.LoaderOptions):
    if opts.ctx is not None:
        from ._engine.device import normalize_ctx

        ctx = normalize_ctx(opts.ctx, opts.ctx_name)
        if isinstance(ctx, list) and len(ctx) == 1:
            return ctx[0]
        return ctx
    return None


def _pin_context(opts: _options.LoaderOptions):
    if opts.pin_memory:
        import mxnet as mx

        return mx.cpu_pinned(opts.pin_device_id)
    return None


def _check_shards_fit(ctx, num_shards: int, batch_sampler, name: str = "ctx") -> None:
    """Several contexts need steps of at most that many shards, where that is known now.
    ``name`` is the argument's name as given: ``ctx``, or MXNet 2.x's ``device``."""
    if not isinstance(ctx, list):
        return
    what = "devices" if name == "device" else "contexts"
    if num_shards > len(ctx):
        raise ValueError(
            f"num_shards={num_shards} but {name} has {len(ctx)} {what} ({ctx}); each shard "
            f"needs its own {what[:-1]}"
        )
    if not num_shards and getattr(batch_sampler, "yields_steps", None) is False:
        raise ValueError(
            f"{name} lists {len(ctx)} {what}, one per shard, but the batches are not sharded; "
            f"pass num_shards=len({name}), a batch_sampler that yields steps, or a single "
            f"{what[:-1]}"
        )


def _require_steps(items, num_ctx: int, name: str = "ctx"):
    """Refuse a plain batch when ctx lists several contexts: placing it would split it field
    by field (data on ctx[0], labels on ctx[1])."""
    what = "devices" if name == "device" else "contexts"
    for seq, indices in items:
        if not is_sharded(indices):
            raise ValueError(
                f"{name} lists {num_ctx} {what}, one per shard, but batch {seq} of the batch "
                "sampler is a plain batch, not a step (a list of per-shard index lists); "
                f"pass num_shards=len({name}) or a single {what[:-1]}"
            )
        yield seq, indices


# shardloader's options that MXNet 2.x's C++ pipeline cannot honour, with their defaults.
_NOT_IN_CPP = (
    ("seed", None),
    ("mxnet_seed", "batch"),
    ("num_shards", 0),
    ("num_parts", 1),
    ("even_size", False),
    ("worker_init_fn", None),
    ("on_worker_death", "raise"),
)


def _cpp_pipeline(opts, dataset, sampler, batch_sampler, batchify_fn, start_method):
    """MXNet 2.x's C++ pipeline for this loader, where ``try_nopython=True`` asks for it and
    Gluon would use it; else ``None``.

    Gluon (2.0.0b1) asks ``_check_mx_loader_capability`` whether the dataset, the batch
    sampler and the batchify function it would use all have C++ counterparts. Where they do,
    the C++ pipeline loads the batches here too, so they are Gluon's, whatever its
    conventions (tuples, float32 values). Where they do not, Gluon's ``RuntimeError`` is
    raised, with Gluon's message. ``try_nopython=None`` does not take this path: Gluon would
    switch silently, but shardloader keeps its own workers and the batches of Gluon's
    Python pipeline (docs/switching.md says why).
    """
    if not MX2 or not opts.try_nopython or opts.num_workers == 0:
        return None  # Gluon ignores try_nopython without workers too
    from mxnet.gluon.data import batchify as gluon_batchify
    from mxnet.gluon.data import dataloader as gluon_loader
    from mxnet.gluon.data import sampler as gluon_sampler

    check = getattr(gluon_loader, "_check_mx_loader_capability", None)
    pipeline = getattr(gluon_loader, "_MXThreadedDataLoader", None)
    if check is None or pipeline is None:
        import mxnet as mx

        raise ValueError(
            f"try_nopython=True: this MXNet ({mx.__version__}) has no C++ data pipeline that "
            "shardloader knows (it uses MXNet 2.0's); use try_nopython=None or False"
        )
    if batch_sampler is None:  # the batch sampler Gluon would build from these arguments
        if sampler is None:
            length = len(dataset)
            sampler = (
                gluon_sampler.RandomSampler(length)
                if opts.shuffle
                else gluon_sampler.SequentialSampler(length)
            )
        batch_sampler = gluon_sampler.BatchSampler(
            sampler, opts.batch_size, opts.last_batch or "keep"
        )
    if isinstance(batchify_fn, _batchify._FieldStack):  # the default: Gluon's, as Gluon has it
        batchify_fn = gluon_batchify.Stack(use_shared_mem=True)
    usable, args = check(dataset, batch_sampler, batchify_fn)
    if not usable:
        raise RuntimeError(args)  # Gluon's message, word for word
    given = [
        f"{name}={getattr(opts, name)!r}"
        for name, default in _NOT_IN_CPP
        if getattr(opts, name) != default
    ]
    if start_method is not None:
        given.append(f"start_method={start_method!r}")
    if given:
        raise ValueError(
            "try_nopython=True hands this loader to MXNet's C++ pipeline, which cannot honour "
            f"{', '.join(given)}; drop {'it' if len(given) == 1 else 'them'}, or use "
            "try_nopython=None for shardloader's own workers, which give the batches of "
            "Gluon's Python pipeline"
        )
    return pipeline(
        num_workers=opts.num_workers,
        pin_memory=opts.pin_memory,
        pin_device_id=opts.pin_device_id,
        prefetch=opts.prefetch,
        **args,
    )


def _sampler_state(sampler) -> Any:
    fn = getattr(sampler, "state_dict", None)
    return fn() if fn is not None else None


def _carried_indices(sampler) -> Iterator[int]:
    """The indices that a shardloader batch sampler, and the samplers it wraps, carry into
    their next pass (``last_batch='rollover'``): items, or batches of items, of ``_carry``."""
    from .sampler import Sampler

    while isinstance(sampler, Sampler):
        for item in sampler.__dict__.get("_carry", ()):
            yield from item if isinstance(item, list) else (item,)
        sampler = sampler.__dict__.get("_sampler")
