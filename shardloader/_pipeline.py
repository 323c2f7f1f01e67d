"""An epoch's data path, put together from the stages (docs/design.md, "The data path").

``ShardedDataLoader`` keeps the arguments, the epoch numbers and the checkpoints. This module
is the one place that turns them into stages:

* ``build_batch_sampler`` composes the sampler stages the arguments ask for (order or
  shuffle, a machine's part, batches, groups of shards);
* ``Pipeline.open`` turns one epoch's ``(seq, indices)`` items into the whole chain of its
  stages, each pulling from the one before it (``_engine.stage``)::

      items --> InlineEpoch ------------------------+--> placement --> ConsumerStage --> user
            \\-> PooledEpoch --> Router --> Pool --/     (one of: none; PinStage on the
                   (in-flight   (reorder,  (process      consumer's thread for pin_memory;
                    bound,       restart)   | thread)    a prefetch thread for ctx=)
                    deadline)

  (or, for ``try_nopython=True`` under MXNet 2.x, Gluon's C++ pipeline as the source), and
  owns the router, and through it the worker pool, that pooled epochs share.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

from . import batchify as _batchify
from ._engine.batch import BatchMaker
from ._engine.consumer import ConsumerStage, Position
from ._engine.device import PinStage, pin_context, placement, require_steps
from ._engine.epoch import InlineEpoch, PooledEpoch
from ._engine.ipc.alloc import numpy_flags
from ._engine.options import LoaderOptions
from ._engine.pools import ProcessPool, ThreadPool
from ._engine.router import Router
from ._engine.stage import Stage
from ._engine.stats import Stats
from .prefetch import DevicePrefetcher
from .sampler import (
    BatchSampler,
    PartitionSampler,
    RandomSampler,
    SequentialSampler,
    ShardGroupSampler,
)

__all__ = ["Pipeline", "build_batch_sampler"]


def build_batch_sampler(opts: LoaderOptions, length: int, sampler: Any, batch_sampler: Any):
    """The loader's batch sampler: the user's ``batch_sampler``, or one built from
    ``sampler``/``shuffle`` and ``batch_size``, split into ``num_parts`` parts and grouped
    into steps of ``num_shards`` batches as the options ask."""
    parts = (opts.num_parts, opts.part_index)
    if batch_sampler is None:
        if sampler is None:
            sampler = (
                RandomSampler(length, seed=opts.seed) if opts.shuffle else SequentialSampler(length)
            )
        if opts.num_parts > 1:
            sampler = PartitionSampler(sampler, *parts, even_size=opts.even_size)
        assert opts.batch_size is not None  # options.validate: given unless batch_sampler is
        batch_sampler = BatchSampler(sampler, opts.batch_size, opts.last_batch or "keep")
    elif opts.num_parts > 1:
        batch_sampler = PartitionSampler(batch_sampler, *parts, even_size=opts.even_size)
    if opts.num_shards:
        # 'keep' gives every step num_shards shards, spreading a short tail over them.
        batch_sampler = ShardGroupSampler(
            batch_sampler, opts.num_shards, last_group=opts.last_batch or "keep"
        )
    return batch_sampler


class Pipeline:
    """The stages of one loader: opens its epochs and owns their worker pool.

    Parameters
    ----------
    opts : LoaderOptions
        The loader's validated options.
    dataset : Dataset
        What the workers index (already wrapped for thread workers where it must be).
    length : int
        ``len(dataset)``; an empty dataset starts no worker.
    batch_fn : callable
        The batchify function the workers run.
    stats : Stats
        The loader's counters.
    cpp : optional
        MXNet 2.x's C++ pipeline (``_engine.gluon_cpp``), which then loads every epoch.
    on_device : callable, optional
        Run on every placed batch (each shard of a step), on the consumer's thread: the
        fused image path's normalise-on-device stage (``Fusion.on_device``,
        ``ImageRecordLoader(output='device')``).
    """

    def __init__(
        self,
        opts: LoaderOptions,
        dataset: Any,
        length: int,
        batch_fn: Callable,
        stats: Stats,
        cpp: Any = None,
        on_device: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        self._opts = opts
        self._on_device = on_device
        self._dataset = dataset
        self._length = length
        self._batch_fn = batch_fn
        self._stats = stats
        self.cpp = cpp
        # Like Gluon, workers take MXNet's numpy mode from when the loader was made; inline
        # loading follows the consuming thread's mode at each batch.
        self._numpy_flags = numpy_flags()
        self.ctx = placement(opts.ctx, opts.ctx_name)
        # Gluon's C++ pipeline pins its batches itself.
        self.pin = None if cpp is not None else pin_context(opts.pin_memory, opts.pin_device_id)
        self._router: Optional[Router] = None

    def open(
        self,
        items: Iterator[Tuple[int, Sequence]],
        position: Position,
        end_state: Callable[[], Any],
        length: Callable[[], int],
        then: Optional[Callable[[], Any]] = None,
    ) -> ConsumerStage:
        """The chain of stages of epoch ``position.epoch``, from its ``(seq, indices)``
        items: the first ``position.consumed`` batches (a resumed epoch's) were consumed
        before and are not in ``items``. See ``ConsumerStage`` for the other arguments."""
        source = self._place(self._source(items, position.epoch, position.consumed))
        if self._on_device is not None:
            source = _OnDevice(source, self._on_device)
        return ConsumerStage(source, position, self._stats, end_state, length, then)

    def _source(self, items: Iterator[Tuple[int, Sequence]], epoch: int, skip: int) -> Any:
        """The first stage: the C++ pipeline, inline loading, or the worker pool."""
        opts = self._opts
        if isinstance(self.ctx, list):
            items = require_steps(items, len(self.ctx), opts.ctx_name)
        # An empty dataset has no batches (as in Gluon): no worker is started for it. A batch
        # sampler that yields an index anyway gets the usual IndexError, inline.
        if self.cpp is not None:
            source = iter(self.cpp)  # Gluon's C++ pipeline: it pins, and starts over, itself
        elif opts.num_workers == 0 or self._length == 0:
            source = InlineEpoch(items, self._inline_maker(epoch), self._stats)
        else:
            source = PooledEpoch(
                self._live_router(), items, skip, epoch, opts.prefetch, opts.timeout
            )
        return source

    def _place(self, source: Any) -> Any:
        """The one point where batches are placed: ``ctx=`` on a prefetch thread, so the
        copy overlaps with training; ``pin_memory`` on the consumer's thread, as in Gluon."""
        if self.ctx is not None:
            buffer_size = max(1, self._opts.prefetch or 1)
            return DevicePrefetcher(self.ctx, buffer_size=buffer_size).prefetch(source)
        if self.pin is not None:
            return PinStage(source, self.pin)
        return source

    def _inline_maker(self, epoch: int) -> Callable[[Sequence], Any]:
        maker = BatchMaker(
            self._dataset,
            self._batch_fn,
            self._opts.seed,
            shared_process=True,
            mxnet_per_sample=self._opts.mxnet_seed == "sample",
            # With ctx, batches are made on the placement thread: give it the numpy mode of
            # the thread that started the epoch. Otherwise the consumer's own mode applies.
            numpy_flags=numpy_flags() if self.ctx is not None else None,
        )
        return lambda indices: maker.make(indices, epoch)

    def _live_router(self) -> Router:
        """The router over a working pool: the current one, or a fresh one after a dead or
        stuck worker broke it."""
        router = self._router
        if router is not None and router.healthy:
            return router
        if router is not None:
            router.shutdown()
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
            native_batchify=_batchify.is_native(self._batch_fn),
            seed=opts.seed,
            worker_init_fn=opts.worker_init_fn,
            start_method=opts.start_method,
            mxnet_per_sample=opts.mxnet_seed == "sample",
            numpy_flags=self._numpy_flags,
            timeout=opts.timeout,
        )
        self._router = Router(pool, opts.on_worker_death, self._stats)
        return self._router

    def worker_pids(self) -> List[int]:
        """PIDs of the live worker processes (empty for inline or thread workers)."""
        return self._router.pids() if self._router is not None else []

    def close(self) -> None:
        """Stop the workers and release their shared memory; idempotent."""
        self.cpp = None  # its C++ threads stop when MXNet frees the iterator
        if self._router is not None:
            self._router.shutdown()
            self._router = None


class _OnDevice(Stage):
    """Each placed batch, or each shard of a placed step, through ``fn`` (``on_device``)."""

    def __init__(self, source: Any, fn: Callable[[Any], Any]) -> None:
        self._source = source
        self._fn = fn

    def _next(self) -> Any:
        batch = next(self._source)
        if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], (list, tuple)):
            return [self._fn(shard) for shard in batch]  # a step of shards
        return self._fn(batch)
