"""What a worker does, thread or process: take tasks, make their batches, send them home.

``WorkerLoop`` is the one loop both kinds run. What differs is only where tasks come from
and where results go:

* a **thread** worker reads a queue and puts each ``Result`` on the pool's result queue as
  soon as it is made (the batch is handed over as it is);
* a **process** worker reads its pipe (``protocol.Work``, ``Release``, ``STOP``), stacks each
  batch straight into a shared-memory slot (``ipc.slots.SlotRing``), and sends one
  ``protocol.Reply`` per task, with the descriptors of the slots it created. One whose
  seeding or ``worker_init_fn`` raises sends a ``protocol.Failed`` instead, and exits.

Whatever a batch raises (``SystemExit`` and ``KeyboardInterrupt`` too) travels to the
consumer as that batch's result, never as the end of the worker. Private: the only public
name is ``get_worker_info``. The process entry point is a module-level function so that it
pickles under ``spawn``.

A worker process lives as long as its loader's pool, and never outlives the main process
(docs/design.md, "Worker lifetime"). Workers start lazily, at the first ``iter()``, on
whichever thread asks (a ``PrefetchingIter`` thread, a data thread of the user's), so
nothing may tie them to that thread; Linux's ``PR_SET_PDEATHSIG`` fires when the *thread*
that forked the child exits. So (``lifeline``): the parent-death signal (``SIGKILL``) is
armed only when the worker was started from the main thread or by a forkserver; every
worker runs a lifeline thread that kills it the moment the main process exits; and an idle
worker also notices a closed pipe or a change of its parent pid. A forked worker first lets
go of the descriptors and slot mappings it inherited from shardloader (``ipc.inherit``).
"""

from __future__ import annotations

import collections
import os
import queue
import select
import signal
import threading
import time
from multiprocessing import reduction
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

from .._errors import RemoteError
from . import timing
from .batch import BatchMaker
from .ipc import alloc as _alloc
from .ipc import inherit
from .ipc.sides import WorkerSide
from .ipc.slots import SlotRing
from .lifeline import parent_death_signal, start_lifeline
from .protocol import (
    STOP,
    Failed,
    Release,
    Result,
    Task,
    Work,
    WorkerLost,
    decode,
    encode,
    encode_reply,
)
from .seeding import seed_thread_worker, seed_worker


class WorkerInfo(NamedTuple):
    """What ``get_worker_info`` returns inside a worker.

    Attributes
    ----------
    id : int
        This worker's index, from 0 to ``num_workers - 1``; ``worker_init_fn`` receives it
        too.
    num_workers : int
        The loader's ``num_workers``.
    seed : int or None
        The loader's ``seed`` argument (None when it has none). What each sample draws is
        seeded from it, the epoch and the sample, whatever worker loads it.
    dataset : object
        The dataset this worker loads from: in a process worker, the worker's own copy.
    """

    id: int
    num_workers: int
    seed: Optional[int]
    dataset: Any


_info = threading.local()
_process_worker = False  # set in a worker process by process_worker_main


_launching = threading.local()


class launching_worker_process:
    """Around ``Process.start()`` of a loader's worker (``pools.lifecycle.launch``): while it
    runs, ``launching_worker()`` is true on this thread, so a layer above's
    ``os.register_at_fork`` handlers can tell a loader's worker from any other fork."""

    def __enter__(self) -> None:
        _launching.on = True

    def __exit__(self, *exc: Any) -> None:
        _launching.on = False


def launching_worker() -> bool:
    """Whether this thread is starting one of a loader's worker processes (see above)."""
    return getattr(_launching, "on", False)


def in_worker_process() -> bool:
    """Whether this process is one of a loader's worker processes (not a thread worker, not
    the training process): a layer above may then set process-wide settings, such as a
    codec's thread pool, that must not change in the user's process."""
    return _process_worker


def get_worker_info() -> Optional[WorkerInfo]:
    """Inside a worker (process or thread), its ``WorkerInfo``; elsewhere ``None``.

    Returns
    -------
    WorkerInfo or None
        Who this worker is, while a dataset's ``__getitem__``, a batchify function or a
        ``worker_init_fn`` runs in a worker; ``None`` in the training process and for
        ``num_workers=0``.

    Examples
    --------
    >>> get_worker_info() is None
    True
    """
    return getattr(_info, "value", None)


class _StartError(Exception):
    """Seeding or ``worker_init_fn`` raised (the ``__cause__``); ``where`` says which."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


def _start(info: WorkerInfo, seed: Callable[[], None], worker_init_fn: Optional[Callable]) -> None:
    """What every worker does first: say who it is, seed, then run the user's initializer.
    What raises is named (``_StartError.where``), so an error is never blamed on a
    ``worker_init_fn`` that was not given or had not run yet."""
    _info.value = info
    where = "seeding the worker"
    try:
        seed()
        if worker_init_fn is not None:
            where = "worker_init_fn"
            worker_init_fn(info.id)
    except BaseException as exc:  # noqa: BLE001 - reported as the worker's failure to start
        raise _StartError(where) from exc


class WorkerLoop:
    """The loop every worker runs. ``next_task()`` blocks for the next ``Task`` (``None``:
    exit); ``make(task, seq, indices)`` makes one batch's payload; ``put(task, seq, ok,
    payload, busy_s)`` delivers one result and ``flush()`` ends a task; ``stopped()`` is
    asked between batches. ``pending`` is what the current task still owes."""

    def __init__(self, worker_id: int, make: Callable, channel) -> None:
        self.worker_id = worker_id
        self._make = make
        self._channel = channel
        self.task: Optional[Task] = None
        self.pending: List[Tuple[int, Sequence]] = []

    def run(self) -> None:
        channel = self._channel
        while True:
            task = channel.next_task()
            if task is None:
                return
            self.task, self.pending = task, list(task.batches)
            while self.pending:
                if channel.stopped():
                    return
                seq, indices = self.pending[0]
                channel.put(task, seq, *self._one(task, seq, indices))
                self.pending.pop(0)
            channel.flush()

    def _one(self, task: Task, seq: int, indices: Sequence) -> Tuple[bool, Any, float]:
        start = time.perf_counter()
        try:
            payload, ok = self._make(task, seq, indices), True
        except BaseException as exc:  # noqa: BLE001 - every error goes to the consumer
            payload, ok = RemoteError.capture(exc, self.worker_id, seq, indices), False
        return ok, payload, time.perf_counter() - start


# ------------------------------------------------------------------------------- threads


class _ThreadChannel:
    def __init__(self, worker_id: int, tasks: queue.Queue, results: queue.Queue, stop) -> None:
        self._worker_id = worker_id
        self._tasks, self._results, self._stop = tasks, results, stop

    def next_task(self) -> Optional[Task]:
        while not self._stop.is_set():
            try:
                return self._tasks.get(timeout=timing.THREAD_WORKER_POLL_S)
            except queue.Empty:
                continue
        return None

    def stopped(self) -> bool:
        return self._stop.is_set()

    def put(self, task: Task, seq: int, ok: bool, payload: Any, busy: float) -> None:
        wid = self._worker_id
        self._results.put(Result(task.iter_id, seq, ok, payload, busy, wid, wid))
        if self._stop.is_set():
            # The pool was closed while this batch was made (a thread stuck past a timeout
            # returns late): nobody reads its results again, and whatever still holds the
            # pool (an old epoch iterator, a kept LoaderTimeoutError) must not hold batches.
            # The pool empties the queue too once it has set the flag, so a result put
            # just before it was set goes as well.
            drop_results(self._results)

    def flush(self) -> None:
        pass


def drop_results(results: queue.Queue) -> None:
    """Empty a closed thread pool's result queue: its batches are nobody's."""
    try:
        while True:
            results.get_nowait()
    except queue.Empty:
        pass


def thread_worker_main(
    info: WorkerInfo,
    maker: BatchMaker,
    entropy: int,
    worker_init_fn: Optional[Callable],
    tasks: queue.Queue,
    results: queue.Queue,
    stop: threading.Event,
) -> None:
    """A thread worker. Whatever escapes outside a batch (``worker_init_fn``, say) is
    reported as this worker's death, with the batches it still owed: the thread never ends
    without a word."""
    loop = WorkerLoop(
        info.id,
        # Named by (iter_id, seq) while it holds the first-batch turn (BatchMaker.make).
        lambda task, seq, indices: maker.make(indices, task.epoch, batch=(task.iter_id, seq)),
        _ThreadChannel(info.id, tasks, results, stop),
    )
    try:
        _start(info, lambda: seed_thread_worker(info.id, info.seed, entropy), worker_init_fn)
        loop.run()
    except BaseException as exc:  # noqa: BLE001 - a worker thread must not die silently
        raised: BaseException = exc
        where = "its loop, between batches,"
        if isinstance(exc, _StartError) and exc.__cause__ is not None:
            where, raised = exc.where, exc.__cause__
        task = loop.task
        owed = [(task.iter_id, seq) for seq, _ in loop.pending] if task is not None else []
        error = RemoteError.capture(raised, info.id, None, None)
        results.put(WorkerLost(info.id, None, None, owed, error, where))


# ----------------------------------------------------------------------------- processes


class _PipeChannel:
    """A worker process's end of its pipe, and the slot ring its batches go into."""

    def __init__(self, worker_id: int, conn, ring: WorkerSide, ppid: int) -> None:
        self._worker_id, self._conn, self._ring, self._ppid = worker_id, conn, ring, ppid
        self._tasks: collections.deque = collections.deque()
        self._results: List[Tuple[Task, int, bool, Any, float]] = []
        self.new_slots: List[Tuple[int, int, int]] = []  # (slot_id, capacity, fd)
        # One poll(2) object for the pipe: Connection.poll builds a selector on every call.
        self._poller = select.poll()
        self._poller.register(conn.fileno(), select.POLLIN)

    def _readable(self, timeout_s: float) -> bool:
        """Whether the pipe has a message (or has closed) within ``timeout_s``."""
        return bool(self._poller.poll(int(timeout_s * 1000)))

    def next_task(self) -> Optional[Task]:
        conn, tasks = self._conn, self._tasks
        while True:
            if not tasks and not self._readable(timing.WORKER_PARENT_CHECK_S):
                if os.getppid() != self._ppid:
                    return None  # reparented: the main process (or the forkserver) is gone
                continue
            # Read everything that has arrived before starting a batch: releases apply at
            # once (so the batch reuses a slot instead of mapping a new one), tasks queue up.
            while self._readable(0):
                message = decode(conn.recv_bytes())
                if message is STOP:
                    return None
                self._ring.resend(message.resend)  # before release: they may be reused
                self._ring.release(message.released)
                if isinstance(message, Work):
                    tasks.append(message.task)
                else:
                    assert isinstance(message, Release)
            if tasks:
                return tasks.popleft()

    def stopped(self) -> bool:
        return False

    def put(self, task: Task, seq: int, ok: bool, payload: Any, busy: float) -> None:
        if not ok:
            self._ring.abort()
        self._results.append((task, seq, ok, payload, busy))

    def flush(self) -> None:
        """Send the task's results in one message, then the descriptors of new slots."""
        ring = self._ring
        dropped, ring.dropped = ring.dropped, []
        new_slots, self.new_slots = self.new_slots, []
        meta = [(slot_id, capacity) for slot_id, capacity, _ in new_slots]
        data, heads, unsent = encode_reply(self._results, meta, dropped, self._worker_id)
        self._results = []
        ring.release(unsent)
        self._conn.send_bytes(data)
        for _, _, fd in new_slots:
            reduction.send_handle(self._conn, fd, os.getppid())
        for head in heads:
            if head.ok and head.slot_id is not None:
                ring.sent(head.slot_id)


def _slot_maker(maker: BatchMaker, ring: WorkerSide, native: bool, channel: _PipeChannel):
    """``make`` for a process worker: the batch, carved into a slot, as ``(skeleton,
    slot_id)``. With ``native`` (shardloader's own batchify function), batchify allocates
    its output in the slot itself, so the batch is written once."""

    def make(task: Task, seq: int, indices: Sequence) -> Tuple[Any, Optional[int]]:
        epoch = task.epoch
        ring.begin()
        promoted: dict = {}
        if native:
            batch = maker.make(
                indices,
                epoch,
                lambda: _alloc.allocating(ring.allocate, numpy_out=True, promoted=promoted),
            )
        else:
            batch = maker.make(indices, epoch)
        skeleton, slot_id, fds = ring.pack(batch, promoted, _alloc.numpy_mode())
        del batch
        channel.new_slots.extend(fds)
        return skeleton, slot_id

    return make


class Payload(NamedTuple):
    """The user's objects a worker process runs: inherited under ``fork``, pickled and sent
    on the pipe under ``spawn`` and ``forkserver`` (see ``pools.lifecycle``)."""

    dataset: Any
    batchify_fn: Callable
    worker_init_fn: Optional[Callable]


class ProcessSetup(NamedTuple):
    """Everything a worker process needs, given when it starts. ``info.dataset`` is None
    here: the dataset is the payload's. Without a ``payload`` (``spawn``, ``forkserver``),
    it is the first message on the pipe."""

    info: WorkerInfo
    payload: Optional[Payload]
    native_batchify: bool  # batchify_fn may allocate its output in shared memory
    entropy: int
    parent_pid: int
    inherited_fds: Sequence[int]  # what a forked worker lets go of (ipc.inherit)
    mxnet_per_sample: bool
    numpy_flags: Optional[Tuple[bool, bool]]
    death_signal: bool  # arm PR_SET_PDEATHSIG: the forking thread lives as long as we do
    forked_by_parent: bool  # parent_pid is this process's parent (not a forkserver)


def _receive_payload(conn) -> Payload:
    """Read the pickled ``Payload`` off the pipe. One that does not unpickle here (a class
    the main script defines and this process cannot import, a ``__setstate__`` that raises)
    is a failure to start."""
    data = conn.recv_bytes()
    try:
        return Payload(*reduction.ForkingPickler.loads(data))
    except BaseException as exc:  # noqa: BLE001 - reported as the worker's failure to start
        raise _StartError("unpickling the dataset, batchify_fn and worker_init_fn") from exc


def process_worker_main(setup: ProcessSetup, conn) -> None:
    """Entry point of a worker process (messages: ``protocol``)."""
    global _process_worker
    _process_worker = True
    # Ctrl-C belongs to the main process, which shuts the workers down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    info = setup.info
    payload = setup.payload
    if setup.death_signal:
        parent = setup.parent_pid if setup.forked_by_parent else None
        arm = parent_death_signal(signal.SIGKILL, parent)
        if arm is not None:
            arm()
    inherit.forget(conn.fileno(), setup.inherited_fds)
    start_lifeline(setup.parent_pid, setup.forked_by_parent)
    try:
        if payload is None:
            payload = _receive_payload(conn)
        info = info._replace(dataset=payload.dataset)
        _start(info, lambda: seed_worker(info.id, info.seed, setup.entropy), payload.worker_init_fn)
    except (EOFError, OSError):
        conn.close()  # the main process went away (or closed the pool) before handing over
        return
    except _StartError as failed:
        # Said to the main process, which reports it as this worker's end (and does not
        # restart a worker whose start fails); nothing is printed here.
        error = RemoteError.capture(failed.__cause__ or failed, info.id, None, None)
        try:
            conn.send_bytes(encode(Failed(error, failed.where)))
        except (OSError, ValueError):
            pass  # the main process is gone
        conn.close()
        return
    maker = BatchMaker(
        payload.dataset,
        payload.batchify_fn,
        info.seed,
        mxnet_per_sample=setup.mxnet_per_sample,
        numpy_flags=setup.numpy_flags,
    )
    ring: WorkerSide = SlotRing()
    channel = _PipeChannel(info.id, conn, ring, os.getppid())
    try:
        WorkerLoop(info.id, _slot_maker(maker, ring, setup.native_batchify, channel), channel).run()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process went away or closed our pipe: nothing left to do
    finally:
        ring.close()
        conn.close()
