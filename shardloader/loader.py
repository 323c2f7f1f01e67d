"""``ShardedDataLoader``: Gluon's DataLoader signature over shardloader's data path.

    batch sampler --(seq, indices)--> pool --> reorder buffer --> pin/device --> user

This module wires the stages together and keeps the per-epoch bookkeeping (epoch number,
batches handed out, stats, checkpoint state). The stages live in their own modules.
"""

from __future__ import annotations

import itertools
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from . import _options
from . import batchify as _batchify
from ._device import place
from ._errors import ClosedIteratorError
from ._iter import Hub, InlineEpoch, PooledEpoch, Stats
from ._pool import ProcessPool, ThreadPool
from ._worker import BatchMaker, is_sharded
from .sampler import (
    BatchSampler,
    PartitionSampler,
    RandomSampler,
    SequentialSampler,
    ShardGroupSampler,
)

__all__ = ["ShardedDataLoader", "DataLoader"]

_STATE_VERSION = 1


class ShardedDataLoader:
    """Loads mini-batches from a dataset, with Gluon's ``DataLoader`` signature.

    Code written for ``mxnet.gluon.data.DataLoader`` (1.9.1, or 2.x's keywords) runs
    unchanged and gets the same batches in the same order. Beyond Gluon it never hangs
    (dead workers and timeouts become errors within seconds), never leaks shared memory,
    yields per-device shards, and can checkpoint and resume in the middle of an epoch.

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
        Merges a list of samples into a batch. Defaults to
        ``shardloader.batchify.default_batchify_fn``, Gluon's default.
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
    try_nopython : None
        MXNet 2.x's C++ pipeline; ``True`` raises ``ValueError`` (not in MXNet 1.9.1).
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
        )
        self._opts = opts
        self._dataset = dataset
        self._length = _options.check_dataset(dataset)
        if num_parts > 1 and shuffle and seed is None:
            raise ValueError(
                "num_parts > 1 with shuffle=True needs seed=<int>, so that every machine "
                "draws the same permutation and the parts stay disjoint"
            )
        self._batch_sampler = self._build_batch_sampler(sampler, batch_sampler)
        if batchify_fn is None:
            batchify_fn = _batchify.default_batchify_fn
        self._batchify_fn = batchify_fn
        self._ctx = _placement(opts)
        self._pin = _pin_context(opts)
        _check_shards_fit(self._ctx, opts.num_shards, self._batch_sampler)
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
            batch_sampler = ShardGroupSampler(
                batch_sampler, opts.num_shards, last_group=opts.last_batch or "keep"
            )
        return batch_sampler

    def _get_hub(self) -> Hub:
        hub = self._hub
        if hub is not None and hub.broken is None and not hub.pool.closed:
            return hub
        if hub is not None:
            hub.pool.close()  # a dead or stuck worker: start over with a fresh pool
        opts = self._opts
        pool_cls = ThreadPool if opts.thread_pool else ProcessPool
        pool = pool_cls(
            opts.num_workers,
            self._dataset,
            self._batchify_fn,
            raw=_batchify.is_native(self._batchify_fn),
            seed=opts.seed,
            worker_init_fn=opts.worker_init_fn,
            start_method=opts.start_method,
            mxnet_per_sample=opts.mxnet_seed == "sample",
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
            items = _require_steps(items, len(self._ctx))
        opts = self._opts
        if opts.num_workers == 0:
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
        it = _EpochIterator(self, source, epoch, skip, start_state, self._pin)
        self._open.add(it)
        return it

    def _inline_maker(self, epoch: int) -> Callable[[Sequence], Any]:
        maker = BatchMaker(
            self._dataset,
            self._batchify_fn,
            self._opts.seed,
            shared_process=True,
            mxnet_per_sample=self._opts.mxnet_seed == "sample",
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
        self._next_epoch = _options._int("epoch", epoch, 0)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> Dict[str, Any]:
        """Where the current epoch stands, as a small JSON-serialisable dict.

        Batches already prefetched but not handed to the user are not counted.
        """
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
        epoch, then continue with the following epochs as an uninterrupted run would."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"state must be a dict from ShardedDataLoader.state_dict() "
                f"(version {_STATE_VERSION}), got {state!r:.200}"
            )
        mine = self.state_dict()
        for key in ("dataset_len", "batch_size", "sampler_type", "seed"):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"state is from an incompatible loader: {key} is "
                    f"{state.get(key)!r} in the state but {mine[key]!r} here"
                )
        load = getattr(self._batch_sampler, "load_state_dict", None)
        if load is not None and state.get("sampler") is not None:
            try:
                load(state["sampler"])  # validates it now, not at the next iter()
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"state is from an incompatible loader: {exc}") from exc
        if self._prestarted is not None:
            self._prestarted.close()
            self._prestarted = None
        self._resume = {
            "epoch": state["epoch"],
            "consumed": state["consumed"],
            "sampler": state["sampler"],
        }
        self._position = dict(self._resume)
        self._next_epoch = state["epoch"]

    # ------------------------------------------------------------------ stats & lifecycle
    def stats(self) -> Dict[str, Any]:
        """Batches and bytes delivered, time the consumer waited for data and its share of
        wall-clock time (``data_stall``), per-worker busy time and the reorder depth."""
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
        if self._hub is not None:
            self._hub.pool.close()
            self._hub = None

    def __enter__(self) -> ShardedDataLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Any:
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
            batch = place(batch, self._pin)
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
        from ._device import normalize_ctx

        ctx = normalize_ctx(opts.ctx)
        if isinstance(ctx, list) and len(ctx) == 1:
            return ctx[0]
        return ctx
    return None


def _pin_context(opts: _options.LoaderOptions):
    if opts.pin_memory:
        import mxnet as mx

        return mx.cpu_pinned(opts.pin_device_id)
    return None


def _check_shards_fit(ctx, num_shards: int, batch_sampler) -> None:
    """Several contexts need steps of at most that many shards, where that is known now."""
    if not isinstance(ctx, list):
        return
    if num_shards > len(ctx):
        raise ValueError(
            f"num_shards={num_shards} but ctx has {len(ctx)} contexts ({ctx}); each shard "
            "needs its own context"
        )
    if not num_shards and getattr(batch_sampler, "yields_steps", None) is False:
        raise ValueError(
            f"ctx lists {len(ctx)} contexts, one per shard, but the batches are not sharded; "
            "pass num_shards=len(ctx), a batch_sampler that yields steps, or a single context"
        )


def _require_steps(items, num_ctx: int):
    """Refuse a plain batch when ctx lists several contexts: placing it would split it field
    by field (data on ctx[0], labels on ctx[1])."""
    for seq, indices in items:
        if not is_sharded(indices):
            raise ValueError(
                f"ctx lists {num_ctx} contexts, one per shard, but batch {seq} of the batch "
                "sampler is a plain batch, not a step (a list of per-shard index lists); "
                "pass num_shards=len(ctx) or a single context"
            )
        yield seq, indices


def _sampler_state(sampler) -> Any:
    fn = getattr(sampler, "state_dict", None)
    return fn() if fn is not None else None
