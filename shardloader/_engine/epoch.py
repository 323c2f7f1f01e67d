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

import contextlib
import itertools
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .._errors import (
    ClosedIteratorError,
    LoaderTimeoutError,
    WorkerDiedError,
    describe_exitcode,
    short_indices,
)
from .pools import Result, Task, WorkerLost
from .reorder import ReorderBuffer

# Longest single wait on the pool before re-checking deadlines and worker health.
_POLL_INTERVAL_S = 0.25
# Batches cheaper than this (worker time) are sent several to a task, so the per-message
# cost of waking a worker and reading its reply is shared between them.
_TINY_BATCH_S = 0.0005
# How often on_worker_death='restart' re-sends one batch whose worker died.
_MAX_RESTARTS_PER_BATCH = 2
# Weight of the newest batch in the running mean of worker time per batch.
_EMA_WEIGHT = 0.1

_generations = itertools.count()


class Stats:
    """Counters the loader keeps for ``ShardedDataLoader.stats``. Updating them costs
    a few attribute writes per batch."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.batches = 0
        self.bytes = 0
        self.wait_s = 0.0
        self.first_batch_s: Optional[float] = None
        # Set when the consumer first asks for a batch, so start-up counts as waiting.
        self.started: Optional[float] = None
        self.worker_busy_s: Dict[int, float] = {}
        self.max_reorder_depth = 0
        self.reorder_depth = 0
        # Samples the batch sampler repeated to fill a step; the sampler adds to it.
        self.repeated_samples = 0

    def snapshot(self) -> Dict[str, Any]:
        started = self.started if self.started is not None else time.perf_counter()
        wall = max(time.perf_counter() - started, 1e-9)
        return {
            "batches": self.batches,
            "bytes": self.bytes,
            "wait_s": self.wait_s,
            "wall_s": wall,
            "data_stall": min(1.0, self.wait_s / wall),
            "first_batch_s": self.first_batch_s,
            "worker_busy_s": dict(self.worker_busy_s),
            "reorder_depth": self.reorder_depth,
            "max_reorder_depth": self.max_reorder_depth,
            "repeated_samples": self.repeated_samples,
        }


class Hub:
    """A pool plus the routing of its results to the epochs that asked for them.

    Several epochs may be open on one pool at once (``it1 = iter(loader); it2 =
    iter(loader)``); whichever is waiting reads the pool and delivers everyone's results.
    """

    def __init__(self, pool, on_worker_death: str, stats: Stats) -> None:
        self.pool = pool
        self.on_worker_death = on_worker_death
        self.stats = stats
        # Weak, so an epoch the user abandoned (``break``) is collected and frees its batches.
        self.routes: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.broken: Optional[BaseException] = None  # why the pool must be rebuilt
        self.mean_busy_s: Optional[float] = None
        self._losses: Dict[Tuple[int, int], int] = {}  # (gen, seq) -> times its worker died

    def chunk(self, limit: int) -> int:
        """Batches per task: 1, or a worker's share of ``limit`` when batches are tiny."""
        mean = self.mean_busy_s
        if mean is None or mean >= _TINY_BATCH_S:
            return 1
        return max(1, limit // self.pool.num_workers)

    def submit(self, task: Task) -> None:
        with self._io():
            self.pool.submit(task)

    @contextlib.contextmanager
    def _io(self) -> Iterator[None]:
        """Pool I/O that an exception (Ctrl-C above all) interrupts may leave a message half
        sent or half read: the pool's pipes are then out of step, so it is never used
        again (the next epoch starts fresh workers)."""
        try:
            yield
        except BaseException as exc:
            if self.broken is None:
                self.broken = exc
            raise

    def pump(self, timeout: float) -> None:
        with self._io():
            results, lost = self.pool.poll(timeout)
        for r in results:
            busy = self.stats.worker_busy_s
            busy[r.worker_id] = busy.get(r.worker_id, 0.0) + r.busy_s
            if r.ok:
                mean = self.mean_busy_s
                self.mean_busy_s = (
                    r.busy_s if mean is None else (mean + _EMA_WEIGHT * (r.busy_s - mean))
                )
            epoch = self.routes.get(r.gen)
            if epoch is None:
                self.pool.discard(r)  # its epoch was closed: free the slot
            else:
                epoch._accept(r)
        for death in lost:
            self._handle_death(death)

    def _handle_death(self, death: WorkerLost) -> None:
        """A worker died (a process) or stopped on an error outside a batch (a thread).
        With ``on_worker_death='restart'`` a process is replaced and its batches re-sent;
        otherwise, or when that fails, every open epoch fails with ``WorkerDiedError`` and
        the pool is marked broken, so the next epoch starts a new one. Nothing in here may
        leave a pool short of a worker without saying so."""
        lost = [(t.gen, s, i) for t in death.tasks for s, i in t.batches]
        for gen, seq, _ in lost:
            self._losses[(gen, seq)] = self._losses.get((gen, seq), 0) + 1
        retry = all(self._losses[(g, s)] <= _MAX_RESTARTS_PER_BATCH for g, s, _ in lost)
        if self.on_worker_death == "restart" and retry and self.pool.can_restart:
            try:
                self.pool.restart(death.worker_id)
                for task in death.tasks:
                    if task.gen in self.routes:
                        self.submit(task)
            except BaseException as exc:
                self.broken = exc  # the pool is short of a worker: rebuild it
                for epoch in list(self.routes.values()):
                    epoch._fail(exc)
                raise
            return
        what = ", ".join(f"batch {s} (indices {short_indices(i)})" for _, s, i in lost[:4])
        traceback_text = ""
        if death.error is not None:  # a thread worker: it raised outside any batch
            traceback_text = death.error.traceback_text
            message = (
                f"thread worker {death.worker_id} stopped: {death.where} raised "
                f"{death.error.type_name}: {death.error.message}. It owed "
                f"{what or 'no batch'}. The pool will be rebuilt for the next epoch (a "
                f"thread is not restarted, whatever on_worker_death says).\n"
                f"Original traceback (most recent call last, in the worker):\n"
                f"{traceback_text.rstrip()}"
            )
        else:
            if retry:
                advice = (
                    "The pool will be rebuilt for the next epoch; pass "
                    "on_worker_death='restart' to replace the worker and finish the epoch."
                )
            else:
                advice = (
                    f"That batch killed a worker {_MAX_RESTARTS_PER_BATCH + 1} times, so it "
                    f"was not retried again: the fault is in loading it, not in the worker."
                )
            if death.exitcode == -9:
                advice += (
                    " A SIGKILL often means the OOM killer: reduce num_workers, prefetch or "
                    "batch_size."
                )
            message = (
                f"worker {death.worker_id} (pid {death.pid}) "
                f"{describe_exitcode(death.exitcode)} while loading {what or 'no batch'}. "
                f"{advice}"
            )
        error = WorkerDiedError(
            message,
            pid=death.pid,
            exitcode=death.exitcode,
            worker_id=death.worker_id,
            seq=lost[0][1] if lost else None,
            indices=lost[0][2] if lost else None,
            remote_traceback=traceback_text,
        )
        self.broken = error
        for epoch in list(self.routes.values()):
            epoch._fail(error)


class PooledEpoch:
    """Iterates one epoch's batches through a ``Hub``."""

    def __init__(
        self,
        hub: Hub,
        items: Iterator[Tuple[int, Sequence]],
        start: int,
        epoch: int,
        prefetch: int,
        timeout: Optional[float],
        stats: Stats,
    ) -> None:
        self._hub = hub
        self._items = items
        self._epoch = epoch
        self._gen = next(_generations)
        self._limit = max(prefetch, 1)
        self._timeout = timeout
        self._stats = stats
        self._buffer = ReorderBuffer(start=start)
        self._sent: Dict[int, Tuple[float, Sequence]] = {}  # seq -> (dispatch time, indices)
        self._exhausted = False
        self._error: Optional[BaseException] = None
        self._closed = False
        self._user_closed = False
        hub.routes[self._gen] = self
        self._finalizer = weakref.finalize(
            self, _abandon, hub.routes, self._gen, self._buffer, hub.pool, stats
        )
        self._fill(prefetch)

    # -- called by the hub
    def _accept(self, result: Result) -> None:
        if self._closed:
            self._hub.pool.discard(result)
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
        chunk = self._hub.chunk(self._limit)
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
            self._hub.submit(Task(self._gen, self._epoch, batches))

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
        pool = self._hub.pool
        before = pool.bytes_delivered
        batch = pool.materialize(result)
        delivered = pool.bytes_delivered - before
        self._stats.bytes += delivered if delivered else walk_nbytes(batch)
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
                    self._hub.broken = self._timeout_error(seq, indices, elapsed)
                    raise self._hub.broken
                wait = min(_POLL_INTERVAL_S, self._timeout - elapsed)
            else:
                wait = _POLL_INTERVAL_S
            self._hub.pump(max(wait, 0.0))
        result = buffer.pop()
        self._stats.reorder_depth = len(buffer)
        return result

    def _timeout_error(self, seq: int, indices, elapsed: float) -> LoaderTimeoutError:
        kind = self._hub.pool.kind
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


def _abandon(routes, gen: int, buffer: ReorderBuffer, pool, stats: Stats) -> None:
    """End an epoch: stop routing its results and free the batches it buffered. Runs on
    close, at the end of the epoch, or when an abandoned epoch is garbage collected."""
    routes.pop(gen, None)
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
        self._stats.bytes += walk_nbytes(batch)
        return batch

    def close(self) -> None:
        self._closed = True


def walk_nbytes(batch: Any) -> int:
    """Bytes of every array leaf in a batch (for stats)."""
    if isinstance(batch, (list, tuple)):
        return sum(walk_nbytes(b) for b in batch)
    if isinstance(batch, dict):
        return sum(walk_nbytes(b) for b in batch.values())
    if getattr(batch, "stype", "default") != "default":  # sparse: its stored values
        return walk_nbytes(batch.data)
    size = getattr(batch, "size", None)
    dtype = getattr(batch, "dtype", None)
    if size is None or dtype is None:
        return 0
    try:
        return int(size) * np.dtype(dtype).itemsize
    except (TypeError, NotImplementedError):
        return 0


__all__: List[str] = ["Hub", "PooledEpoch", "InlineEpoch", "Stats"]
