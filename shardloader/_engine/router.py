"""The router: the one door between the epochs and their worker pool.

An epoch (``epoch.PooledEpoch``) never sees the pool. It talks to the router in four verbs,
and every batch comes back to it as a return value:

``open(iter_id, start, epoch)``
    Start routing an epoch's results: the router keeps one reorder buffer per open epoch,
    and its epoch number (what the workers seed from).
``dispatch(iter_id, batches)``
    Send batches ``(seq, indices)`` to the workers; they join the registry of outstanding
    work (``in_flight``).
``take(iter_id, wait_s)``
    The epoch's next batch in sampler order, already received, reordered and materialised,
    with its bytes counted; or ``NOT_READY`` if it did not arrive within ``wait_s``. While
    it waits, the router reads the pool for every open epoch (several may be open on one
    pool: ``it1 = iter(loader); it2 = iter(loader)``).
``close(iter_id)``
    Stop routing the epoch; its buffered batches are freed now, and results still on their
    way are freed as they arrive.

Everything about the pool stays in here, with one writer: worker death and restart
(``on_worker_death``), the registry of outstanding work (``(iter_id, seq) -> indices``,
read by dispatch, restart, timeouts, error messages and the epochs' in-flight bound; the
pools know only which batches each worker owes, as keys, and a ``WorkerLost`` names those
keys), task sizing (several
tiny batches to one message), and whether the pool must be rebuilt (``healthy``). A lock
makes each verb atomic, so epochs on different threads share one router safely.

A child made with ``os.fork()`` inherits a copy of the router, and of its pool's pipes and
lock: there ``close`` does nothing (an inherited epoch's finalizer runs it at the child's
exit, and the lock may have been held by a thread of the parent at the fork), and the pool
reports itself closed, so the child's next epoch gets a router of its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .._errors import (
    ClosedIteratorError,
    LoaderTimeoutError,
    WorkerDiedError,
    describe_exitcode,
    short_indices,
)
from . import timing
from .pools import Pool
from .protocol import LocalFailure, Result, Task, WorkerLost
from .reorder import ReorderBuffer
from .stats import Stats, batch_nbytes

# How often on_worker_death='restart' re-sends one batch whose worker died.
_MAX_RESTARTS_PER_BATCH = 2
# Weight of the newest batch in the running mean of worker time per batch.
_EMA_WEIGHT = 0.1

__all__ = ["NOT_READY", "Router"]


class _NotReady:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<batch not ready>"


NOT_READY = _NotReady()


class _Route:
    """One open epoch, as the router sees it: its part of the registry of outstanding work."""

    __slots__ = ("buffer", "epoch", "pending", "deaths", "error")

    def __init__(self, start: int, epoch: int) -> None:
        self.buffer = ReorderBuffer(start=start)
        self.epoch = epoch
        self.pending: Dict[int, Sequence] = {}  # seq -> indices: dispatched, not arrived
        self.deaths: Dict[int, int] = {}  # seq -> workers that died owing it
        self.error: Optional[BaseException] = None  # ends the epoch once its batches are out


class Router:
    """A worker pool and the epochs it serves (see the module docstring for the verbs).

    Parameters
    ----------
    pool : Pool
        A ``pools.ProcessPool`` or ``pools.ThreadPool``; the router owns it from now on.
    on_worker_death : {'raise', 'restart'}
        What a dead worker process means: an error for every open epoch, or a new worker
        and the lost batches sent again.
    stats : Stats
        The loader's counters (bytes, worker time, reorder depth).
    """

    def __init__(self, pool: Pool, on_worker_death: str, stats: Stats) -> None:
        self._pool = pool
        self._on_worker_death = on_worker_death
        self._stats = stats
        self._routes: Dict[int, _Route] = {}
        self._broken: Optional[BaseException] = None  # why the pool must be rebuilt
        self._mean_busy_s: Optional[float] = None
        self._lock = threading.RLock()
        self._owner = os.getpid()

    # -- the pool's state
    @property
    def healthy(self) -> bool:
        """Whether the pool can serve another epoch (no lost worker, stuck batch or
        interrupted pipe I/O since it started)."""
        return self._broken is None and not self._pool.closed

    @property
    def kind(self) -> str:
        """``"process"`` or ``"thread"``."""
        return self._pool.kind

    def pids(self) -> List[int]:
        return self._pool.pids()

    def shutdown(self) -> None:
        """Stop the workers and release their shared memory; idempotent."""
        self._pool.close()

    # -- the verbs
    def open(self, iter_id: int, start: int, epoch: int) -> None:
        with self._lock:
            self._routes[iter_id] = _Route(start, epoch)

    def close(self, iter_id: int) -> None:
        """Stop routing ``iter_id``'s results and free the batches it buffered; idempotent.
        Also what an abandoned epoch's finalizer runs; a no-op in a child made with
        ``os.fork()``, where the batches and the pool are the parent's."""
        if os.getpid() != self._owner:
            return
        with self._lock:
            route = self._routes.pop(iter_id, None)
            if route is None:
                return
            for _, result in route.buffer.drain():
                self._pool.discard(result)
            self._stats.reorder_depth = 0

    def chunk(self, limit: int) -> int:
        """Batches per task: 1, or a worker's share of ``limit`` when batches are tiny."""
        mean = self._mean_busy_s
        if mean is None or mean >= timing.TINY_BATCH_S:
            return 1
        return max(1, limit // self._pool.num_workers)

    def in_flight(self, iter_id: int) -> int:
        """Batches of ``iter_id`` dispatched and not yet taken."""
        route = self._routes.get(iter_id)
        return 0 if route is None else len(route.pending) + len(route.buffer)

    def dispatch(self, iter_id: int, batches: List[Tuple[int, Sequence]]) -> None:
        with self._lock:
            route = self._live_route(iter_id)
            for seq, indices in batches:
                route.pending[seq] = indices
            with self._io():
                self._pool.submit(Task(iter_id, route.epoch, batches))

    def take(self, iter_id: int, wait_s: float) -> Any:
        """The next batch of ``iter_id`` in order, or ``NOT_READY`` after ``wait_s``.

        Raises the error of a batch that failed in its worker (the epoch should end), or a
        ``WorkerDiedError`` once a lost worker's batches are all that is left.
        """
        with self._lock:
            route = self._live_route(iter_id)
            if not route.buffer.ready():
                if route.error is None:
                    self._pump(wait_s)
                if not route.buffer.ready():
                    if route.error is not None:
                        raise route.error
                    return NOT_READY
            result = route.buffer.pop()
            self._stats.reorder_depth = len(route.buffer)
            if not result.ok:
                raise result.payload.rebuild()
            before = self._pool.bytes_delivered
            batch = self._pool.materialize(result)
        delivered = self._pool.bytes_delivered - before
        self._stats.bytes += delivered if delivered else batch_nbytes(batch)
        return batch

    def timed_out(self, iter_id: int, elapsed: float, timeout: float) -> LoaderTimeoutError:
        """The error for ``iter_id``'s next batch not arriving within ``timeout``; the pool
        is marked for rebuilding (a worker may be stuck on it)."""
        with self._lock:
            route = self._live_route(iter_id)
            seq = route.buffer.next_seq
            indices = route.pending.get(seq)
            kind = self._pool.kind
            causes = "a slow dataset __getitem__ or batchify_fn (raise timeout=...)"
            if kind == "process":
                causes += ", a worker stuck on a lock or I/O, or a system out of memory"
            error = LoaderTimeoutError(
                f"batch {seq} (indices {short_indices(indices)}) was not ready after "
                f"{elapsed:.1f}s (timeout={timeout}s, {kind} workers)."
                f"{self._held_up_by(iter_id, seq)} Likely causes: {causes}. The workers "
                f"will be restarted on the next epoch.",
                seq=seq,
                indices=indices,
                elapsed=elapsed,
            )
            self._break(error)
            return error

    # -- inside
    def _held_up_by(self, iter_id: int, seq: int) -> str:
        """What a timeout message adds when another batch holds the pool's first-batch turn
        (thread workers make their first batch one at a time): the batch waited for cannot
        be made before that one, so that one is where to look."""
        turn = self._pool.first_batch_turn()
        if turn is None or turn.batch is None or turn.batch == (iter_id, seq):
            return ""
        holder_iter, holder_seq = turn.batch
        whose = "" if holder_iter == iter_id else " of another epoch"
        return (
            f" It waits for the pool's first batch: thread workers make that one alone, "
            f"before any other (lazy set-up is not thread-safe), and it is batch "
            f"{holder_seq}{whose} (indices {short_indices(turn.indices)}), in the making for "
            f"{time.monotonic() - turn.since:.1f}s: look there."
        )

    def _live_route(self, iter_id: int) -> _Route:
        route = self._routes.get(iter_id)
        if route is None:  # closed by another thread (or its finalizer) meanwhile
            raise ClosedIteratorError("the loader iterator was closed while waiting")
        return route

    def _break(self, error: BaseException) -> None:
        if self._broken is None:
            self._broken = error

    @contextlib.contextmanager
    def _io(self) -> Iterator[None]:
        """Pool I/O that an exception (Ctrl-C above all) interrupts may leave a message half
        sent or half read: the pool's pipes are then out of step, so it is never used
        again (the next epoch starts fresh workers)."""
        try:
            yield
        except BaseException as exc:
            self._break(exc)
            raise

    def _pump(self, wait_s: float) -> None:
        """Read the pool once (up to ``wait_s``) and route what arrived to its epochs."""
        with self._io():
            results, lost = self._pool.poll(max(wait_s, 0.0))
        for r in results:
            self._account(r)
            route = self._routes.get(r.iter_id)
            if route is None:
                self._pool.discard(r)  # its epoch was closed: free the slot
                continue
            indices = route.pending.pop(r.seq, None)
            route.deaths.pop(r.seq, None)
            if isinstance(r.payload, LocalFailure):  # an error made here: it names the indices
                r = r._replace(payload=r.payload.resolve(indices))
            route.buffer.put(r.seq, r)
            depth = len(route.buffer)
            self._stats.reorder_depth = depth
            if depth > self._stats.max_reorder_depth:
                self._stats.max_reorder_depth = depth
        for death in lost:
            self._handle_death(death)

    def _account(self, r: Result) -> None:
        busy = self._stats.worker_busy_s
        busy[r.worker_id] = busy.get(r.worker_id, 0.0) + r.busy_s
        if r.ok:
            mean = self._mean_busy_s
            self._mean_busy_s = r.busy_s if mean is None else mean + _EMA_WEIGHT * (r.busy_s - mean)

    def _handle_death(self, death: WorkerLost) -> None:
        """A worker died (a process) or stopped on an error outside a batch (a thread).
        With ``on_worker_death='restart'`` a process is replaced and its batches re-sent;
        otherwise, or when that fails, every open epoch fails with ``WorkerDiedError`` and
        the pool is marked broken, so the next epoch starts a new one. Nothing in here may
        leave a pool short of a worker without saying so."""
        # The batches it owed, from the registry (a closed epoch's are nobody's concern).
        lost: List[Tuple[int, int, Sequence]] = []
        for iter_id, seq in death.batches:
            route = self._routes.get(iter_id)
            if route is not None and seq in route.pending:
                route.deaths[seq] = route.deaths.get(seq, 0) + 1
                lost.append((iter_id, seq, route.pending[seq]))
        spent = [x for x in lost if self._routes[x[0]].deaths[x[1]] > _MAX_RESTARTS_PER_BATCH]
        retry = not spent
        if self._on_worker_death == "restart" and retry and self._pool.can_restart:
            try:
                with self._io():
                    self._pool.restart(death.worker_id)
                    for iter_id, seq, indices in lost:  # one task each: a poison batch alone
                        self._pool.submit(
                            Task(iter_id, self._routes[iter_id].epoch, [(seq, indices)])
                        )
            except BaseException as exc:
                self._fail_all(exc)  # the pool is short of a worker: rebuild it
                raise
            return
        # The batch that killed workers too often is the one the error names first.
        self._fail_all(_death_error(death, spent + [x for x in lost if x not in spent], retry))

    def _fail_all(self, error: BaseException) -> None:
        self._break(error)
        for route in self._routes.values():
            if route.error is None:
                route.error = error


def _death_error(death: WorkerLost, lost: List[Tuple[int, int, Sequence]], retry: bool):
    """The ``WorkerDiedError`` for a worker that died (or a thread that stopped) owing
    ``lost``, a list of ``(iter_id, seq, indices)``."""
    what = ", ".join(f"batch {s} (indices {short_indices(i)})" for _, s, i in lost[:4])
    traceback_text = ""
    if death.error is not None:  # it raised outside any batch (worker_init_fn, seeding)
        traceback_text = death.error.traceback_text
        kind = "thread" if death.pid is None else "process"
        rule = (
            "a thread is not restarted"
            if death.pid is None
            else "a worker whose start failed is not restarted"
        )
        message = (
            f"{kind} worker {death.worker_id} stopped: {death.where} raised "
            f"{death.error.type_name}: {death.error.message}. It owed "
            f"{what or 'no batch'}. The pool will be rebuilt for the next epoch ({rule}, "
            f"whatever on_worker_death says).\n"
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
                " A SIGKILL often means the OOM killer: reduce num_workers, prefetch or batch_size."
            )
        message = (
            f"worker {death.worker_id} (pid {death.pid}) "
            f"{describe_exitcode(death.exitcode)} while loading {what or 'no batch'}. "
            f"{advice}"
        )
    return WorkerDiedError(
        message,
        pid=death.pid,
        exitcode=death.exitcode,
        worker_id=death.worker_id,
        seq=lost[0][1] if lost else None,
        indices=lost[0][2] if lost else None,
        remote_traceback=traceback_text,
    )
