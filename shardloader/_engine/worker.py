"""What a worker does: load samples, batchify, and (in a process) ship the batch home.

Private: the only public name is ``get_worker_info``. The process entry point is a
module-level function so it pickles under ``spawn``; it imports only what it needs.

A worker process lives as long as its loader's pool, and never outlives the main process.
Workers start lazily, at the first ``iter()``, on whichever thread asks (a
``PrefetchingIter`` thread, a data thread of the user's), so nothing may tie them to that
thread. Linux's ``PR_SET_PDEATHSIG`` does exactly that: it fires when the thread that forked
the child exits, not when the process does. So (helpers in ``_lifeline``):

* the parent-death signal (``SIGKILL``) is armed only when the worker was started from the
  main thread, which lives as long as the process, or by a forkserver (whose main thread
  forks, and which exits with the main process). It is the kernel's guarantee: it kills
  even a worker stuck in native code;
* every worker, whichever thread started it, runs a *lifeline* thread that waits on a pidfd
  of the main process and kills the worker (``SIGKILL``) the moment the main process exits;
* an idle worker also notices a closed pipe (the main process closed the pool, or died) and
  a change of its parent pid.

So workers die within moments of a ``SIGKILL`` of the main process however they were
started, and a thread that exits takes no worker with it.

A forked worker also starts with copies of the main process's file descriptors and
memory mappings, among them other loaders' pipes and shared-memory slots. Right after the
fork it lets go of those that belong to shardloader (``_forget_inheritance``): the pipes of
every open pool, named by the pool, and every slot mapping. So closing a loader frees its
memory whatever other loaders exist. (A batch that the main process holds is among those
mappings: a dataset that keeps another loader's batches must keep copies of them to use
them in forked workers.) Everything else it inherited (the user's open files, MXNet's and
Python's own descriptors) stays: the dataset may need it.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import pickle
import signal
import threading
import time
from multiprocessing import reduction
from typing import Any, Callable, ContextManager, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .._errors import RemoteError
from .ipc import alloc as _alloc
from .ipc.shm import SLOT_MEMFD_PATH, SlotRing, drop_inherited_slot_mappings
from .lifeline import parent_death_signal, start_lifeline
from .seeding import (
    GlobalRNGState,
    derive_seed,
    seed_all,
    seed_mxnet,
    seed_python_and_numpy,
)

# How often an idle worker process checks that its parent is still alive.
_PARENT_CHECK_INTERVAL_S = 0.5
# Epoch number used to derive per-worker (not per-sample) seeds.
_WORKER_SEED_EPOCH = -1
# Keeps MXNet's per-batch seeds apart from the per-sample seeds of the same indices.
_MXNET_SEED_DOMAIN = 0x5EED_4D58


class WorkerInfo(NamedTuple):
    """What ``get_worker_info`` returns inside a worker."""

    id: int
    num_workers: int
    seed: Optional[int]
    dataset: Any


_info = threading.local()


def get_worker_info() -> Optional[WorkerInfo]:
    """Inside a worker (process or thread), its ``WorkerInfo``; elsewhere ``None``.

    >>> get_worker_info() is None
    True
    """
    return getattr(_info, "value", None)


def _check_index(index: Any, position: int, length: int) -> None:
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
        raise TypeError(
            f"the batch sampler yielded a non-integer index {index!r} "
            f"(type {type(index).__name__}) at position {position} of the batch; "
            f"indices must be ints in [0, {length})"
        )
    if not 0 <= index < length:
        raise IndexError(
            f"the batch sampler yielded index {index} at position {position} of the batch, "
            f"outside the dataset's range [0, {length})"
        )


def is_sharded(indices: Sequence) -> bool:
    """Whether a batch sampler item is a step (a list of per-shard index lists). Raises a
    ``TypeError`` naming the item when it is neither a batch nor a step (a bare index, say)."""
    try:
        return len(indices) > 0 and isinstance(indices[0], (list, tuple, np.ndarray))
    except (TypeError, KeyError, IndexError):
        pass
    try:
        shown = repr(indices)
    except Exception:  # noqa: BLE001 - only for the message
        shown = "an object"
    raise TypeError(
        f"the batch sampler yielded {shown[:200]} (type {type(indices).__name__}) where a "
        f"batch was expected: a batch_sampler must yield lists of sample indices (or, for "
        f"sharded steps, lists of such lists), e.g. [[0, 1], [2, 3]] rather than [0, 1, 2, 3]"
    )


def _no_context() -> ContextManager:
    return contextlib.nullcontext()


class BatchMaker:
    """Loads the samples of one batch (or one sharded step) and batchifies them.

    Shared by inline loading, thread workers and process workers, so all three seed and
    validate identically (docs/design.md, invariant 6). ``shared_process=True`` (inline and thread
    workers) means the global RNGs belong to the user's training thread too: seeded loading
    then takes a lock and gives ``random`` and ``numpy.random`` their states back afterwards.
    """

    def __init__(
        self,
        dataset: Any,
        batchify_fn: Callable,
        seed: Optional[int],
        shared_process: bool = False,
        mxnet_per_sample: bool = False,
        numpy_flags: Optional[Tuple[bool, bool]] = None,
    ) -> None:
        self.dataset = dataset
        self._mxnet_per_sample = mxnet_per_sample
        # MXNet's numpy mode (per thread) for the thread that makes a batch; None: leave it.
        self._numpy_flags = numpy_flags
        self.batchify_fn = _stop_iteration_guard(batchify_fn)
        self.seed = seed
        self.length = len(dataset)
        self._shared = shared_process
        # Seeded thread workers take turns, batch by batch, so that the draws stay exactly
        # those of a process worker.
        self._lock = threading.Lock() if shared_process else contextlib.nullcontext()
        # Threads sharing a dataset make their first batch one at a time: lazy first-call
        # set-up (a hybridized Gluon transform builds its graph then) is not thread-safe.
        self._first_batch: Optional[threading.Lock] = threading.Lock() if shared_process else None

    def samples(self, indices: Sequence, epoch: int) -> List[Any]:
        length, dataset = self.length, self.dataset
        for pos, i in enumerate(indices):
            _check_index(i, pos, length)
        out: List[Any] = []
        i = None
        try:
            if self.seed is None:
                for i in indices:
                    out.append(dataset[i])
                return out
            with self._lock, GlobalRNGState() if self._shared else contextlib.nullcontext():
                # By default MXNet's RNG once per batch: reseeding it costs about a millisecond
                # of engine work. random and numpy.random, which cost microseconds, per sample.
                per_sample = self._mxnet_per_sample
                if not per_sample:
                    seed_mxnet(derive_seed(self.seed ^ _MXNET_SEED_DOMAIN, epoch, _fold(indices)))
                for i in indices:
                    value = derive_seed(self.seed, epoch, int(i))
                    if per_sample:
                        seed_all(value)
                    else:
                        seed_python_and_numpy(value)
                    out.append(dataset[i])
                return out
        except StopIteration as exc:
            # Left alone, it would reach the for loop over the loader as the end of the epoch.
            raise RuntimeError(
                f"the dataset's __getitem__ raised StopIteration for sample index {i} "
                f"(position {len(out)} of the batch). It is raised as RuntimeError, as Gluon's "
                f"DataLoader does: a StopIteration would end the epoch early without a word"
            ) from exc

    def make(
        self, indices: Sequence, epoch: int, output: Callable[[], ContextManager] = _no_context
    ) -> Any:
        """The batch (or step) for ``indices``. ``output`` is entered around batchify only,
        not around the dataset: a dataset that calls batchify functions itself gets its
        own memory and the usual types, whatever the transport does with the batch."""
        if self._numpy_flags is not None:
            _alloc.set_numpy_flags(self._numpy_flags)
        first = self._first_batch
        if first is not None:
            with first:
                if self._first_batch is not None:
                    batch = self._make(indices, epoch, output)
                    self._first_batch = None  # set up: from now on, in parallel
                    return batch
        return self._make(indices, epoch, output)

    def _make(self, indices: Sequence, epoch: int, output: Callable[[], ContextManager]) -> Any:
        batchify = self.batchify_fn
        if is_sharded(indices):
            shards = [self.samples(shard, epoch) for shard in indices]
            with output():
                return [batchify(samples) for samples in shards]
        samples = self.samples(indices, epoch)
        with output():
            return batchify(samples)


def _stop_iteration_guard(batchify_fn: Callable) -> Callable:
    """``batchify_fn``, with a StopIteration it raises turned into a RuntimeError: a
    StopIteration would end the epoch early without a word."""

    def batchify(samples):
        try:
            return batchify_fn(samples)
        except StopIteration as exc:
            raise RuntimeError(
                f"batchify_fn raised StopIteration while batching {len(samples)} samples. It "
                f"is raised as RuntimeError, as Gluon's DataLoader does: a StopIteration "
                f"would end the epoch early without a word"
            ) from exc

    batchify.__wrapped__ = batchify_fn  # type: ignore[attr-defined]
    return batchify


def _fold(indices: Sequence) -> int:
    """One 31-bit value from all the indices of a batch, in order: two batches that merely
    start alike (a rollover carry, a repeated index) must not share MXNet's draws."""
    h = len(indices)
    for i in indices:
        h = derive_seed(h, 0, int(i))
    return h


def seed_thread_worker(worker_id: int, seed: Optional[int], entropy: int) -> None:
    """Give a worker thread its own MXNet stream: MXNet 1.9.1's RNG is per thread, and every
    new thread starts from the same state. ``random`` and ``numpy.random`` belong to the
    whole process (the caller too) and are left alone."""
    base = seed if seed is not None else entropy
    seed_mxnet(derive_seed(base, _WORKER_SEED_EPOCH, worker_id))


def seed_worker(worker_id: int, seed: Optional[int], entropy: int) -> None:
    """Give each worker its own RNG streams, so forked workers never repeat each other."""
    base = seed if seed is not None else entropy
    seed_all(derive_seed(base, _WORKER_SEED_EPOCH, worker_id))


# Where a slot's memfd shows in /proc/self/fd and /proc/self/maps (see _shm._Slot).


def process_worker_main(
    worker_id: int,
    num_workers: int,
    conn,
    dataset: Any,
    batchify_fn: Callable,
    raw: bool,
    seed: Optional[int],
    entropy: int,
    worker_init_fn: Optional[Callable],
    parent_pid: int,
    inherited_fds: Sequence[int] = (),
    mxnet_per_sample: bool = False,
    numpy_flags: Optional[Tuple[bool, bool]] = None,
    *,
    death_signal: bool = True,
    forked_by_parent: bool = True,
) -> None:
    """Entry point of a worker process. Messages are pickled tuples:

    * in:  ``("task", gen, epoch, [(seq, indices), ...], released_slot_ids)``,
      ``("release", released_slot_ids)`` or ``None`` (exit)
    * out: ``(heads, new_slots, dropped_slot_ids, payloads)`` (see ``_send``), each new
      slot ``(slot_id, capacity)`` followed on the socket by its file descriptor.

    ``inherited_fds``: the main process's shardloader descriptors (every live pool's pipes
    and process sentinels) that a forked worker must let go of. ``death_signal``: arm
    ``PR_SET_PDEATHSIG`` (the forking thread lives as long as the process).
    ``forked_by_parent``: ``parent_pid`` is this process's parent (not a forkserver).
    """
    # Ctrl-C belongs to the main process, which shuts the workers down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if death_signal:
        arm = parent_death_signal(signal.SIGKILL, parent_pid if forked_by_parent else None)
        if arm is not None:
            arm()
    _forget_inheritance(conn.fileno(), inherited_fds)
    start_lifeline(parent_pid, forked_by_parent)
    _info.value = WorkerInfo(worker_id, num_workers, seed, dataset)
    seed_worker(worker_id, seed, entropy)
    if worker_init_fn is not None:
        worker_init_fn(worker_id)
    maker = BatchMaker(
        dataset, batchify_fn, seed, mxnet_per_sample=mxnet_per_sample, numpy_flags=numpy_flags
    )
    ring = SlotRing()
    try:
        _serve(worker_id, conn, maker, ring, raw, os.getppid())
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process went away or closed our pipe: nothing left to do
    finally:
        ring.close()
        conn.close()


def _forget_inheritance(own_fd: int, foreign_fds: Sequence[int]) -> None:
    """Let go of what a forked worker inherited from shardloader in the main process.

    Descriptors: ``foreign_fds``, every other descriptor on the same pipe or socket (the
    other end of a process sentinel's pipe, a duplicate), and any slot memfd (the main
    process holds one for a moment while it maps a new slot). Each is pointed at
    ``/dev/null`` rather than closed, so that its number stays taken: a Python object that
    owned it in the main process (and so also here) may close that number some day, and must
    not close a descriptor of this worker's by then. Mappings: every slot mapping (none is
    this worker's yet) is replaced by an inaccessible reservation, which holds no memory.
    That includes slots whose batches the main process still holds: a dataset that holds
    such a batch cannot read it in a forked worker (it would crash with ``SIGSEGV``); it
    must hold a copy. Start-up costs a few hundred microseconds for this.
    """
    links = set()
    for fd in foreign_fds:
        if fd != own_fd:
            link = _fd_link(fd)
            if link is not None:
                links.add(link)
    doomed = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        names = [str(fd) for fd in foreign_fds]
    for name in names:
        fd = int(name)
        if fd <= 2 or fd == own_fd:
            continue
        link = _fd_link(fd)
        if link is not None and (link in links or link.startswith(SLOT_MEMFD_PATH)):
            doomed.append(fd)
    if doomed:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            for fd in doomed:
                os.dup2(null, fd, inheritable=False)
        finally:
            os.close(null)
    drop_inherited_slot_mappings()


def _fd_link(fd: int) -> Optional[str]:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _serve(worker_id, conn, maker: BatchMaker, ring, raw: bool, ppid: int) -> None:
    tasks: collections.deque = collections.deque()
    while True:
        if not tasks and not conn.poll(_PARENT_CHECK_INTERVAL_S):
            if os.getppid() != ppid:
                return  # reparented: the main process (or the forkserver) is gone
            continue
        # Read everything that has arrived before starting a batch: slot releases apply at
        # once (so the batch reuses a slot instead of mapping a new one), tasks queue up.
        while conn.poll(0):
            msg = pickle.loads(conn.recv_bytes())
            if msg is None:
                return
            ring.release(msg[-1])
            if msg[0] == "task":
                tasks.append(msg[1:4])
        if not tasks:
            continue
        gen, epoch, batches = tasks.popleft()
        results, new_slots = [], []
        for seq, indices in batches:
            results.append(
                _one_batch(worker_id, maker, ring, raw, gen, epoch, seq, indices, new_slots)
            )
        dropped, ring.dropped = ring.dropped, []
        _send(conn, results, new_slots, dropped, ring, worker_id, batches)


def _one_batch(worker_id, maker, ring, raw, gen, epoch, seq, indices, new_slots):
    start = time.perf_counter()
    ring.begin()
    try:
        promoted: dict = {}
        if raw:
            batch = maker.make(
                indices,
                epoch,
                lambda: _alloc.allocating(ring.allocate, raw=True, promoted=promoted),
            )
        else:
            batch = maker.make(indices, epoch)
        skeleton, slot_id, fds = ring.pack(batch, promoted, _alloc.numpy_mode())
        del batch
    except BaseException as exc:  # noqa: BLE001 - every error travels home as data
        ring.abort()
        return (gen, seq, False, RemoteError.capture(exc, worker_id, seq, indices), 0.0)
    new_slots.extend(fds)
    return (gen, seq, True, (skeleton, slot_id), time.perf_counter() - start)


def _send(conn, results, new_slots, dropped, ring, worker_id, batches) -> None:
    """Send one message: ``(heads, new_slots, dropped_slot_ids, payloads)``.

    ``heads`` (one ``(gen, seq, ok, busy_s, slot_id, end)`` per result) and the slot lists
    hold builtin types only, so the main process can always unpickle them, and so always
    knows how many descriptors follow the message. ``payloads`` is one stream of pickles,
    one per result (the batch skeleton, or a ``RemoteError``), ending at offset ``end``,
    written by one pickler so that they share a memo (a class is named once per message,
    which keeps a message of many small batches as cheap as one pickle). Only they can hold
    the user's classes: if one does not unpickle in the main process, that batch alone
    fails, with a ``WorkerError`` that says which class (see ``_pool.ProcessPool``).
    """
    indices_by_seq = dict(batches)
    buf = io.BytesIO()
    pickler = _BatchPickler(buf, pickle.HIGHEST_PROTOCOL)
    heads = []
    for gen, seq, ok, payload, busy in results:
        start = buf.tell()
        slot_id = None
        if ok:
            skeleton, slot_id = payload
            try:
                pickler.dump(skeleton)
            except Exception as exc:  # noqa: BLE001 - reported to the training loop instead
                _rewind(pickler, buf, start)
                if slot_id is not None:
                    ring.release([slot_id])
                slot_id, ok = None, False
                err = TypeError(
                    f"batchify_fn returned an object that cannot be sent from a worker "
                    f"process ({type(exc).__name__}: {exc}). Return arrays, numbers, strings "
                    f"and lists, tuples or dicts of them, or use thread_pool=True."
                )
                payload = RemoteError.capture(err, worker_id, seq, indices_by_seq.get(seq))
        if not ok:
            try:
                pickler.dump(payload)
            except Exception:  # noqa: BLE001 - the indices hold something that won't pickle
                _rewind(pickler, buf, start)
                payload.indices = _text(payload.indices)
                pickler.dump(payload)
        heads.append((gen, seq, ok, busy, slot_id, buf.tell()))
    meta = [(sid, cap) for sid, cap, _ in new_slots]
    conn.send_bytes(pickle.dumps((heads, meta, dropped, buf.getvalue()), pickle.HIGHEST_PROTOCOL))
    for _, _, fd in new_slots:
        reduction.send_handle(conn, fd, os.getppid())
    for _, _, ok, _, slot_id, _ in heads:
        if ok and slot_id is not None:
            ring.sent(slot_id)


class _BatchPickler(pickle.Pickler):
    """Pickles a batch's leftovers (what is not a dense array in a slot). Sparse MXNet
    arrays go as their numpy parts: MXNet 2.x refuses to serialise a sparse array under its
    numpy shape semantics, which are on by default there."""

    def reducer_override(self, obj: Any) -> Any:
        stype = getattr(obj, "stype", None)
        if stype in ("csr", "row_sparse") and type(obj).__module__.startswith("mxnet."):
            parts = (
                (obj.data, obj.indices, obj.indptr) if stype == "csr" else (obj.data, obj.indices)
            )
            numpy_parts = tuple(part.asnumpy() for part in parts)
            return _rebuild_sparse, (stype, tuple(obj.shape), np.dtype(obj.dtype).str, numpy_parts)
        return NotImplemented


def _rebuild_sparse(stype: str, shape: tuple, dtype: str, parts: tuple) -> Any:
    """The sparse MXNet array that ``_BatchPickler`` sent, rebuilt from its numpy parts."""
    import mxnet as mx

    build = mx.nd.sparse.csr_matrix if stype == "csr" else mx.nd.sparse.row_sparse_array
    return build(parts, shape=shape, dtype=np.dtype(dtype))


def _rewind(pickler, buf, start: int) -> None:
    """Drop a pickle that failed half-way, and the memo entries it may have made."""
    buf.seek(start)
    buf.truncate()
    pickler.clear_memo()


def _text(obj) -> str:
    try:
        return repr(obj)[:1000]
    except Exception:  # noqa: BLE001
        return f"<{type(obj).__name__}>"
