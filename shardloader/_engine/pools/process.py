"""The process pool: ``num_workers`` processes, each given the dataset once, at start-up.

Messages on each worker's pipe are ``protocol``'s; slots (shared memory) are adopted into
the pool's ``ipc.table.SlotTable`` as they arrive. Starting, stopping and reaping the
processes is ``lifecycle``'s; the shutdown protocol is the one in ``pools``' docstring.
"""

from __future__ import annotations

import errno
import functools
import itertools
import math
import multiprocessing as mp
import os
import pickle
import select
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..._errors import WorkerError
from .. import pickling, protocol, timing
from ..batch import FirstBatchTurn
from ..ipc import inherit
from ..ipc.fds import receive_fd
from ..ipc.sides import MainSide
from ..ipc.table import SlotTable
from ..protocol import Failed, Release, Reply, Result, Task, Work, WorkerLost
from ..worker import Payload, ProcessSetup, WorkerInfo, process_worker_main
from . import lifecycle
from .base import fresh_entropy
from .lifecycle import WorkerProcess

_worker_keys = itertools.count()


class ProcessPool:
    """``num_workers`` processes, each given the dataset once, at start-up."""

    kind = "process"

    def __init__(
        self,
        num_workers: int,
        dataset: Any,
        batchify_fn: Callable,
        *,
        native_batchify: bool,
        seed: Optional[int],
        worker_init_fn: Optional[Callable],
        start_method: str,
        mxnet_per_sample: bool = False,
        numpy_flags: Optional[Tuple[bool, bool]] = None,
        timeout: Optional[float] = None,
    ) -> None:
        self._timeout = timeout  # also bounds a spawn or forkserver worker's hand-over
        self._mxnet_per_sample = mxnet_per_sample
        self._numpy_flags = numpy_flags
        self.num_workers = num_workers
        self._dataset = dataset
        self._batchify_fn = batchify_fn
        self._native_batchify = native_batchify
        self._seed = seed
        self._worker_init_fn = worker_init_fn
        self._ctx = mp.get_context(start_method)
        self._entropy = fresh_entropy()
        self._workers: Dict[int, WorkerProcess] = {}
        # (worker keys, select.poll, fd -> (worker, is_pipe)): see _poller.
        self._polled: Optional[Tuple[Tuple[int, ...], Any, Dict]] = None
        self._table: MainSide = SlotTable()
        self._lock = threading.RLock()
        self._closed = False
        # A worker that could not start (its dataset did not unpickle, or its seeding or
        # worker_init_fn raised) is not restarted: it would most likely fail again, as a
        # thread worker's would (invariant 6).
        self._start_failed = False
        self._owner = os.getpid()  # a forked child gets a copy of this pool, not its workers
        self._finalizer = weakref.finalize(
            self, lifecycle.shutdown, self._workers, self._table, self._owner
        )
        lifecycle.track(self)
        method = self._ctx.get_start_method()
        # Under spawn and forkserver the dataset travels: sent to each worker once all of
        # them have started (see lifecycle). The first pickling, before any worker starts,
        # is where a dataset that does not pickle is refused.
        first = None if method == "fork" else self._pickled(method)
        for worker_id in range(num_workers):
            self._spawn(worker_id, handed_over=first is not None)
        if first is not None:
            self._hand_over(list(self._workers.values()), method, first)

    # -- lifecycle
    def _user_objects(self) -> Payload:
        return Payload(self._dataset, self._batchify_fn, self._worker_init_fn)

    def _pickled(self, method: str) -> bytes:
        """The dataset, batchify_fn and worker_init_fn, pickled for one ``spawn`` or
        ``forkserver`` worker (under ``fork`` the workers inherit them)."""
        try:
            return lifecycle.pickled(self._user_objects())
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise self._unpicklable(method, exc) from exc

    def _hand_over(self, workers: List[WorkerProcess], method: str, first: bytes) -> None:
        """Send each of ``workers`` its payload (``first`` for the first). If that fails or
        is interrupted (a worker that did not take it within ``timeout``, a Ctrl-C), every
        worker of the pool is killed and the pool closed: a pipe left out of step cannot be
        used again, and the next epoch starts a new pool. No process is left behind."""
        try:
            payload: Optional[bytes] = first
            for w in workers:
                lifecycle.hand_over(w, payload or self._pickled(method), self._timeout, method)
                payload = None
        except BaseException:
            with self._lock:
                for w in list(self._workers.values()):
                    self._table.forget_worker(w.key)
                    lifecycle.reap(w)
                self._workers.clear()
            self.close()
            raise

    def _spawn(self, worker_id: int, *, handed_over: bool, entropy: Optional[int] = None) -> None:
        """Start worker ``worker_id``. ``handed_over``: it gets the dataset, batchify_fn
        and worker_init_fn from ``lifecycle.hand_over``, not with its start-up data."""
        method = self._ctx.get_start_method()
        # A forked worker inherits the main process's ends of every pool's pipes (its own
        # included) and its mappings of every pool's slots: it lets go of them at once, so
        # that closing a pool frees its memory and its workers see the end of their pipes.
        # The parent-death signal follows the thread that forks: only a thread that lives as
        # long as the process (the main thread; a forkserver's) may arm it. Every worker
        # also watches the main process itself (see worker).
        death_signal = method == "forkserver" or (
            threading.current_thread() is threading.main_thread()
        )

        def setup(parent_conn) -> ProcessSetup:
            foreign = (
                inherit.foreign_fds(parent_conn, lifecycle.tracked()) if method == "fork" else []
            )
            return ProcessSetup(
                info=WorkerInfo(worker_id, self.num_workers, self._seed, None),
                payload=None if handed_over else self._user_objects(),
                native_batchify=self._native_batchify,
                entropy=self._entropy if entropy is None else entropy,
                parent_pid=os.getpid(),
                inherited_fds=foreign,
                mxnet_per_sample=self._mxnet_per_sample,
                numpy_flags=self._numpy_flags,
                death_signal=death_signal,
                forked_by_parent=method != "forkserver",
            )

        key = next(_worker_keys)
        self._workers[worker_id] = lifecycle.launch(
            self._ctx, worker_id, key, process_worker_main, setup
        )

    def _unpicklable(self, method: str, exc: Exception) -> TypeError:
        """The error for a worker that could not start because its start-up data does not
        pickle (``pickling`` finds which object, and where inside it)."""
        return pickling.start_error(
            method,
            exc,
            [
                ("dataset", self._dataset),
                ("batchify_fn", self._batchify_fn),
                ("worker_init_fn", self._worker_init_fn),
            ],
        )

    def restart(self, worker_id: int) -> None:
        """Replace a dead worker with a fresh process."""
        with self._lock:
            old = self._workers.pop(worker_id, None)
            if old is not None:
                self._table.forget_worker(old.key)
                lifecycle.reap(old)
            method = self._ctx.get_start_method()
            payload = None if method == "fork" else self._pickled(method)
            # Fresh entropy: without a seed, the new worker must not replay the draws of the
            # one it replaces (with a seed, seeding before each sample decides them anyway).
            self._spawn(worker_id, handed_over=payload is not None, entropy=fresh_entropy())
            if payload is not None:
                self._hand_over([self._workers[worker_id]], method, payload)

    @property
    def closed(self) -> bool:
        """Closed, missing a worker that died and was not replaced, or seen from a child made
        with ``os.fork()`` (the workers are the parent's): either way the pool cannot serve
        another epoch, and the loader starts a new one."""
        return self._closed or len(self._workers) < self.num_workers or os.getpid() != self._owner

    @property
    def can_restart(self) -> bool:
        """Whether ``restart`` may replace a dead worker: not after ``close()``, nor once a
        worker failed to start (its ``worker_init_fn`` raised)."""
        return not self._closed and not self._start_failed

    def close(self) -> None:
        if os.getpid() != self._owner:
            return  # a forked child's copy: the workers are the parent's (lifecycle.shutdown)
        with self._lock:
            self._closed = True
            lifecycle.untrack(self)
            self._finalizer()

    def pids(self) -> List[int]:
        return [w.process.pid for w in self._workers.values()]

    def first_batch_turn(self) -> Optional[FirstBatchTurn]:
        """None: each worker process makes its batches on its own, with no turn to wait for."""
        return None

    def connections(self) -> List[Tuple[Any, Any]]:
        """Each worker's ``(pipe end, process)``: what a worker forked later must let go of
        (``ipc.inherit.foreign_fds``)."""
        return [(w.conn, w.process) for w in list(self._workers.values())]

    # -- work
    def submit(self, task: Task) -> None:
        """Send ``task`` to the least-loaded worker."""
        with self._lock:
            if not self._workers:
                # Every worker died, and each death failed the open epochs already: the
                # task has nowhere to go, and poll() refuses to wait on nothing.
                return
            w = min(self._workers.values(), key=lambda w: (len(w.owes), w.id))
            self._table.collect()
            released = self._table.take_releases(w.key)
            resend = self._table.take_resends(w.key)
            w.owes.update((task.iter_id, seq) for seq, _ in task.batches)
            try:
                w.conn.send_bytes(protocol.encode(Work(task, released, resend)))
            except (OSError, ValueError):
                pass  # the worker is dead; poll() reports it with this task as lost
            self._send_urgent_releases()

    def _send_urgent_releases(self) -> None:
        urgent = self._table.urgent()
        if not urgent:  # the common case, twice a batch
            return
        by_key = {w.key: w for w in self._workers.values()}
        for key in urgent:
            w = by_key.get(key)
            if w is None:
                continue  # it died meanwhile: forget_worker dropped its releases
            released = self._table.take_releases(key)
            if released:
                resend = self._table.take_resends(key)
                try:
                    w.conn.send_bytes(protocol.encode(Release(released, resend)))
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
            self._table.collect()
            self._send_urgent_releases()
            results: List[Result] = []
            poller, by_fd = self._poller()
            # Replies already waiting cost one poll(2), with no wait.
            ready = poller.poll(0) or poller.poll(math.ceil(max(timeout, 0.0) * 1000))
            lost: List[WorkerLost] = []
            dead = []
            for fd, _ in ready:
                w, is_pipe = by_fd[fd]
                if (not is_pipe or not self._receive(w, results)) and w not in dead:
                    dead.append(w)
            for w in dead:
                while self._receive(w, results, block=False):
                    pass
                lost.append(self._bury(w))
            return results, lost

    def _poller(self) -> Tuple[Any, Dict[int, Tuple[WorkerProcess, bool]]]:
        """A ``select.poll`` over every worker's pipe and process sentinel, and what each
        descriptor is (its worker, and whether it is the pipe); made again only when the
        workers change (a death, a restart), not on every poll."""
        keys = tuple(w.key for w in self._workers.values())
        if self._polled is None or self._polled[0] != keys:
            poller = select.poll()
            by_fd: Dict[int, Tuple[WorkerProcess, bool]] = {}
            for w in self._workers.values():
                for fd, is_pipe in ((w.conn.fileno(), True), (w.process.sentinel, False)):
                    poller.register(fd, select.POLLIN)
                    by_fd[fd] = (w, is_pipe)
            self._polled = (keys, poller, by_fd)
        return self._polled[1], self._polled[2]

    def _receive(self, w: WorkerProcess, results: List[Result], block: bool = True) -> bool:
        """Read one ``protocol.Reply`` from ``w``; False when its pipe is closed (it died).

        The reply's heads always unpickle, and say how many descriptors follow: all of them
        are read before anything else can fail, so the next read starts at the next message.
        A slot whose descriptor could not be installed (out of descriptors) or mapped (out of
        address space) fails its batch with a ``SharedMemoryError``: the worker is fine.
        """
        fds: List[Optional[int]] = []
        try:
            if not block and not w.conn.poll(0):
                return False
            reply: Reply = protocol.decode(w.conn.recv_bytes())
            if isinstance(reply, Failed):
                w.failed = reply
                return False  # its only message: the worker has ended
            for _ in reply.new_slots:
                fds.append(receive_fd(w.conn))
        except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError):
            for fd in fds:
                if fd is not None:
                    lifecycle.close_fd(fd)
            return False  # the pipe is closed: the worker has gone
        unmapped: Dict[int, Tuple[int, int]] = {}  # slot id -> (errno, capacity)
        for (slot_id, capacity), fd in zip(reply.new_slots, fds):
            try:
                if fd is None:
                    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
                self._table.adopt(w.key, slot_id, fd, capacity)  # it closes the fd
            except OSError as exc:
                unmapped[slot_id] = (exc.errno or 0, capacity)
                self._table.not_adopted(w.key, slot_id)
        self._table.drop(w.key, reply.dropped)
        self._unpack(w, reply, results, unmapped)
        return True

    def _unpack(
        self, w: WorkerProcess, reply: Reply, results: List[Result], unmapped: Dict[int, tuple]
    ) -> None:
        """One ``Result`` per head. A payload that does not unpickle here (a class only the
        worker can import) becomes a ``WorkerError`` for that batch; the results after it in
        the same reply share its pickle memo, so they are dropped with it (the epoch ends
        at the first of them anyway). A batch in a slot of ``unmapped`` fails with a
        ``SharedMemoryError``. Those errors name the batch's indices, which the router
        knows: they travel as ``protocol.LocalFailure``, for it to resolve."""
        load_next = protocol.payload_reader(reply)
        failed_seq: Optional[int] = None
        make: Callable[[Optional[Sequence]], BaseException]  # indices -> the batch's error
        for n, head in enumerate(reply.heads):
            w.owes.discard((head.iter_id, head.seq))
            ok = head.ok
            payload: Any
            try:
                if failed_seq is not None:
                    raise _DroppedWith()
                payload = load_next()
            except Exception as exc:  # noqa: BLE001 - a class only the worker can import, ...
                if ok:
                    self._table.discard(w.key, head.slot_id)  # the slot goes back
                if failed_seq is None:
                    failed_seq = head.seq
                    make = functools.partial(protocol.undecodable, exc, reply, n, w.id)
                else:
                    make = functools.partial(protocol.dropped_with, head.seq, failed_seq, w.id)
                payload, ok = protocol.LocalFailure(make), False
            else:
                if ok and head.slot_id in unmapped:
                    err, capacity = unmapped[head.slot_id]
                    make = functools.partial(protocol.slot_error, w.id, head.seq, err, capacity)
                    payload, ok = protocol.LocalFailure(make), False
                elif ok:
                    payload = (payload, head.slot_id)
                    self._table.received(w.key, head.slot_id)
            results.append(Result(head.iter_id, head.seq, ok, payload, head.busy_s, w.id, w.key))

    def _bury(self, w: WorkerProcess) -> WorkerLost:
        self._workers.pop(w.id, None)
        pid = w.process.pid
        w.process.join(timing.TERMINATE_TIMEOUT_S)
        exitcode = w.process.exitcode
        self._table.forget_worker(w.key)
        lifecycle.reap(w)
        owed = sorted(w.owes)
        if w.failed is None:
            return WorkerLost(w.id, pid, exitcode, owed)
        self._start_failed = True
        return WorkerLost(w.id, pid, exitcode, owed, w.failed.error, w.failed.where)

    def materialize(self, result: Result) -> Any:
        skeleton, slot_id = result.payload
        return self._table.materialize(result.worker_key, slot_id, skeleton)

    def discard(self, result: Result) -> None:
        if result.ok:
            self._table.discard(result.worker_key, result.payload[1])

    @property
    def bytes_delivered(self) -> int:
        return self._table.bytes_delivered


class _DroppedWith(Exception):
    """A payload after an undecodable one in the same reply: not read, dropped with it."""
