"""What a worker does: load samples, batchify, and (in a process) ship the batch home.

Private: the only public name is ``get_worker_info``. The process entry point is a
module-level function so it pickles under ``spawn``; it imports only what it needs.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import pickle
import signal
import threading
import time
from multiprocessing import reduction
from typing import Any, Callable, List, NamedTuple, Optional, Sequence

import numpy as np

from . import _alloc
from ._errors import RemoteError
from ._seeding import (
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
    """Whether a batch sampler item is a step (a list of per-shard index lists)."""
    return len(indices) > 0 and isinstance(indices[0], (list, tuple, np.ndarray))


class BatchMaker:
    """Loads the samples of one batch (or one sharded step) and batchifies them.

    Shared by inline loading, thread workers and process workers, so all three seed and
    validate identically (invariant 6). ``shared_process=True`` (inline and thread
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
    ) -> None:
        self.dataset = dataset
        self._mxnet_per_sample = mxnet_per_sample
        self.batchify_fn = batchify_fn
        self.seed = seed
        self.length = len(dataset)
        self._shared = shared_process
        # Seeded thread workers take turns, batch by batch, so that the draws stay exactly
        # those of a process worker.
        self._lock = threading.Lock() if shared_process else contextlib.nullcontext()

    def samples(self, indices: Sequence, epoch: int) -> List[Any]:
        length, dataset = self.length, self.dataset
        for pos, i in enumerate(indices):
            _check_index(i, pos, length)
        if self.seed is None:
            return [dataset[i] for i in indices]
        with self._lock, GlobalRNGState() if self._shared else contextlib.nullcontext():
            # By default MXNet's RNG once per batch: reseeding it costs about a millisecond
            # of engine work. random and numpy.random, which cost microseconds, per sample.
            per_sample = self._mxnet_per_sample
            if not per_sample:
                seed_mxnet(derive_seed(self.seed ^ _MXNET_SEED_DOMAIN, epoch, _fold(indices)))
            out = []
            for i in indices:
                value = derive_seed(self.seed, epoch, int(i))
                if per_sample:
                    seed_all(value)
                else:
                    seed_python_and_numpy(value)
                out.append(dataset[i])
            return out

    def make(self, indices: Sequence, epoch: int) -> Any:
        if is_sharded(indices):
            return [self.batchify_fn(self.samples(shard, epoch)) for shard in indices]
        return self.batchify_fn(self.samples(indices, epoch))


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


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker if the main process dies first."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


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
) -> None:
    """Entry point of a worker process. Messages are pickled tuples:

    * in:  ``("task", gen, epoch, [(seq, indices), ...], released_slot_ids)``,
      ``("release", released_slot_ids)`` or ``None`` (exit)
    * out: ``(results, new_slots, dropped_slot_ids)`` where each result is
      ``(gen, seq, ok, payload, busy_s)`` and each new slot ``(slot_id, capacity)`` is
      followed on the socket by its file descriptor.
    """
    # Ctrl-C belongs to the main process, which shuts the workers down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    for fd in inherited_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    from ._shm import SlotRing

    _info.value = WorkerInfo(worker_id, num_workers, seed, dataset)
    seed_worker(worker_id, seed, entropy)
    if worker_init_fn is not None:
        worker_init_fn(worker_id)
    maker = BatchMaker(dataset, batchify_fn, seed, mxnet_per_sample=mxnet_per_sample)
    ring = SlotRing()
    try:
        _serve(worker_id, conn, maker, ring, raw, parent_pid)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process went away or closed our pipe: nothing left to do
    finally:
        ring.close()
        conn.close()


def _serve(worker_id, conn, maker: BatchMaker, ring, raw: bool, parent_pid: int) -> None:
    tasks: collections.deque = collections.deque()
    while True:
        if not tasks and not conn.poll(_PARENT_CHECK_INTERVAL_S):
            if os.getppid() != parent_pid:
                return
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
        _send(conn, results, new_slots, dropped, ring, worker_id, dict(batches))


def _one_batch(worker_id, maker, ring, raw, gen, epoch, seq, indices, new_slots):
    start = time.perf_counter()
    ring.begin()
    try:
        promoted: dict = {}
        if raw:
            with _alloc.allocating(ring.allocate, raw=True, promoted=promoted):
                batch = maker.make(indices, epoch)
        else:
            batch = maker.make(indices, epoch)
        skeleton, slot_id, fds = ring.pack(batch, promoted)
        del batch
    except Exception as exc:  # noqa: BLE001 - every error travels home as data
        ring.abort()
        return (gen, seq, False, RemoteError.capture(exc, worker_id, seq, indices), 0.0)
    new_slots.extend(fds)
    return (gen, seq, True, (skeleton, slot_id), time.perf_counter() - start)


def _dumps(obj) -> bytes:
    """Pickle a message with multiprocessing's reducers (what crosses is metadata only)."""
    return reduction.ForkingPickler.dumps(obj, pickle.HIGHEST_PROTOCOL)


def _send(conn, results, new_slots, dropped, ring, worker_id, indices_by_seq) -> None:
    meta = [(sid, cap) for sid, cap, _ in new_slots]
    try:
        data = _dumps((results, meta, dropped))
    except Exception:
        results = [_picklable(r, ring, worker_id, indices_by_seq.get(r[1])) for r in results]
        data = _dumps((results, meta, dropped))
    conn.send_bytes(data)
    for _, _, fd in new_slots:
        reduction.send_handle(conn, fd, os.getppid())
    for result in results:
        if result[2] and result[3][1] is not None:
            ring.unmap_sent(result[3][1])


def _picklable(result, ring, worker_id, indices):
    gen, seq, ok, payload, busy = result
    if not ok:
        try:
            _dumps(payload)
            return result
        except Exception:
            payload.exc_type = None
            return (gen, seq, False, payload, busy)
    try:
        _dumps(payload)
        return result
    except Exception as exc:
        skeleton, slot_id = payload
        if slot_id is not None:
            ring.release([slot_id])
        err = TypeError(
            f"batchify_fn returned an object that cannot be sent from a worker process "
            f"({type(exc).__name__}: {exc}). Return arrays, numbers, strings and lists, "
            f"tuples or dicts of them, or use thread_pool=True."
        )
        return (gen, seq, False, RemoteError.capture(err, worker_id, seq, indices), busy)
