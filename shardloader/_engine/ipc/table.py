"""The main process's side of the shared-memory transport (protocol: the ``ipc`` package's
docstring; the calls and their order: ``sides.MainSide``): every worker's slots mapped here,
the arrays wrapped over them, and their release back to the worker."""

from __future__ import annotations

import collections
import ctypes
import functools
import mmap
import os
import threading
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from ..nest import map_leaves
from . import slots
from .lease import as_ndarray, reap_some
from .slots import EAGER_RELEASE_BYTES, NP, ArrayRef

_libc = None


@functools.lru_cache(maxsize=None)
def _dtype(name: str) -> np.dtype:
    """``np.dtype(name)``, looked up once per name (a few microseconds each time otherwise)."""
    return np.dtype(name)


def libc_mmap():
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
        libc = libc_mmap()
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
            libc_mmap().munmap(self.addr, self.capacity)
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
        # Slots whose descriptor could not be taken (never mapped here), per worker: they go
        # back with the next message, marked for their descriptor to be sent again.
        self._resend: Dict[int, List[int]] = collections.defaultdict(list)
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
        # Every array of the batch keeps `buffer` alive; when the last one goes, so does
        # `buffer`, and the slot returns to its worker.
        # Not at exit: the arrays may still be read by MXNet operators until it shuts down.
        weakref.finalize(buffer, self._released, worker_key, slot_id, mapped).atexit = False
        nbytes = [0]

        def rebuild(leaf):
            if isinstance(leaf, ArrayRef):
                dtype = _dtype(leaf.dtype)
                arr = np.ndarray(leaf.shape, dtype, buffer, leaf.offset)
                nbytes[0] += arr.nbytes
                return as_ndarray(arr, leaf.kind == NP) if leaf.kind else arr
            return leaf

        batch = map_leaves(rebuild, skeleton)
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
            if mapped.capacity > slots.MAX_KEPT_SLOT_BYTES:  # read late: tests lower it
                # One-shot: the worker closed its side when it sent the batch.
                if self._slots.get((worker_key, slot_id)) is mapped:
                    del self._slots[(worker_key, slot_id)]
                mapped.unmap()
            elif worker_key in self._dead:
                self._slots.pop((worker_key, slot_id), None)
                mapped.unmap()
            elif self._slots.get((worker_key, slot_id)) is mapped:
                self._releases[worker_key].append(slot_id)
                if mapped.capacity >= EAGER_RELEASE_BYTES:
                    self._urgent.add(worker_key)
            else:
                mapped.unmap()  # the worker is gone or dropped it

    def collect(self) -> None:
        """Run the finalizers of a few batches MXNet has released since the last call
        (``lease.reap_some``): their slots join the queues that ``take_releases`` and
        ``urgent`` read. The pool calls it once before it asks them (``sides.MainSide``)."""
        reap_some()

    def urgent(self) -> List[int]:
        """Workers with a large released slot waiting to go back to them."""
        if not self._urgent:  # the common case, twice per batch: no lock, no list
            return []
        with self._lock:
            keys, self._urgent = list(self._urgent), set()
        return keys

    def take_releases(self, worker_key: int) -> List[int]:
        """Slot ids released since the last call, for this worker to reuse."""
        self._urgent.discard(worker_key)
        queue = self._releases.get(worker_key)
        out: List[int] = []
        while queue:
            out.append(queue.popleft())
        return out

    def not_adopted(self, worker_key: int, slot_id: int) -> None:
        """A slot whose descriptor did not arrive or could not be mapped: the worker gets it
        back with its next message, and sends its descriptor again when it next uses it."""
        with self._lock:
            if worker_key not in self._dead:
                self._releases[worker_key].append(slot_id)
                self._resend[worker_key].append(slot_id)

    def take_resends(self, worker_key: int) -> List[int]:
        """Slots (from ``not_adopted``) whose descriptor the worker must send again."""
        if not self._resend:  # the common case: no lock, no list
            return []
        with self._lock:
            return self._resend.pop(worker_key, [])

    def forget_worker(self, worker_key: int) -> None:
        """A worker exited: unmap its idle slots; busy ones go when their batch does."""
        with self._lock:
            self._releases.pop(worker_key, None)
            self._resend.pop(worker_key, None)
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
            self._resend.clear()
