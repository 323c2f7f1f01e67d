"""The first stage of an epoch: its batches, made inline or over a worker pool.

Both follow the stage contract (``stage.Stage``). Invariants (docs/design.md), each
enforced here and nowhere else:

2. At most ``max(prefetch, 1)`` batches are in flight (dispatched, not yet handed to the
   next stage); the 1 is the batch the consumer is waiting for when ``prefetch=0``.
3. No call blocks forever: every wait on the router is bounded by ``timing.EPOCH_POLL_S``,
   after which the epoch checks its deadline (``timeout``) and whether it was cancelled.

A batch sampler that raises mid-epoch ends the epoch *after* the batches it had already
yielded: they are loaded and handed out first, then its error is raised.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

from .._errors import ClosedIteratorError
from . import timing
from .router import NOT_READY, Router
from .stage import Stage
from .stats import Stats, batch_nbytes

_iter_ids = itertools.count()

Items = Iterator[Tuple[int, Sequence]]

__all__ = ["InlineEpoch", "PooledEpoch"]


class PooledEpoch(Stage):
    """One epoch's batches from a worker pool, through its ``Router``.

    It keeps only what is its own: the in-flight bound, the deadline of the batch it waits
    for, and the items still to dispatch. Everything about the pool is the router's.
    """

    def __init__(
        self,
        router: Router,
        items: Items,
        start: int,
        epoch: int,
        prefetch: int,
        timeout: Optional[float],
    ) -> None:
        self._router = router
        self._source = items
        self._iter_id = next(_iter_ids)
        self._limit = max(prefetch, 1)
        self._timeout = timeout
        self._exhausted = False
        self._items_error: Optional[BaseException] = None  # the sampler's, raised last
        self._cancelled = threading.Event()
        router.open(self._iter_id, start, epoch)
        # An epoch dropped without close() (a ``break``) still frees its batches.
        self._finalizer = weakref.finalize(self, router.close, self._iter_id)
        self._fill(prefetch)

    @property
    def in_flight(self) -> int:
        """Batches dispatched and not yet handed on (invariant 2 bounds it)."""
        return self._router.in_flight(self._iter_id)

    def _fill(self, limit: int) -> None:
        """Dispatch whole chunks of items while fewer than ``limit`` are in flight."""
        router, iter_id = self._router, self._iter_id
        chunk = router.chunk(self._limit)
        while not self._exhausted:
            in_flight = router.in_flight(iter_id)
            k = min(chunk, limit - in_flight)
            if k <= 0 or (k < chunk and in_flight > 0):
                return  # wait until a whole chunk fits, unless the pipeline is empty
            batches = self._pull(k)
            if not batches:
                return
            if in_flight + len(batches) > self._limit:  # invariant 2, where it could break
                raise RuntimeError(
                    f"internal error: {in_flight + len(batches)} batches in flight, "
                    f"more than the bound {self._limit}"
                )
            router.dispatch(iter_id, batches)

    def _pull(self, k: int) -> List[Tuple[int, Sequence]]:
        """Up to ``k`` items; an error of the batch sampler is kept for after the batches
        it yielded before it."""
        batches: List[Tuple[int, Sequence]] = []
        try:
            for _ in range(k):
                batches.append(next(self._source))
        except StopIteration:
            self._exhausted = True
        except Exception as exc:  # noqa: BLE001 - the user's sampler: raised in order, later
            self._exhausted = True
            self._items_error = exc
        return batches

    def _next(self) -> Any:
        self._fill(self._limit)
        if self._exhausted and self._router.in_flight(self._iter_id) == 0:
            error, self._items_error = self._items_error, None
            self._end()
            if error is not None:
                raise error
            raise StopIteration
        try:
            batch = self._wait()
        except BaseException:
            self._end()
            raise
        self._fill(self._limit)
        return batch

    def _wait(self) -> Any:
        # Like Gluon, the timeout runs from when the consumer starts waiting for the batch.
        started = time.monotonic()
        while True:
            if self._cancelled.is_set():
                raise ClosedIteratorError("the loader iterator was closed while waiting")
            wait = timing.EPOCH_POLL_S
            if self._timeout is not None:
                elapsed = time.monotonic() - started
                if elapsed > self._timeout:
                    raise self._router.timed_out(self._iter_id, elapsed, self._timeout)
                wait = min(wait, self._timeout - elapsed)
            batch = self._router.take(self._iter_id, wait)
            if batch is not NOT_READY:
                return batch

    def cancel(self) -> None:
        """Make a ``__next__`` waiting on another thread raise ``ClosedIteratorError``
        within ``timing.EPOCH_POLL_S``."""
        self._cancelled.set()

    def _release(self) -> None:
        self._finalizer()  # router.close: frees buffered batches, stops routing


class InlineEpoch(Stage):
    """``num_workers=0``: load each batch in the calling thread. An error loading a batch
    reaches the caller, and the next ``next()`` goes on with the following batch."""

    def __init__(self, items: Items, make: Callable[[Sequence], Any], stats: Stats) -> None:
        self._source = items
        self._make = make
        self._stats = stats

    def _next(self) -> Any:
        _, indices = next(self._source)  # at the end, the stage ends (``Stage.__next__``)
        batch = self._make(indices)
        self._stats.bytes += batch_nbytes(batch)
        return batch
