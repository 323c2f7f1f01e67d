"""A worker's side of the shared-memory transport (protocol: the ``ipc`` package's
docstring): its ring of slots, and carving a batch into one."""

from __future__ import annotations

import ctypes
import math
import mmap
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..nest import map_leaves
from .lease import host_view

_ALIGN = 64
# Headroom over the last batch's size, so slightly larger batches reuse the slot.
_HEADROOM = 1.0625
_MIN_SLOT_BYTES = 1 << 16
# A released slot at least this large goes back to its worker at once, in a message of its
# own, rather than with that worker's next task: it saves the worker mapping a new one.
EAGER_RELEASE_BYTES = 1 << 20
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
        self.buf: Optional[np.ndarray] = np.frombuffer(self.mm, dtype=np.uint8)
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
        if self.buf is None:
            raise ValueError(f"slot {self.id} is closed")
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
    """A worker's reusable shared-memory slots (its calls and their order:
    ``sides.WorkerSide``)."""

    def __init__(self) -> None:
        self._slots: Dict[int, _Slot] = {}
        self._free: List[int] = []
        self._next_id = 0
        self._last_need = 0
        self.dropped: List[int] = []
        self.current: Optional[_Slot] = None
        # The arrays ``allocate`` carved for the current batch, by id, with their slot and
        # offset (each kept alive, so its id stays its own): ``pack`` finds them without
        # asking numpy for addresses.
        self._carved: Dict[int, Tuple[np.ndarray, _Slot, int]] = {}

    def release(self, slot_ids) -> None:
        for sid in slot_ids:
            if sid in self._slots:
                self._free.append(sid)
        while len(self._free) > _MAX_FREE_SLOTS:
            smallest = min(self._free, key=lambda s: self._slots[s].capacity)
            self._free.remove(smallest)
            self._slots.pop(smallest).close()
            self.dropped.append(smallest)

    def resend(self, slot_ids) -> None:
        """The main process could not take these slots' descriptors: send each again the
        next time its slot carries a batch."""
        for sid in slot_ids:
            slot = self._slots.get(sid)
            if slot is not None:
                slot.sent = False

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
        self._carved.clear()

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
                view = slot.view(offset, shape, dtype)
                self._carved[id(view)] = (view, slot, offset)
                return view
        return np.empty(shape, dtype=dtype)

    def abort(self) -> None:
        """The batch failed: give its slot back to the free list."""
        if self.current is not None:
            self._free.append(self.current.id)
            self.current = None
        self._carved.clear()

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
        try:
            return self._pack(slot, result, promoted, numpy_array)
        finally:
            self._carved.clear()  # a view kept would pin the slot's mapping

    def _pack(
        self, slot: Optional[_Slot], result: Any, promoted: Dict[int, Any], numpy_array: bool
    ) -> Tuple[Any, Optional[int], list]:
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

        skeleton = map_leaves(collect, result)
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
        skeleton = map_leaves(lambda x: refs[x.i] if isinstance(x, _Pending) else x, skeleton)
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

    def _offset_in(self, slot: Optional[_Slot], arr: np.ndarray) -> Optional[int]:
        """Where ``arr`` lies in ``slot``, if it is contiguous and wholly inside it (an array
        ``allocate`` carved, or a view of one), else None."""
        if slot is None:
            return None
        carved = self._carved.get(id(arr))
        if carved is not None and carved[0] is arr and carved[1] is slot:
            return carved[2]
        if not arr.flags["C_CONTIGUOUS"]:
            return None
        ptr = arr.__array_interface__["data"][0]
        if slot.addr <= ptr and ptr + arr.nbytes <= slot.addr + slot.capacity:
            return ptr - slot.addr
        return None

    def _fits(self, slot: _Slot, leaves) -> bool:
        top = slot.top
        for arr, _ in leaves:
            if isinstance(arr, np.ndarray) and self._offset_in(slot, arr) is not None:
                continue
            top = _align(top) + _nbytes(arr)
        return top <= slot.capacity

    def _place(self, slot: _Slot, arr, kind: int) -> ArrayRef:
        shape = tuple(arr.shape)
        dtype = np.dtype(arr.dtype)
        offset = self._offset_in(slot, arr) if isinstance(arr, np.ndarray) else None
        if offset is not None:
            return ArrayRef(offset, shape, dtype.str, kind)
        offset = slot.carve(_nbytes(arr))
        if offset is None:  # _fits said it would: the ring is out of step with itself
            raise RuntimeError("internal error: a batch does not fit the slot it was given")
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
