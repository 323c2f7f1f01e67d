"""Making one batch: load its samples, seeded, and batchify them.

``BatchMaker`` is the one place a batch is made, in every mode (inline, thread workers,
process workers), so all three seed and validate alike (docs/design.md, invariants 5 and 6).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, ContextManager, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .ipc import alloc as _alloc
from .nest import is_sharded
from .seeding import (
    MXNET_SEED_DOMAIN,
    GlobalRNGState,
    UnseededWatch,
    defer_mxnet_seed,
    derive_seed,
    drop_deferred_mxnet_seed,
    global_rng_marks,
    sample_seed,
    sample_seed_prefix,
    seed_python_and_numpy,
)

__all__ = ["BatchMaker", "FirstBatchTurn"]


def _check_index(index: Any, position: int, length: int) -> None:
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
        raise TypeError(
            f"the batch sampler yielded a non-integer index {index!r} "
            f"(type {type(index).__name__}) at position {position} of the batch; "
            f"indices must be ints in [0, {length})"
        )
    if not 0 <= index < length:
        raise IndexError(
            f"the batch sampler yielded index {index} at position {position} of the batch, "
            f"outside the dataset's range [0, {length})"
        )


def _plain_indices(indices: Sequence, length: int) -> bool:
    """Whether ``indices`` are all Python ints in ``[0, length)``: the common case, checked
    in a few C loops instead of two ``isinstance`` calls per index."""
    return (
        bool(indices)
        and set(map(type, indices)) == {int}
        and min(indices) >= 0
        and max(indices) < length
    )


def _no_context() -> ContextManager:
    return contextlib.nullcontext()


class FirstBatchTurn(NamedTuple):
    """The batch that holds the first-batch turn of threads sharing a dataset (see
    ``BatchMaker.first_batch_turn``): no other batch is made until it is done."""

    batch: Optional[Tuple[int, int]]  # ``make``'s ``batch``: (iter_id, seq) in a thread pool
    indices: Sequence
    since: float  # time.monotonic() when it took the turn


class BatchMaker:
    """Loads the samples of one batch (or one sharded step) and batchifies them.

    Shared by inline loading, thread workers and process workers, so all three seed and
    validate identically (docs/design.md, invariant 6). ``shared_process=True`` (inline and thread
    workers) means the global RNGs belong to the user's training thread too: seeded loading
    then takes a lock and gives ``random`` and ``numpy.random`` their states back afterwards.
    """

    def __init__(
        self,
        dataset: Any,
        batchify_fn: Callable,
        seed: Optional[int],
        shared_process: bool = False,
        mxnet_per_sample: bool = False,
        numpy_flags: Optional[Tuple[bool, bool]] = None,
    ) -> None:
        self.dataset = dataset
        self._mxnet_per_sample = mxnet_per_sample
        # MXNet's numpy mode (per thread) for the thread that makes a batch; None: leave it.
        self._numpy_flags = numpy_flags
        self.batchify_fn = _stop_iteration_guard(batchify_fn)
        self.seed = seed
        self.length = len(dataset)
        self._shared = shared_process
        # Seeded thread workers take turns, batch by batch, so that the draws stay exactly
        # those of a process worker.
        self._lock = threading.Lock() if shared_process else contextlib.nullcontext()
        # Threads sharing a dataset make their first batch one at a time: lazy first-call
        # set-up (a hybridized Gluon transform builds its graph then) is not thread-safe.
        self._first_batch: Optional[threading.Lock] = threading.Lock() if shared_process else None
        self._turn: Optional[FirstBatchTurn] = None  # the batch making the first batch
        # Seeding random and numpy.random costs a few microseconds a sample, as much as a
        # small sample's loading. The first seeded batch finds out whether the dataset draws
        # from them; if not, later batches load without seeding them, watched, and a batch
        # that drew after all is made again, seeded (docs/reproducibility.md).
        self._learning = True
        self._rngs_unused = False

    def samples(self, indices: Sequence, epoch: int) -> List[Any]:
        length, dataset = self.length, self.dataset
        if not _plain_indices(indices, length):  # the per-index checks name the culprit
            for pos, i in enumerate(indices):
                _check_index(i, pos, length)
        out: List[Any] = []
        try:
            if self.seed is None:
                for i in indices:
                    out.append(dataset[i])
                return out
            with self._lock:
                if self._rngs_unused and self._unseeded(indices, epoch, out):
                    return out
                out.clear()
                return self._seeded(indices, epoch, out)
        except StopIteration as exc:
            # Left alone, it would reach the for loop over the loader as the end of the epoch.
            raise RuntimeError(
                f"the dataset's __getitem__ raised StopIteration for sample index "
                f"{indices[len(out)]} (position {len(out)} of the batch). It is raised as "
                f"RuntimeError, as Gluon's DataLoader does: a StopIteration would end the "
                f"epoch early without a word"
            ) from exc

    def _defer_mxnet(self, indices: Sequence, epoch: int) -> None:
        """MXNet's seed for the batch, applied only if something draws from MXNet (a reseed
        costs about a millisecond of engine work: seeding.defer_mxnet_seed)."""
        if not self._mxnet_per_sample:
            seed = self.seed ^ MXNET_SEED_DOMAIN  # type: ignore[operator]
            defer_mxnet_seed(lambda: derive_seed(seed, epoch, _fold(indices)))

    def _seeded(self, indices: Sequence, epoch: int, out: List[Any]) -> List[Any]:
        """The samples, ``random`` and ``numpy.random`` seeded before each one. The first
        batch also finds out whether the dataset draws from them at all."""
        dataset, per_sample, learn = self.dataset, self._mxnet_per_sample, self._learning
        drew = False
        with GlobalRNGState() if self._shared else contextlib.nullcontext():
            self._defer_mxnet(indices, epoch)
            prefix = sample_seed_prefix(self.seed, epoch)  # type: ignore[arg-type]
            for i in indices:
                value = sample_seed(prefix, i)
                seed_python_and_numpy(value)
                if per_sample:
                    defer_mxnet_seed(value)
                if learn:
                    marks = global_rng_marks()
                    out.append(dataset[i])
                    drew = drew or global_rng_marks() != marks
                else:
                    out.append(dataset[i])
        if learn:
            self._learning = False
            self._rngs_unused = not drew
        return out

    def _unseeded(self, indices: Sequence, epoch: int, out: List[Any]) -> bool:
        """For a dataset whose first batch drew nothing from ``random`` or ``numpy.random``:
        the samples without seeding them (seeding costs a few microseconds a sample). True
        if nothing drew from them: the batch is then the one seeding would have made. False
        if something did: the dataset draws after all, and is seeded from now on; the
        caller makes the batch again, seeded."""
        dataset, watch = self.dataset, UnseededWatch()
        try:
            with watch:
                self._defer_mxnet(indices, epoch)
                if self._mxnet_per_sample:
                    prefix = sample_seed_prefix(self.seed, epoch)  # type: ignore[arg-type]
                    for i in indices:
                        defer_mxnet_seed(sample_seed(prefix, i))
                        out.append(dataset[i])
                else:
                    for i in indices:
                        out.append(dataset[i])
        except Exception:
            if not watch.touched:
                raise  # an error that random and numpy.random had no part in
        if watch.touched:
            self._rngs_unused = False
        return not watch.touched

    @property
    def first_batch_turn(self) -> Optional[FirstBatchTurn]:
        """The batch making the first batch of threads that share this maker, while one
        does; None otherwise (and always in a worker process, which shares nothing). That
        batch holds up every other one: they are made only once it is done."""
        return self._turn

    def make(
        self,
        indices: Sequence,
        epoch: int,
        output: Callable[[], ContextManager] = _no_context,
        batch: Optional[Tuple[int, int]] = None,
    ) -> Any:
        """The batch (or step) for ``indices``. ``output`` is entered around batchify only,
        not around the dataset: a dataset that calls batchify functions itself gets its
        own memory and the usual types, whatever the transport does with the batch.
        ``batch`` (a thread pool's ``(iter_id, seq)``) names it in ``first_batch_turn``
        while it holds that turn."""
        if self._numpy_flags is not None:
            _alloc.set_numpy_flags(self._numpy_flags)
        try:
            first = self._first_batch
            if first is not None:
                with first:
                    if self._first_batch is not None:
                        self._turn = FirstBatchTurn(batch, indices, time.monotonic())
                        try:
                            made = self._make(indices, epoch, output)
                        finally:
                            self._turn = None
                        self._first_batch = None  # set up: from now on, in parallel
                        return made
            return self._make(indices, epoch, output)
        finally:
            if self.seed is not None:
                # A seed MXNet did not need: batchify has drawn what it draws from the
                # batch's seed (as if MXNet had been seeded before it), the caller's own
                # MXNet calls come next.
                drop_deferred_mxnet_seed()

    def _make(self, indices: Sequence, epoch: int, output: Callable[[], ContextManager]) -> Any:
        if is_sharded(indices):
            shards = [self.samples(shard, epoch) for shard in indices]
            with output():
                return [self._batchify(samples, shard) for samples, shard in zip(shards, indices)]
        samples = self.samples(indices, epoch)
        with output():
            return self._batchify(samples, indices)

    def _batchify(self, samples: List[Any], indices: Sequence) -> Any:
        """``batchify_fn(samples)``; an error that can name the samples it is about by their
        dataset indices (``name_samples``, as batchify's shape errors can) is told them."""
        try:
            return self.batchify_fn(samples)
        except ValueError as exc:
            name_samples = getattr(exc, "name_samples", None)
            if callable(name_samples):
                name_samples([int(i) for i in indices])
            raise


def _stop_iteration_guard(batchify_fn: Callable) -> Callable:
    """``batchify_fn``, with a StopIteration it raises turned into a RuntimeError: a
    StopIteration would end the epoch early without a word."""

    def batchify(samples):
        try:
            return batchify_fn(samples)
        except StopIteration as exc:
            raise RuntimeError(
                f"batchify_fn raised StopIteration while batching {len(samples)} samples. It "
                f"is raised as RuntimeError, as Gluon's DataLoader does: a StopIteration "
                f"would end the epoch early without a word"
            ) from exc

    batchify.__wrapped__ = batchify_fn  # type: ignore[attr-defined]
    return batchify


def _fold(indices: Sequence) -> int:
    """One 31-bit value from all the indices of a batch, in order: two batches that merely
    start alike (a rollover carry, a repeated index) must not share MXNet's draws."""
    h = len(indices)
    for i in indices:
        h = derive_seed(h, 0, int(i))
    return h
