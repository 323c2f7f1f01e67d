"""The thread pool: ``num_workers`` daemon threads sharing the dataset, behind the same
protocol as the process pool (``pools.Pool``). A batch is handed over as it is, with no
copy; a thread that stops on an error outside a batch is reported as a lost worker and
never restarted.

A thread cannot be killed: one stuck in a sample when the pool closes (after a
``LoaderTimeoutError``, the next epoch closes it) is waited for up to
``timing.JOIN_TIMEOUT_S`` and then left to finish on its own. The batch it makes then is
dropped as it is put, and a closed pool keeps no result: an old epoch iterator or a kept
error that still refers to the pool holds no batch.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Tuple

from .. import timing
from ..batch import BatchMaker, FirstBatchTurn
from ..protocol import Result, Task, WorkerLost
from ..worker import WorkerInfo, drop_results, thread_worker_main
from .base import finalizing, fresh_entropy


def _shutdown_threads(
    threads: List[threading.Thread],
    tasks: queue.Queue,
    results: queue.Queue,
    stop: threading.Event,
    owner: int,
) -> None:
    if os.getpid() != owner:
        return  # a child made with os.fork(): the threads (and the queue's users) stay behind
    stop.set()
    drop_results(results)  # (a thread that puts one after this drops it itself)
    for _ in threads:
        tasks.put(None)
    if not finalizing():
        deadline = time.monotonic() + timing.JOIN_TIMEOUT_S
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
    threads.clear()


class ThreadPool:
    """``num_workers`` daemon threads sharing the dataset; same protocol as ProcessPool."""

    kind = "thread"

    def __init__(
        self,
        num_workers: int,
        dataset: Any,
        batchify_fn: Callable,
        *,
        seed,
        worker_init_fn: Optional[Callable],
        mxnet_per_sample: bool = False,
        numpy_flags: Optional[Tuple[bool, bool]] = None,
        **_ignored,
    ) -> None:
        self.num_workers = num_workers
        maker = BatchMaker(
            dataset,
            batchify_fn,
            seed,
            shared_process=True,
            mxnet_per_sample=mxnet_per_sample,
            numpy_flags=numpy_flags,
        )
        self._maker = maker
        self._tasks: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._closed = False
        self._stopped_threads = 0  # threads that ended on an error outside a batch
        entropy = fresh_entropy()
        self._threads = [
            threading.Thread(
                target=thread_worker_main,
                args=(
                    WorkerInfo(i, num_workers, seed, dataset),
                    maker,
                    entropy,
                    worker_init_fn,
                    self._tasks,
                    self._results,
                    self._stop,
                ),
                name=f"shardloader-thread-{i}",
                daemon=True,
            )
            for i in range(num_workers)
        ]
        for t in self._threads:
            t.start()
        self._owner = os.getpid()  # a forked child gets a copy of this pool, not its threads
        self._finalizer = weakref.finalize(
            self,
            _shutdown_threads,
            self._threads,
            self._tasks,
            self._results,
            self._stop,
            self._owner,
        )

    @property
    def closed(self) -> bool:
        """Closed, a thread stopped, or seen from a child made with ``os.fork()`` (the
        threads stayed in the parent): the loader starts a fresh pool for the next epoch."""
        return self._closed or self._stopped_threads > 0 or os.getpid() != self._owner

    # A thread that stopped is not replaced: its worker_init_fn would most likely fail again.
    can_restart = False

    def close(self) -> None:
        self._closed = True
        self._finalizer()

    def submit(self, task: Task) -> None:
        self._tasks.put(task)

    def poll(self, timeout: float) -> Tuple[List[Result], List[WorkerLost]]:
        out: List[Result] = []
        lost: List[WorkerLost] = []
        try:
            item = self._results.get(timeout=timeout)
            while True:
                if isinstance(item, WorkerLost):
                    self._stopped_threads += 1
                    lost.append(item)
                else:
                    out.append(item)
                item = self._results.get_nowait()
        except queue.Empty:
            pass
        return out, lost

    def restart(self, worker_id: int) -> None:
        raise RuntimeError("thread workers are not restarted")

    def pids(self) -> List[int]:
        return []

    def first_batch_turn(self) -> Optional[FirstBatchTurn]:
        return self._maker.first_batch_turn

    def materialize(self, result: Result) -> Any:
        return result.payload

    def discard(self, result: Result) -> None:
        pass

    @property
    def bytes_delivered(self) -> int:
        """Always 0: a thread's batch is handed over as it is, and the epoch counts its
        bytes itself (the process pool counts what crosses its shared memory)."""
        return 0
