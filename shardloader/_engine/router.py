"""Result routing, worker death and restart: what stands between a pool and its epochs.

A ``Router`` owns a pool (``pools``) and the map from iterator ids to the open epochs
(``epoch.PooledEpoch``). Several epochs may be open on one pool at once (``it1 =
iter(loader); it2 = iter(loader)``): whichever is waiting reads the pool and delivers
everyone's results. It also sizes tasks (several tiny batches to one message), and turns a
worker's death into a restart or an error that names the worker and its batches
(docs/design.md, invariant 3).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from .._errors import WorkerDiedError, describe_exitcode, short_indices
from .protocol import Task, WorkerLost
from .stats import Stats

# Batches cheaper than this (worker time) are sent several to a task, so the per-message
# cost of waking a worker and reading its reply is shared between them.
_TINY_BATCH_S = 0.0005
# How often on_worker_death='restart' re-sends one batch whose worker died.
_MAX_RESTARTS_PER_BATCH = 2
# Weight of the newest batch in the running mean of worker time per batch.
_EMA_WEIGHT = 0.1

__all__ = ["Router"]


class Router:
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
        self._losses: Dict[Tuple[int, int], int] = {}  # (iter_id, seq) -> times its worker died

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
            epoch = self.routes.get(r.iter_id)
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
        lost = [(t.iter_id, s, i) for t in death.tasks for s, i in t.batches]
        for iter_id, seq, _ in lost:
            self._losses[(iter_id, seq)] = self._losses.get((iter_id, seq), 0) + 1
        retry = all(self._losses[(g, s)] <= _MAX_RESTARTS_PER_BATCH for g, s, _ in lost)
        if self.on_worker_death == "restart" and retry and self.pool.can_restart:
            try:
                self.pool.restart(death.worker_id)
                for task in death.tasks:
                    if task.iter_id in self.routes:
                        self.submit(task)
            except BaseException as exc:
                self.broken = exc  # the pool is short of a worker: rebuild it
                for epoch in list(self.routes.values()):
                    epoch._fail(exc)
                raise
            return
        error = _death_error(death, lost, retry)
        self.broken = error
        for epoch in list(self.routes.values()):
            epoch._fail(error)


def _death_error(death: WorkerLost, lost: List[Tuple[int, int, Sequence]], retry: bool):
    """The ``WorkerDiedError`` for a worker that died (or a thread that stopped) owing
    ``lost``, a list of ``(iter_id, seq, indices)``."""
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
                " A SIGKILL often means the OOM killer: reduce num_workers, prefetch or batch_size."
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
    return error
