"""One epoch of batches: inline, or over a worker pool with a reorder buffer.

Invariants (docs/design.md), each enforced here and nowhere else:

1. Batches come out in sampler order: results go through a ``ReorderBuffer`` keyed by
   sequence number.
2. At most ``max(prefetch, 1)`` batches are in flight (dispatched, not yet handed to the
   consumer); the 1 is the batch the consumer is waiting for when ``prefetch=0``.
3. No call blocks forever: every wait on the pool is bounded by ``_POLL_INTERVAL_S``, after
   which the iterator checks the batch's deadline and the workers' health.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .._errors import (
    ClosedIteratorError,
    LoaderTimeoutError,
    short_indices,
)
from . import interrupts as _interrupts
from .device import pin
from .protocol import Result, Task
from .reorder import ReorderBuffer
from .router import Router
from .stats import Stats, batch_nbytes

# Longest single wait on the pool before re-checking deadlines and worker health.
_POLL_INTERVAL_S = 0.25

_iter_ids = itertools.count()


class PooledEpoch:
    """Iterates one epoch's batches through a ``Router``."""

    def __init__(
        self,
        router: Router,
        items: Iterator[Tuple[int, Sequence]],
        start: int,
        epoch: int,
        prefetch: int,
        timeout: Optional[float],
        stats: Stats,
    ) -> None:
        self._router = router
        self._items = items
        self._epoch = epoch
        self._iter_id = next(_iter_ids)
        self._limit = max(prefetch, 1)
        self._timeout = timeout
        self._stats = stats
        self._buffer = ReorderBuffer(start=start)
        self._sent: Dict[int, Tuple[float, Sequence]] = {}  # seq -> (dispatch time, indices)
        self._exhausted = False
        self._error: Optional[BaseException] = None
        self._closed = False
        self._user_closed = False
        router.routes[self._iter_id] = self
        self._finalizer = weakref.finalize(
            self, _abandon, router.routes, self._iter_id, self._buffer, router.pool, stats
        )
        self._fill(prefetch)

    # -- called by the router
    def _accept(self, result: Result) -> None:
        if self._closed:
            self._router.pool.discard(result)
            return
        self._sent.pop(result.seq, None)
        self._buffer.put(result.seq, result)
        depth = len(self._buffer)
        self._stats.reorder_depth = depth
        if depth > self._stats.max_reorder_depth:
            self._stats.max_reorder_depth = depth

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error

    # -- dispatch
    def _in_flight(self) -> int:
        return len(self._sent) + len(self._buffer)

    def _fill(self, limit: int) -> None:
        chunk = self._router.chunk(self._limit)
        while not self._exhausted:
            in_flight = self._in_flight()
            k = min(chunk, limit - in_flight)
            if k <= 0 or (k < chunk and in_flight > 0):
                return  # wait until a whole chunk fits, unless the pipeline is empty
            batches = list(itertools.islice(self._items, k))
            if len(batches) < k:
                self._exhausted = True
            if not batches:
                return
            now = time.monotonic()
            for seq, indices in batches:
                self._sent[seq] = (now, indices)
            if self._in_flight() > self._limit:  # invariant 2, checked where it could break
                raise RuntimeError(
                    f"internal error: {self._in_flight()} batches in flight, "
                    f"more than the bound {self._limit}"
                )
            self._router.submit(Task(self._iter_id, self._epoch, batches))

    # -- iteration
    def __iter__(self) -> PooledEpoch:
        return self

    def __next__(self) -> Any:
        if self._closed:
            if self._user_closed:
                raise ClosedIteratorError("Trying to advance a closed loader iterator")
            raise StopIteration
        self._fill(self._limit)
        if self._exhausted and self._in_flight() == 0:
            self._end()
            raise StopIteration
        try:
            result = self._wait(self._buffer.next_seq)
        except BaseException:
            self._end()
            raise
        self._fill(self._limit)
        if not result.ok:
            self._end()
            raise result.payload.rebuild()
        pool = self._router.pool
        before = pool.bytes_delivered
        batch = pool.materialize(result)
        delivered = pool.bytes_delivered - before
        self._stats.bytes += delivered if delivered else batch_nbytes(batch)
        return batch

    def _wait(self, seq: int) -> Result:
        buffer = self._buffer
        # Like Gluon, the timeout runs from when the consumer starts waiting for the batch.
        started = time.monotonic()
        while not buffer.ready():
            if self._error is not None:
                raise self._error
            if self._closed:  # closed by another thread while this one waited
                raise ClosedIteratorError("the loader iterator was closed while waiting")
            _, indices = self._sent.get(seq, (None, None))
            if self._timeout is not None:
                elapsed = time.monotonic() - started
                if elapsed > self._timeout:
                    self._router.broken = self._timeout_error(seq, indices, elapsed)
                    raise self._router.broken
                wait = min(_POLL_INTERVAL_S, self._timeout - elapsed)
            else:
                wait = _POLL_INTERVAL_S
            self._router.pump(max(wait, 0.0))
        result = buffer.pop()
        self._stats.reorder_depth = len(buffer)
        return result

    def _timeout_error(self, seq: int, indices, elapsed: float) -> LoaderTimeoutError:
        kind = self._router.pool.kind
        causes = "a slow dataset __getitem__ or batchify_fn (raise timeout=...)"
        if kind == "process":
            causes += ", a worker stuck on a lock or I/O, or a system out of memory"
        return LoaderTimeoutError(
            f"batch {seq} (indices {short_indices(indices)}) was not ready after "
            f"{elapsed:.1f}s (timeout={self._timeout}s, {kind} workers). Likely causes: "
            f"{causes}. The workers will be restarted on the next epoch.",
            seq=seq,
            indices=indices,
            elapsed=elapsed,
        )

    def close(self) -> None:
        """Stop this epoch early; advancing it afterwards raises ClosedIteratorError."""
        self._user_closed = True
        self._end()

    def _end(self) -> None:
        """Drop buffered batches (freeing their memory) and stop routing. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._sent.clear()
        self._finalizer()


def _abandon(routes, iter_id: int, buffer: ReorderBuffer, pool, stats: Stats) -> None:
    """End an epoch: stop routing its results and free the batches it buffered. Runs on
    close, at the end of the epoch, or when an abandoned epoch is garbage collected."""
    routes.pop(iter_id, None)
    for _, result in buffer.drain():
        pool.discard(result)
    stats.reorder_depth = 0


class InlineEpoch:
    """``num_workers=0``: load each batch in the consumer's thread."""

    def __init__(
        self, items: Iterator[Tuple[int, Sequence]], make: Callable[[Sequence], Any], stats: Stats
    ) -> None:
        self._items = items
        self._make = make
        self._stats = stats
        self._closed = False
        self._done = False

    def __iter__(self) -> InlineEpoch:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise ClosedIteratorError("Trying to advance a closed loader iterator")
        if self._done:
            raise StopIteration
        try:
            _, indices = next(self._items)
        except StopIteration:
            self._done = True
            raise
        batch = self._make(indices)
        self._stats.bytes += batch_nbytes(batch)
        return batch

    def close(self) -> None:
        self._closed = True


class LoaderEpoch:
    """What ``iter(loader)`` returns: counts batches for checkpoints and time for stats.

    ``owner`` (the loader, held weakly) hears of every batch handed out
    (``_batch_consumed(self)``) and of the end of the epoch (``_epoch_finished(self)``).
    """

    def __init__(
        self, owner, source, epoch: int, consumed: int, start_state, pin, stats: Stats
    ) -> None:
        self._owner = weakref.ref(owner)
        self._pin = pin
        self._source = source
        self._stats = stats
        self.epoch = epoch
        self.consumed = consumed
        self.start_state = start_state
        self._done = False
        # One consumer at a time: two threads advancing one epoch would race on its state.
        self._busy = threading.Lock()

    def __iter__(self) -> LoaderEpoch:
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
            # On this thread, like Gluon: a host copy is a plain memcpy here (see device),
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
        owner = self._owner()
        if owner is not None:
            owner._batch_consumed(self)
        return batch

    next = __next__

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        owner = self._owner()
        if owner is not None:
            owner._epoch_finished(self)

    def close(self) -> None:
        self._done = True
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def __len__(self) -> int:
        owner = self._owner()
        return len(owner) if owner is not None else 0


__all__: List[str] = ["InlineEpoch", "LoaderEpoch", "PooledEpoch"]
