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

A pool that has lost a worker it did not replace reports itself ``closed``, so the loader
never keeps a pool with fewer workers than it asked for (or none at all): the next epoch
starts a fresh one.
"""

from __future__ import annotations

import functools
import io
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

from .._errors import ReadyError, RemoteError, WorkerError, short_indices
from .ipc.shm import SlotTable
from .worker import (
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

# Every open process pool in this process: their pipes are what a forked worker must let go
# of (see _worker._forget_inheritance).
_live_pools: weakref.WeakSet[ProcessPool] = weakref.WeakSet()


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
    """A worker that ended while it owed batches: a process that exited or was killed, or
    a thread that stopped on an error outside any batch (``error``, its record)."""

    worker_id: int
    pid: Optional[int]
    exitcode: Optional[int]
    tasks: List[Task]
    error: Optional[RemoteError] = None
    where: str = ""  # for a thread: what it was doing when it stopped


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
        numpy_flags: Optional[Tuple[bool, bool]] = None,
    ) -> None:
        self._mxnet_per_sample = mxnet_per_sample
        self._numpy_flags = numpy_flags
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
        _live_pools.add(self)
        for worker_id in range(num_workers):
            self._spawn(worker_id)

    # -- lifecycle
    def _spawn(self, worker_id: int, entropy: Optional[int] = None) -> None:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        method = self._ctx.get_start_method()
        # A forked worker inherits the main process's ends of every pool's pipes (its own
        # included) and its mappings of every pool's slots: it lets go of them at once, so
        # that closing a pool frees its memory and its workers see the end of their pipes.
        foreign_fds = _inherited_fds(parent_conn) if method == "fork" else []
        # The parent-death signal follows the thread that forks: only a thread that lives as
        # long as the process (the main thread; a forkserver's) may arm it. Every worker
        # also watches the main process itself (see _worker).
        death_signal = method == "forkserver" or (
            threading.current_thread() is threading.main_thread()
        )
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
                foreign_fds,
                self._mxnet_per_sample,
                self._numpy_flags,
            ),
            kwargs=dict(
                death_signal=death_signal,
                forked_by_parent=method != "forkserver",
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
        """Closed, or missing a worker that died and was not replaced: either way the pool
        cannot serve another epoch, and the loader starts a new one."""
        return self._closed or len(self._workers) < self.num_workers

    @property
    def can_restart(self) -> bool:
        """Whether ``restart`` may replace a dead worker (not after ``close()``)."""
        return not self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            _live_pools.discard(self)
            self._finalizer()

    def pids(self) -> List[int]:
        return [w.process.pid for w in self._workers.values()]

    # -- work
    def submit(self, task: Task) -> None:
        """Send ``task`` to the least-loaded worker."""
        with self._lock:
            if not self._workers:
                # Every worker died, and each death failed the open epochs already: the
                # task has nowhere to go, and poll() refuses to wait on nothing.
                return
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
            if not self._workers:
                raise WorkerError(
                    "the worker pool has no live workers left (their deaths were reported "
                    "before); the next iter() starts a new pool"
                )
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
        """Read one message from ``w``; False when its pipe is closed (it died).

        The message's heads hold only builtin types, so they always unpickle, and say how
        many descriptors follow: all of them are read before anything else can fail, so the
        next read starts at the next message. A result whose payload does not unpickle here
        (a class only the worker can import) becomes a ``WorkerError`` for that batch; the
        results after it in the same message share its pickle memo, so they are dropped
        with it (the epoch ends at the first of them anyway). See ``_worker._send``.
        """
        fds: List[int] = []
        try:
            if not block and not w.conn.poll(0):
                return False
            heads, new_slots, dropped, payloads = pickle.loads(w.conn.recv_bytes())
            for _ in new_slots:
                fds.append(reduction.recv_handle(w.conn))
            for slot_id, capacity in new_slots:
                self._table.adopt(w.key, slot_id, fds.pop(0), capacity)  # it closes the fd
        except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError):
            for fd in fds:
                _close_fd(fd)
            return False  # the pipe is closed or out of step: the worker must go
        self._table.drop(w.key, dropped)
        if len(heads) == 1:  # the common case: the cheapest way to one object
            load_next: Callable[[], Any] = functools.partial(pickle.loads, payloads)
        else:
            load_next = pickle.Unpickler(io.BytesIO(payloads)).load
        failed: Optional[WorkerError] = None
        for n, (gen, seq, ok, busy, slot_id, _) in enumerate(heads):
            indices = self._finish_task(w, gen, seq)
            try:
                if failed is not None:
                    raise failed
                payload = load_next()
            except Exception as exc:  # noqa: BLE001 - a class only the worker can import, ...
                if ok:
                    self._table.discard(w.key, slot_id)  # the slot goes back to the worker
                if failed is None:
                    failed = _undecodable(exc, payloads, n, heads, w.id, indices)
                    error = failed
                else:
                    error = WorkerError(
                        f"batch {seq} (sample indices {short_indices(indices)}) came from "
                        f"worker {w.id} in one message with batch {failed.seq}, which could "
                        f"not be unpickled here, and was dropped with it",
                        worker_id=w.id,
                        seq=seq,
                        indices=indices,
                    )
                payload, ok = ReadyError(error), False
            else:
                if ok:
                    payload = (payload, slot_id)
                    self._table.received(w.key, slot_id)
            results.append(Result(gen, seq, ok, payload, busy, w.id, w.key))
        return True

    @staticmethod
    def _finish_task(w: _ProcWorker, gen: int, seq: int) -> Optional[Sequence]:
        """Strike batch ``seq`` from what ``w`` owes; return its indices."""
        for key, task in list(w.tasks.items()):
            if key[0] == gen and any(s == seq for s, _ in task.batches):
                remaining = [(s, i) for s, i in task.batches if s != seq]
                del w.tasks[key]
                if remaining:
                    w.tasks[(gen, remaining[0][0])] = Task(gen, task.epoch, remaining)
                return next(i for s, i in task.batches if s == seq)
        return None

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


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class _ClassMissing(Exception):
    pass


class _Probe(pickle.Unpickler):
    """Unpickles like ``pickle.loads``, but says which class could not be found."""

    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except Exception as exc:  # noqa: BLE001 - whatever the import raised
            raise _ClassMissing(f"{module}.{name}", exc) from exc


def _undecodable(exc: Exception, payloads: bytes, n: int, heads, worker_id, indices):
    """The error for result ``n`` of a message, which arrived but does not unpickle here."""
    probe = _Probe(io.BytesIO(payloads))
    missing = None
    try:
        for _ in range(n + 1):
            probe.load()
    except _ClassMissing as found:
        missing = found.args
    except Exception:  # noqa: BLE001 - it fails some other way: report exc as it is
        pass
    if missing is not None:
        name, why = missing
        cause = (
            f"it holds an object of class {name}, which cannot be imported here "
            f"({type(why).__name__}: {why})"
        )
    else:
        cause = f"{type(exc).__name__}: {exc}"
    seq, ok = heads[n][1], heads[n][2]
    what = "its batch" if ok else "its error report"
    error = WorkerError(
        f"worker {worker_id} finished batch {seq} (sample indices {short_indices(indices)}), "
        f"but {what} cannot be unpickled in the training process: {cause}. Every class whose "
        f"objects a batch holds, or that a worker raises, must be importable here as well, "
        f"under the same module name: define it in a module that both processes import (not "
        f"one only the workers load, in worker_init_fn say), or convert such objects to "
        f"builtin types or arrays in batchify_fn.",
        worker_id=worker_id,
        seq=seq,
        indices=indices,
    )
    error.__cause__ = exc
    return error


def _inherited_fds(own_parent_conn) -> List[int]:
    """This process's shardloader descriptors that a worker forked now would inherit: the
    pipe ends and process sentinels of every open pool's workers, and the new worker's own
    pipe end."""
    fds = [own_parent_conn.fileno()]
    for pool in list(_live_pools):
        for w in list(pool._workers.values()):
            try:
                fds.append(w.conn.fileno())
                fds.append(w.process.sentinel)
            except (OSError, ValueError):
                continue  # closed meanwhile
            # Under fork, multiprocessing also keeps the write end of a pipe whose read end
            # tells the worker that its parent is gone; it closes both at the end.
            closer = getattr(getattr(w.process, "_popen", None), "finalizer", None)
            fds.extend(fd for fd in getattr(closer, "_args", ()) if isinstance(fd, int))
    return fds


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
    """A thread worker. Whatever a batch raises (``SystemExit`` and ``KeyboardInterrupt``
    too) goes to the consumer as that batch's result; whatever escapes outside a batch
    (``worker_init_fn``, say) is reported as this worker's death, with the batches it still
    owed. The thread never ends without a word."""
    where, pending = "worker_init_fn", []
    try:
        _info.value = WorkerInfo(worker_id, num_workers, seed, maker.dataset)
        seed_thread_worker(worker_id, seed, entropy)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
        where = "its loop, between batches,"
        while not stop.is_set():
            try:
                task = tasks.get(timeout=_THREAD_POLL_INTERVAL_S)
            except queue.Empty:
                continue
            if task is None:
                return
            pending = list(task.batches)
            while pending:
                seq, indices = pending[0]
                if stop.is_set():
                    return
                start = time.perf_counter()
                try:
                    batch, ok = maker.make(indices, task.epoch), True
                except BaseException as exc:  # noqa: BLE001 - every error goes to the consumer
                    batch, ok = RemoteError.capture(exc, worker_id, seq, indices), False
                busy = time.perf_counter() - start
                results.put(Result(task.gen, seq, ok, batch, busy, worker_id, worker_id))
                del batch
                pending.pop(0)
    except BaseException as exc:  # noqa: BLE001 - a worker thread must not die silently
        owed = [Task(task.gen, task.epoch, pending)] if pending else []
        error = RemoteError.capture(exc, worker_id, None, None)
        results.put(WorkerLost(worker_id, None, None, owed, error, where))


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
        self._tasks: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._closed = False
        self._stopped_threads = 0  # threads that ended on an error outside a batch
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
        """Closed, or a thread stopped: the loader starts a fresh pool for the next epoch."""
        return self._closed or self._stopped_threads > 0

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

    def materialize(self, result: Result) -> Any:
        return result.payload

    def discard(self, result: Result) -> None:
        pass

    @property
    def bytes_delivered(self) -> int:
        """Always 0: a thread's batch is handed over as it is, and the epoch counts its
        bytes itself (the process pool counts what crosses its shared memory)."""
        return 0
