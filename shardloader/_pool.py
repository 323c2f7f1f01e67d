"""Worker pools: a process pool and a thread pool that share one protocol.

Both pools take ``Task`` objects and hand back ``Result`` objects from
``poll``. The iterator above them never learns which kind it drives.

Shutdown protocol (one ordered, idempotent ``close()``, also run by ``weakref.finalize``
on garbage collection and at interpreter exit): set the stop flag; ask every worker to
exit; join each with a timeout; terminate, then kill, whatever is left; close every pipe;
unmap every shared-memory slot not still held by a batch the user kept. Joins are skipped
while the interpreter is finalizing.

Nothing here blocks indefinitely: every wait has a timeout, after which the caller checks
its own stop conditions and whether workers are alive.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import pickle
import queue
import sys
import threading
import time
import weakref
from multiprocessing import connection, reduction
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._errors import RemoteError
from ._shm import SlotTable
from ._worker import (
    BatchMaker,
    WorkerInfo,
    _info,
    process_worker_main,
    seed_thread_worker,
)

# Grace period for a worker to exit after being asked to.
_JOIN_TIMEOUT_S = 2.0
# After SIGTERM, how long before SIGKILL.
_TERMINATE_TIMEOUT_S = 1.0
# How often an idle thread worker rechecks the stop flag.
_THREAD_POLL_INTERVAL_S = 0.1

_worker_keys = itertools.count()


class Task(NamedTuple):
    """A unit of work: one or more consecutive batches of one epoch."""

    gen: int
    epoch: int
    batches: List[Tuple[int, Sequence]]  # (seq, indices)


class Result(NamedTuple):
    gen: int
    seq: int
    ok: bool
    payload: Any  # batch data, a transport handle, or a RemoteError
    busy_s: float
    worker_id: int
    worker_key: int


class WorkerLost(NamedTuple):
    """A worker process that ended while it owed batches."""

    worker_id: int
    pid: Optional[int]
    exitcode: Optional[int]
    tasks: List[Task]


def _fresh_entropy() -> int:
    """Seed material for workers when the user gave no seed: distinct on every call."""
    return int.from_bytes(os.urandom(7), "little")


def _finalizing() -> bool:
    return sys.is_finalizing()


# ----------------------------------------------------------------------------- processes


class _ProcWorker:
    __slots__ = ("id", "key", "process", "conn", "tasks")

    def __init__(self, worker_id: int, key: int, process, conn) -> None:
        self.id, self.key, self.process, self.conn = worker_id, key, process, conn
        self.tasks: Dict[Tuple[int, int], Task] = {}  # (gen, first seq) -> task


def _shutdown_processes(workers: Dict[int, _ProcWorker], table) -> None:
    """Idempotent teardown shared by close() and the garbage-collection finalizer."""
    procs = list(workers.values())
    workers.clear()
    for w in procs:
        try:
            w.conn.send_bytes(pickle.dumps(None))
        except (OSError, ValueError):
            pass
    if not _finalizing():
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for w in procs:
            w.process.join(max(0.0, deadline - time.monotonic()))
    for w in procs:
        if w.process.is_alive():
            w.process.terminate()
    for w in procs:
        if not _finalizing():
            w.process.join(_TERMINATE_TIMEOUT_S)
        _reap(w)
    table.close()


class ProcessPool:
    """``num_workers`` processes, each given the dataset once, at start-up."""

    kind = "process"

    def __init__(
        self,
        num_workers: int,
        dataset: Any,
        batchify_fn: Callable,
        *,
        raw: bool,
        seed: Optional[int],
        worker_init_fn: Optional[Callable],
        start_method: str,
        mxnet_per_sample: bool = False,
    ) -> None:
        self._mxnet_per_sample = mxnet_per_sample
        self.num_workers = num_workers
        self._dataset = dataset
        self._batchify_fn = batchify_fn
        self._raw = raw
        self._seed = seed
        self._worker_init_fn = worker_init_fn
        self._ctx = mp.get_context(start_method)
        self._entropy = _fresh_entropy()
        self._workers: Dict[int, _ProcWorker] = {}
        self._table = SlotTable()
        self._lock = threading.RLock()
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown_processes, self._workers, self._table)
        for worker_id in range(num_workers):
            self._spawn(worker_id)

    # -- lifecycle
    def _spawn(self, worker_id: int, entropy: Optional[int] = None) -> None:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        # A forked worker inherits the main process's ends of its siblings' pipes; it
        # closes them so that only the main process holds them.
        siblings = [w.conn.fileno() for w in self._workers.values()]
        if self._ctx.get_start_method() != "fork":
            siblings = []
        process = self._ctx.Process(
            target=process_worker_main,
            args=(
                worker_id,
                self.num_workers,
                child_conn,
                self._dataset,
                self._batchify_fn,
                self._raw,
                self._seed,
                self._entropy if entropy is None else entropy,
                self._worker_init_fn,
                os.getpid(),
                siblings,
                self._mxnet_per_sample,
            ),
            name=f"shardloader-worker-{worker_id}",
            daemon=True,
        )
        try:
            process.start()
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            parent_conn.close()
            child_conn.close()
            raise TypeError(
                f"the dataset, batchify_fn or worker_init_fn cannot be pickled to start a "
                f"worker with start_method={self._ctx.get_start_method()!r} "
                f"({type(exc).__name__}: {exc}). Use start_method='fork' or "
                f"thread_pool=True, or make the object picklable."
            ) from exc
        child_conn.close()
        self._workers[worker_id] = _ProcWorker(worker_id, next(_worker_keys), process, parent_conn)

    def restart(self, worker_id: int) -> None:
        """Replace a dead worker with a fresh process."""
        with self._lock:
            old = self._workers.pop(worker_id, None)
            if old is not None:
                self._table.forget_worker(old.key)
                _reap(old)
            # Fresh entropy: without a seed, the new worker must not replay the draws of the
            # one it replaces (with a seed, seeding before each sample decides them anyway).
            self._spawn(worker_id, entropy=_fresh_entropy())

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._finalizer()

    def pids(self) -> List[int]:
        return [w.process.pid for w in self._workers.values()]

    # -- work
    def submit(self, task: Task) -> int:
        """Send ``task`` to the least-loaded worker; returns that worker's id."""
        with self._lock:
            w = min(self._workers.values(), key=lambda w: (len(w.tasks), w.id))
            released = self._table.take_releases(w.key)
            w.tasks[(task.gen, task.batches[0][0])] = task
            try:
                w.conn.send_bytes(
                    reduction.ForkingPickler.dumps(
                        ("task",) + tuple(task) + (released,), pickle.HIGHEST_PROTOCOL
                    )
                )
            except (OSError, ValueError):
                pass  # the worker is dead; poll() reports it with this task as lost
            self._send_urgent_releases()
            return w.id

    def _send_urgent_releases(self) -> None:
        by_key = {w.key: w for w in self._workers.values()}
        for key in self._table.urgent():
            w = by_key.get(key)
            released = self._table.take_releases(key) if w is not None else []
            if released:
                try:
                    w.conn.send_bytes(pickle.dumps(("release", released)))
                except (OSError, ValueError):
                    pass  # dead: poll() will say so

    def poll(self, timeout: float) -> Tuple[List[Result], List[WorkerLost]]:
        """Wait up to ``timeout`` seconds for results or worker deaths."""
        with self._lock:
            self._send_urgent_releases()
            results: List[Result] = []
            # Fast path: replies already waiting cost one poll() each, no selector.
            for w in list(self._workers.values()):
                if w.conn.poll(0) and self._receive(w, results):
                    continue
            if results:
                return results, []
            by_fd = {}
            for w in self._workers.values():
                by_fd[w.conn] = w
                by_fd[w.process.sentinel] = w
            ready = connection.wait(list(by_fd), timeout) if by_fd else []
            lost: List[WorkerLost] = []
            dead = []
            for obj in ready:
                w = by_fd[obj]
                if obj is w.conn:
                    if not self._receive(w, results):
                        dead.append(w)
                elif w not in dead:
                    dead.append(w)
            for w in dead:
                while self._receive(w, results, block=False):
                    pass
                lost.append(self._bury(w))
            return results, lost

    def _receive(self, w: _ProcWorker, results: List[Result], block: bool = True) -> bool:
        """Read one message from ``w``; False when its pipe is closed (it died)."""
        try:
            if not block and not w.conn.poll(0):
                return False
            batch_results, new_slots, dropped = pickle.loads(w.conn.recv_bytes())
            for slot_id, capacity in new_slots:
                self._table.adopt(w.key, slot_id, reduction.recv_handle(w.conn), capacity)
        except (EOFError, OSError):
            return False
        self._table.drop(w.key, dropped)
        for gen, seq, ok, payload, busy in batch_results:
            self._finish_task(w, gen, seq)
            if ok:
                self._table.received(w.key, payload[1])
            results.append(Result(gen, seq, ok, payload, busy, w.id, w.key))
        return True

    @staticmethod
    def _finish_task(w: _ProcWorker, gen: int, seq: int) -> None:
        for key, task in list(w.tasks.items()):
            if key[0] == gen and any(s == seq for s, _ in task.batches):
                remaining = [(s, i) for s, i in task.batches if s != seq]
                del w.tasks[key]
                if remaining:
                    w.tasks[(gen, remaining[0][0])] = Task(gen, task.epoch, remaining)
                return

    def _bury(self, w: _ProcWorker) -> WorkerLost:
        self._workers.pop(w.id, None)
        pid = w.process.pid
        w.process.join(_TERMINATE_TIMEOUT_S)
        exitcode = w.process.exitcode
        self._table.forget_worker(w.key)
        _reap(w)
        return WorkerLost(w.id, pid, exitcode, list(w.tasks.values()))

    def materialize(self, result: Result) -> Any:
        skeleton, slot_id = result.payload
        return self._table.materialize(result.worker_key, slot_id, skeleton)

    def discard(self, result: Result) -> None:
        if result.ok:
            self._table.discard(result.worker_key, result.payload[1])

    @property
    def bytes_delivered(self) -> int:
        return self._table.bytes_delivered


def _reap(w: _ProcWorker) -> None:
    """Kill ``w`` if it still runs, wait for it, and close its pipe and process handle."""
    if w.process.is_alive():
        w.process.kill()
        w.process.join(_TERMINATE_TIMEOUT_S)
    try:
        w.conn.close()
    except OSError:
        pass
    try:
        w.process.close()
    except ValueError:
        pass


# ------------------------------------------------------------------------------- threads


def _thread_main(
    worker_id: int,
    num_workers: int,
    maker: BatchMaker,
    seed: Optional[int],
    entropy: int,
    worker_init_fn: Optional[Callable],
    tasks: queue.Queue,
    results: queue.Queue,
    stop: threading.Event,
) -> None:
    _info.value = WorkerInfo(worker_id, num_workers, seed, maker.dataset)
    seed_thread_worker(worker_id, seed, entropy)
    if worker_init_fn is not None:
        worker_init_fn(worker_id)
    while not stop.is_set():
        try:
            task = tasks.get(timeout=_THREAD_POLL_INTERVAL_S)
        except queue.Empty:
            continue
        if task is None:
            return
        for seq, indices in task.batches:
            if stop.is_set():
                return
            start = time.perf_counter()
            try:
                batch, ok = maker.make(indices, task.epoch), True
            except Exception as exc:  # noqa: BLE001 - errors travel to the consumer as data
                batch, ok = RemoteError.capture(exc, worker_id, seq, indices), False
            results.put(
                Result(task.gen, seq, ok, batch, time.perf_counter() - start, worker_id, worker_id)
            )
            del batch


def _shutdown_threads(
    threads: List[threading.Thread], tasks: queue.Queue, stop: threading.Event
) -> None:
    stop.set()
    for _ in threads:
        tasks.put(None)
    if not _finalizing():
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
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
        **_ignored,
    ) -> None:
        self.num_workers = num_workers
        maker = BatchMaker(
            dataset, batchify_fn, seed, shared_process=True, mxnet_per_sample=mxnet_per_sample
        )
        self._tasks: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._closed = False
        self._bytes = 0
        entropy = _fresh_entropy()
        self._threads = [
            threading.Thread(
                target=_thread_main,
                args=(
                    i,
                    num_workers,
                    maker,
                    seed,
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
        self._finalizer = weakref.finalize(
            self, _shutdown_threads, self._threads, self._tasks, self._stop
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._finalizer()

    def submit(self, task: Task) -> int:
        self._tasks.put(task)
        return -1

    def poll(self, timeout: float) -> Tuple[List[Result], List[WorkerLost]]:
        out: List[Result] = []
        try:
            out.append(self._results.get(timeout=timeout))
            while True:
                out.append(self._results.get_nowait())
        except queue.Empty:
            pass
        return out, []

    def restart(self, worker_id: int) -> None:  # threads do not die on their own
        raise RuntimeError("thread workers cannot be restarted")

    def pids(self) -> List[int]:
        return []

    def materialize(self, result: Result) -> Any:
        return result.payload

    def discard(self, result: Result) -> None:
        pass

    @property
    def bytes_delivered(self) -> int:
        return self._bytes
