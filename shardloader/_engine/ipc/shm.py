"""Shared-memory transport for process workers.

Ownership protocol (docs/design.md, invariant 4: every segment has exactly one owner):

* A worker owns a small *ring* of slots. A slot is an anonymous ``memfd`` segment, mapped
  once and reused batch after batch, so its pages are faulted in once, not per batch.
* The worker stacks a batch straight into a free slot (through ``shardloader._alloc``)
  and sends only metadata: the slot id, and per array its offset, shape and dtype. The first
  time a slot travels, its file descriptor follows the message (``SCM_RIGHTS``); the main
  process maps it and closes the descriptor. The worker keeps its descriptor and its own
  mapping: mapping a slot again for every batch (and unmapping it after) cost more than
  filling it, about 1.5 ms for a 9.6 MB batch.
* From then on the main process owns the slot's contents. It wraps the arrays as MXNet
  arrays without a copy (``_alloc.as_ndarray``). When MXNet has released the last of them
  and the user holds no numpy view either, a finalizer on the slot's buffer object queues
  the slot id, and the next message to that worker hands it back (a large slot goes at
  once, in a message of its own). MXNet's release never runs Python: it posts a semaphore
  that Python threads poll (see ``_alloc``), so the finalizer always runs on a Python
  thread that holds the GIL, never on an MXNet engine thread, and a ``fork()`` anywhere in
  the process cannot deadlock on it (docs/design.md, invariant 7).
  A batch that is never handed to the user (early ``break``, error, ``close()``) is released
  the same way by whoever drops it.
* Memory is freed when both mappings are gone: the worker drops a surplus free slot and says
  so in its next message, and exiting workers unmap everything. Nothing has a name in
  ``/dev/shm``, so a ``SIGKILL`` anywhere leaks nothing.
"""

from __future__ import annotations

import collections
import ctypes
import math
import mmap
import os
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from .alloc import as_ndarray, host_view, reap_some

_ALIGN = 64
# Headroom over the last batch's size, so slightly larger batches reuse the slot.
_HEADROOM = 1.0625
_MIN_SLOT_BYTES = 1 << 16
# A released slot at least this large goes back to its worker at once, in a message of its
# own, rather than with that worker's next task: it saves the worker mapping a new one.
_EAGER_RELEASE_BYTES = 1 << 20
# Free slots a worker keeps for reuse; more are dropped. A worker's batches in use at once:
# its share of the prefetch (2 by default), the one it makes, the one the loop holds and
# one on its way back; with fewer kept, the ring makes (and the main process maps) a new
# slot every few batches, which halved W2's throughput.
_MAX_FREE_SLOTS = 4
# A slot larger than this is not kept for reuse: the worker closes it once sent, and the main
# process unmaps it when its batch is released, so a huge batch holds its memory once, not
# once more in the ring (docs/failures.md, "Large batches"). Batches below it (an ImageNet
# batch of 64 float32 images is 38.5 MB) reuse their slots and skip the page faults.
MAX_KEPT_SLOT_BYTES = 256 << 20
# Every slot's memfd is named with this prefix; /proc shows it as SLOT_MEMFD_PATH.
_MEMFD_PREFIX = "shardloader-slot-"
SLOT_MEMFD_PATH = "/memfd:" + _MEMFD_PREFIX


def _align(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


# What the user receives for an array leaf of a batch.
NUMPY, ND, NP = 0, 1, 2  # numpy.ndarray, mx.nd.NDArray, mx.np.ndarray


class ArrayRef:
    """Where one array of a batch lives: offset into the slot, shape, dtype, and what the
    user receives (``kind``: ``NUMPY``, ``ND`` or ``NP``)."""

    __slots__ = ("offset", "shape", "dtype", "kind")

    def __init__(self, offset: int, shape: Tuple[int, ...], dtype: str, kind: int) -> None:
        self.offset, self.shape, self.dtype, self.kind = offset, shape, dtype, kind

    def __reduce__(self):
        return ArrayRef, (self.offset, self.shape, self.dtype, self.kind)


def map_structure(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to every leaf of nested lists, tuples, namedtuples and dicts."""
    if isinstance(obj, list):
        return [map_structure(o, fn) for o in obj]
    if isinstance(obj, tuple):
        items = [map_structure(o, fn) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, dict):
        return type(obj)((k, map_structure(v, fn)) for k, v in obj.items())
    return fn(obj)


def _copy_ndarray_into(src, dst: np.ndarray) -> None:
    """Copy an MXNet array into a preallocated numpy buffer: one copy, no temporary. A host
    array is read in place (about 10x faster than MXNet's synchronous copy); others (a GPU
    array in a worker) go through MXNet."""
    view = host_view(src)
    if view is not None:
        np.copyto(dst, view)
        return
    from mxnet.base import _LIB, check_call

    check_call(
        _LIB.MXNDArraySyncCopyToCPU(
            src.handle, dst.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(dst.size)
        )
    )


# --------------------------------------------------------------------------- worker side


class _Slot:
    """One memfd segment of a worker's ring, mapped in the worker from its creation until
    the worker drops it (its pages count in the RSS of both processes, once in their PSS)."""

    __slots__ = ("id", "fd", "mm", "capacity", "buf", "addr", "top", "sent")

    def __init__(self, slot_id: int, capacity: int) -> None:
        self.id = slot_id
        self.capacity = capacity
        self.fd = os.memfd_create(f"{_MEMFD_PREFIX}{slot_id}", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, capacity)
        self.top = 0
        self.sent = False
        # Its pages populated in one call rather than faulted in one by one.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self.mm: Optional[mmap.mmap] = mmap.mmap(self.fd, capacity, flags=flags)
        self.buf = np.frombuffer(self.mm, dtype=np.uint8)
        self.addr = self.buf.ctypes.data

    def carve(self, nbytes: int) -> Optional[int]:
        """Reserve ``nbytes`` at an aligned offset, or None if the slot is full."""
        offset = _align(self.top)
        if offset + nbytes > self.capacity:
            return None
        self.top = offset + nbytes
        return offset

    def view(self, offset: int, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        return self.buf[offset : offset + nbytes].view(dtype).reshape(shape)

    def close(self) -> None:
        if self.mm is not None:
            self.buf = None
            try:
                self.mm.close()
                self.mm = None
            except BufferError:
                pass  # an array still points into it: it stays mapped until the process exits
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SlotRing:
    """A worker's reusable shared-memory slots."""

    def __init__(self) -> None:
        self._slots: Dict[int, _Slot] = {}
        self._free: List[int] = []
        self._next_id = 0
        self._last_need = 0
        self.dropped: List[int] = []
        self.current: Optional[_Slot] = None

    def release(self, slot_ids) -> None:
        for sid in slot_ids:
            if sid in self._slots:
                self._free.append(sid)
        while len(self._free) > _MAX_FREE_SLOTS:
            smallest = min(self._free, key=lambda s: self._slots[s].capacity)
            self._free.remove(smallest)
            self._slots.pop(smallest).close()
            self.dropped.append(smallest)

    def _acquire(self, need: int) -> _Slot:
        fits = [s for s in self._free if self._slots[s].capacity >= need]
        if fits:
            sid = min(fits, key=lambda s: self._slots[s].capacity)
            self._free.remove(sid)
            slot = self._slots[sid]
        else:
            capacity = max(_MIN_SLOT_BYTES, int(need * _HEADROOM))
            capacity = (capacity + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
            slot = _Slot(self._next_id, capacity)
            self._slots[slot.id] = slot
            self._next_id += 1
        slot.top = 0
        return slot

    def begin(self) -> None:
        """Start a batch: take a slot sized like the last batch (none before the first)."""
        self.current = self._acquire(self._last_need) if self._last_need else None

    def allocate(self, shape, dtype) -> np.ndarray:
        """The allocator installed for batchify: carve from the current slot if it fits."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if self.current is None and nbytes >= _ALIGN:
            # The first batch: no size to go by yet, so size the slot by its first buffer
            # rather than stacking into the heap and copying (two batches' worth at once).
            self.current = self._acquire(nbytes)
        slot = self.current
        if slot is not None and nbytes >= _ALIGN:
            offset = slot.carve(nbytes)
            if offset is not None:
                return slot.view(offset, shape, dtype)
        return np.empty(shape, dtype=dtype)

    def abort(self) -> None:
        """The batch failed: give its slot back to the free list."""
        if self.current is not None:
            self._free.append(self.current.id)
            self.current = None

    def pack(
        self, result: Any, promoted: Dict[int, Any], numpy_array: bool = False
    ) -> Tuple[Any, Optional[int], list]:
        """Turn a batch into ``(skeleton, slot_id, fds_to_send)``.

        Every dense array leaf travels in the slot, never as pickled bytes: leaves that
        batchify already stacked into the current slot become ``ArrayRef`` with no copy;
        other numpy arrays and MXNet arrays are copied in once. If they don't fit, every
        array goes to one new slot large enough for all of them. Leaves whose bytes alone
        would lose something are pickled instead: object and structured dtypes, numpy
        subclasses (masked and record arrays) and sparse MXNet arrays. ``numpy_array``:
        batchify's own outputs become ``mx.np.ndarray`` (numpy mode) rather than NDArray.
        """
        slot = self.current
        self.current = None
        leaves: List[Tuple[Any, int]] = []  # (array or MXNet array, kind)
        promoted_kind = NP if numpy_array else ND

        def collect(leaf):
            if type(leaf) is np.ndarray:
                if leaf.dtype.hasobject or leaf.dtype.fields is not None:
                    return leaf
                leaves.append((leaf, promoted_kind if id(leaf) in promoted else NUMPY))
                return _Pending(len(leaves) - 1)
            kind = _mxnet_kind(leaf)
            if kind is not None:
                leaves.append((leaf, kind))
                return _Pending(len(leaves) - 1)
            return leaf

        skeleton = map_structure(result, collect)
        if not leaves:
            if slot is not None:
                self._free.append(slot.id)
            return skeleton, None, []
        total = sum(_align(_nbytes(a)) for a, _ in leaves) + _ALIGN
        if slot is None or not self._fits(slot, leaves):
            if slot is not None:
                self._free.append(slot.id)
            slot = self._acquire(total)
        self._last_need = max(self._last_need, total) if self._last_need else total
        refs = [self._place(slot, a, kind) for a, kind in leaves]
        skeleton = map_structure(skeleton, lambda x: refs[x.i] if isinstance(x, _Pending) else x)
        fds = []
        if not slot.sent:
            fds.append((slot.id, slot.capacity, slot.fd))
            slot.sent = True
        return skeleton, slot.id, fds

    def sent(self, slot_id: int) -> None:
        """The batch in this slot reached the main process. A slot above
        ``MAX_KEPT_SLOT_BYTES`` is closed outright (the main process maps its own copy of
        the descriptor), so its memory goes as soon as the main process unmaps it, with no
        message back to this worker; smaller slots stay mapped, for reuse."""
        slot = self._slots.get(slot_id)
        if slot is not None and slot.capacity > MAX_KEPT_SLOT_BYTES:
            self._slots.pop(slot_id).close()
            self.dropped.append(slot_id)

    @staticmethod
    def _in_slot(slot: Optional[_Slot], arr: np.ndarray) -> bool:
        if slot is None or not arr.flags["C_CONTIGUOUS"]:
            return False
        ptr = arr.__array_interface__["data"][0]
        return slot.addr <= ptr and ptr + arr.nbytes <= slot.addr + slot.capacity

    def _fits(self, slot: _Slot, leaves) -> bool:
        top = slot.top
        for arr, _ in leaves:
            if isinstance(arr, np.ndarray) and self._in_slot(slot, arr):
                continue
            top = _align(top) + _nbytes(arr)
        return top <= slot.capacity

    def _place(self, slot: _Slot, arr, kind: int) -> ArrayRef:
        shape = tuple(arr.shape)
        dtype = np.dtype(arr.dtype)
        if isinstance(arr, np.ndarray) and self._in_slot(slot, arr):
            offset = arr.__array_interface__["data"][0] - slot.addr
            return ArrayRef(offset, shape, dtype.str, kind)
        offset = slot.carve(_nbytes(arr))
        dst = slot.view(offset, shape, dtype)
        if isinstance(arr, np.ndarray):
            np.copyto(dst, arr)
        else:
            _copy_ndarray_into(arr, dst)
        return ArrayRef(offset, shape, dtype.str, kind)

    def close(self) -> None:
        for slot in self._slots.values():
            slot.close()
        self._slots.clear()
        self._free.clear()


class _Pending:
    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


def _nbytes(arr) -> int:
    return math.prod(arr.shape) * np.dtype(arr.dtype).itemsize


def _mxnet_kind(obj) -> Optional[int]:
    """``NP`` or ``ND`` for a dense MXNet array, else None (sparse ones are pickled)."""
    cls = type(obj)
    if not cls.__module__.startswith("mxnet.") or not hasattr(obj, "asnumpy"):
        return None
    if getattr(obj, "stype", "default") != "default":
        return None
    return NP if cls.__module__.startswith("mxnet.numpy") else ND


# ----------------------------------------------------------------------------- main side


# Not in Python's mmap module; the same on every Linux architecture.
_MAP_FIXED = 0x10
_PROT_NONE = 0


def drop_inherited_slot_mappings() -> None:
    """In a freshly forked worker: let go of every slot mapping inherited from the main
    process (other loaders' batches), so that closing those loaders frees their memory.
    Each range is replaced by an inaccessible anonymous one, so nothing else lands there."""
    try:
        with open("/proc/self/maps") as maps:
            lines = [line for line in maps if SLOT_MEMFD_PATH in line]
    except OSError:
        return
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED | getattr(mmap, "MAP_NORESERVE", 0)
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith(SLOT_MEMFD_PATH):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        # Over the same range: the memfd loses this reference, the range stays reserved.
        _libc_mmap().mmap(start, end - start, _PROT_NONE, flags, -1, 0)


_libc = None


def _libc_mmap():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = lib
    return _libc


class _MappedSlot:
    """A worker's slot mapped into the main process.

    Mapped with libc's ``mmap`` rather than Python's, because Python's keeps a duplicate of
    the descriptor open for the mapping's lifetime; this way the main process holds no
    descriptor per slot. Unmapped only when no batch uses it: ``busy`` is set from the
    moment a result naming the slot arrives until its batch is released or discarded.
    """

    __slots__ = ("addr", "capacity", "busy", "__weakref__")

    def __init__(self, fd: int, capacity: int) -> None:
        libc = _libc_mmap()
        addr = libc.mmap(None, capacity, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            err = ctypes.get_errno()
            raise OSError(
                err, f"mmap of a {capacity}-byte shared-memory slot failed: {os.strerror(err)}"
            )
        self.addr: Optional[int] = addr
        self.capacity = capacity
        self.busy = False

    def buffer(self):
        """A fresh buffer object over the slot; it dies when the last array over it does."""
        return (ctypes.c_uint8 * self.capacity).from_address(self.addr)

    def unmap(self) -> None:
        if self.addr is not None:
            _libc_mmap().munmap(self.addr, self.capacity)
            self.addr = None


class SlotTable:
    """The main process's view of every worker's slots.

    Thread-safe for ``_released`` (finalizers run on whichever Python thread polls MXNet's
    releases: the consumer or the background reaper); everything else runs on the thread
    that consumes batches.
    """

    def __init__(self) -> None:
        self._slots: Dict[Tuple[int, int], _MappedSlot] = {}
        self._releases: Dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._dead: Set[int] = set()
        self._urgent: Set[int] = set()
        # Guards _slots: release callbacks can run on the background reaper thread.
        self._lock = threading.RLock()
        self.bytes_delivered = 0

    def adopt(self, worker_key: int, slot_id: int, fd: int, capacity: int) -> None:
        with self._lock:
            try:
                mapped = _MappedSlot(fd, capacity)
            finally:
                os.close(fd)
            old = self._slots.pop((worker_key, slot_id), None)
            if old is not None and not old.busy:
                old.unmap()
            self._slots[(worker_key, slot_id)] = mapped

    def drop(self, worker_key: int, slot_ids) -> None:
        """The worker unmapped these slots; unmap ours unless a batch still uses them."""
        with self._lock:
            for sid in slot_ids:
                mapped = self._slots.pop((worker_key, sid), None)
                if mapped is not None and not mapped.busy:
                    mapped.unmap()

    def materialize(self, worker_key: int, slot_id: Optional[int], skeleton: Any) -> Any:
        """Rebuild a batch from its skeleton, wrapping slot memory without copying."""
        if slot_id is None:
            return skeleton
        mapped = self._slots[(worker_key, slot_id)]
        buffer = mapped.buffer()
        base = np.frombuffer(buffer, dtype=np.uint8)
        # Every array of the batch keeps `buffer` alive; when the last one goes, so does
        # `buffer`, and the slot returns to its worker.
        # Not at exit: the arrays may still be read by MXNet operators until it shuts down.
        weakref.finalize(buffer, self._released, worker_key, slot_id, mapped).atexit = False
        del buffer
        nbytes = [0]

        def rebuild(leaf):
            if isinstance(leaf, ArrayRef):
                dtype = np.dtype(leaf.dtype)
                n = math.prod(leaf.shape) * dtype.itemsize
                nbytes[0] += n
                arr = base[leaf.offset : leaf.offset + n].view(dtype).reshape(leaf.shape)
                return as_ndarray(arr, leaf.kind == NP) if leaf.kind else arr
            return leaf

        batch = map_structure(skeleton, rebuild)
        self.bytes_delivered += nbytes[0]
        return batch

    def received(self, worker_key: int, slot_id: Optional[int]) -> None:
        """A result naming this slot arrived: keep it mapped until it is used or dropped."""
        if slot_id is not None:
            self._slots[(worker_key, slot_id)].busy = True

    def discard(self, worker_key: int, slot_id: Optional[int]) -> None:
        """A batch that never reached the user: hand its slot straight back."""
        if slot_id is not None:
            mapped = self._slots.get((worker_key, slot_id))
            if mapped is not None:
                self._released(worker_key, slot_id, mapped)

    def _released(self, worker_key: int, slot_id: int, mapped: _MappedSlot) -> None:
        with self._lock:
            mapped.busy = False
            if mapped.capacity > MAX_KEPT_SLOT_BYTES:
                # One-shot: the worker closed its side when it sent the batch.
                if self._slots.get((worker_key, slot_id)) is mapped:
                    del self._slots[(worker_key, slot_id)]
                mapped.unmap()
            elif worker_key in self._dead:
                self._slots.pop((worker_key, slot_id), None)
                mapped.unmap()
            elif self._slots.get((worker_key, slot_id)) is mapped:
                self._releases[worker_key].append(slot_id)
                if mapped.capacity >= _EAGER_RELEASE_BYTES:
                    self._urgent.add(worker_key)
            else:
                mapped.unmap()  # the worker is gone or dropped it

    def urgent(self) -> List[int]:
        """Workers with a large released slot waiting to go back to them."""
        reap_some()
        if not self._urgent:  # the common case, twice per batch: no lock, no list
            return []
        with self._lock:
            keys, self._urgent = list(self._urgent), set()
        return keys

    def take_releases(self, worker_key: int) -> List[int]:
        reap_some()
        self._urgent.discard(worker_key)
        queue = self._releases.get(worker_key)
        out: List[int] = []
        while queue:
            out.append(queue.popleft())
        return out

    def forget_worker(self, worker_key: int) -> None:
        """A worker exited: unmap its idle slots; busy ones go when their batch does."""
        with self._lock:
            self._releases.pop(worker_key, None)
            self._dead.add(worker_key)
            for key in [k for k in self._slots if k[0] == worker_key]:
                if self._slots[key].busy:
                    continue
                mapped = self._slots.pop(key)
                if not mapped.busy:
                    mapped.unmap()

    def close(self) -> None:
        """Unmap every idle slot; a busy one is unmapped when its batch is released."""
        with self._lock:
            for key in list(self._slots):
                self._dead.add(key[0])
                if not self._slots[key].busy:
                    self._slots.pop(key).unmap()
            self._releases.clear()
