"""Large host buffers for batches made outside a worker's slots (inline loading, thread
workers), reused once nothing refers to them (docs/design.md, invariant 10)."""

from __future__ import annotations

import collections
import math
import os
import sys
import threading
import weakref
from typing import Deque, Dict, Tuple

import numpy as np


class BufferPool:
    """Large batch buffers made outside a worker's slots (inline loading, thread workers),
    used again once MXNet has released the array that wrapped them, as MXNet's own pooled
    storage reuses the memory of ``nd.stack``.

    A batch of 64 float32 images is 38.5 MB, above glibc's largest ``mmap`` threshold (32
    MiB), so ``np.empty`` maps fresh pages for every such batch and the stacking then faults
    every page in (9,400 page faults a batch). A buffer goes back to the
    pool only when nothing but its lease referred to it: a batchify function that kept the
    array, or a view of it, keeps it out of the pool for good (docs/design.md, invariant 10).
    """

    MIN_BYTES = 1 << 20  # smaller buffers come from malloc's own free lists
    MAX_FREE = 4  # free buffers kept, all sizes together: two batches in use, two ahead

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._free: Deque[np.ndarray] = collections.deque()  # raw uint8 buffers, oldest first
        self._lent: Dict[int, weakref.ref] = {}  # id -> the buffer, while a batch holds it

    def take(self, shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised C-contiguous array, a view of a pooled buffer if it is large."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.MIN_BYTES:
            return np.empty(shape, dtype=dtype)
        raw = None
        with self._lock:
            for k, candidate in enumerate(self._free):
                if candidate.nbytes == nbytes:
                    raw = candidate
                    del self._free[k]  # by position: arrays do not compare as values here
                    break
        if raw is None:
            raw = np.empty(nbytes, dtype=np.uint8)
        key = id(raw)
        # A plain dict store (atomic under the GIL), as the weakref's callback pops without
        # the lock: it may run on any thread, at any point.
        lent = self._lent

        def forget(_: object, key: int = key) -> None:
            lent.pop(key, None)

        self._lent[key] = weakref.ref(raw, forget)
        return raw.view(dtype).reshape(shape)  # its .base is raw: numpy keeps the owner

    def give_back(self, array: np.ndarray) -> None:
        """``array`` (a lease's buffer) is free of MXNet: pool its buffer if it came from
        here and the caller's reference is the only one left."""
        raw = array.base if array.base is not None else array
        del array
        ref = self._lent.get(id(raw))
        # Referrers now: ``raw`` here, getrefcount's argument, and the caller's ``array``
        # (a view of raw, or raw itself). Any more is someone else's view or reference.
        if ref is None or ref() is not raw or sys.getrefcount(raw) > 3:
            return
        with self._lock:
            self._lent.pop(id(raw), None)
            self._free.append(raw)
            while len(self._free) > self.MAX_FREE:
                self._free.popleft()


buffers = BufferPool()

# A forked child starts with a fresh pool: the lock may have been held at the fork.
os.register_at_fork(after_in_child=buffers._reset)
