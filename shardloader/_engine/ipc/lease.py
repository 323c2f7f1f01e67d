"""MXNet arrays over our memory, and how MXNet hands that memory back.

Releasing memory without Python (docs/design.md, invariant 7)
--------------------------------------------------------------
An MXNet array that wraps our memory (``as_ndarray``) must tell us when MXNet is done with
it, so that the memory can be freed or its shared-memory slot reused. MXNet says so by
calling the DLPack tensor's ``deleter``, on whichever thread drops the last reference: often
one of MXNet's engine threads, when an operator that read the batch completes. A Python
deleter (as ``mx.nd.from_numpy`` installs) must take the GIL there, and MXNet's own
``pthread_atfork`` handler waits for every engine thread while the forking thread holds the
GIL: any ``fork()`` in the process (a second loader, ``multiprocessing.Pool``, a restarted
worker) then deadlocks. A ``KeyboardInterrupt`` that lands in such a callback is swallowed.

So the deleter is no Python function at all: it is libc's ``sem_post``. Each wrapped array
gets a small ``_Lease``: a DLPack struct that MXNet keeps (``transient_handle=False``), whose
first bytes are turned into a POSIX semaphore once MXNet has read the tensor description.
MXNet's release of the array is then one ``sem_post`` on that semaphore: async-signal-safe,
no GIL, no allocation, callable from any thread at any time, including inside MXNet's fork
handler. Python learns of it by polling (``reap``): the thread that consumes batches polls
before it hands work to workers, every new lease polls a few old ones, and a daemon thread
polls while any lease is outstanding. When a lease's semaphore is posted, the lease drops
its reference to the numpy buffer, which frees it or hands its slot back.

Why no window remains: the only code MXNet runs on release is ``sem_post``, which takes no
lock that Python or a fork could hold. Everything else (dropping the buffer, returning a
slot) runs on Python threads that hold the GIL as usual, so a fork sees them either before
or after, never half done; the lease registry's lock is re-created in a forked child.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import os
import threading
import time
from typing import Deque, Optional

import numpy as np

from .. import timing
from .bufferpool import buffers

# ------------------------------------------------------------------ wrapping without a copy

# dtypes MXNet adopts through DLPack without a copy: (type code, bits). Keyed by dtype, whose
# hash is cheap, where ``dtype.name`` costs several microseconds per array.
_DLPACK_DTYPES = {
    np.dtype(name): code
    for name, code in (
        ("float16", (2, 16)),
        ("float32", (2, 32)),
        ("float64", (2, 64)),
        ("uint8", (1, 8)),
        ("int8", (0, 8)),
        ("int32", (0, 32)),
        ("int64", (0, 64)),
    )
}


def as_ndarray(array: np.ndarray, numpy_array: bool = False):
    """Wrap a numpy array as an MXNet array on ``cpu(0)``, without a copy when the dtype
    allows it: ``mx.np.ndarray`` if ``numpy_array``, else ``mx.nd.NDArray``. The MXNet
    array keeps ``array`` alive until MXNet releases it (see the module docstring)."""
    import mxnet as mx

    array = np.asarray(array)
    if array.ndim == 0 and not numpy_array:
        # Legacy NDArrays have no 0-d shape; Gluon's nd.array gives (1,) too.
        array = array.reshape(1)
    if array.dtype not in _DLPACK_DTYPES:
        if numpy_array:
            return mx.np.array(array, dtype=array.dtype)
        return mx.nd.array(array, dtype=array.dtype)
    if not array.flags["C_CONTIGUOUS"]:
        array = np.ascontiguousarray(array)
    return _registry.adopt(array, mx.np.ndarray if numpy_array else mx.nd.NDArray)


# Contexts whose memory the CPU reads and writes directly.
HOST_DEVICES = frozenset(["cpu", "cpu_pinned", "cpu_shared"])


def host_view(array) -> Optional[np.ndarray]:
    """A numpy view of a dense host MXNet array's memory, without a copy, once pending
    writes to it have landed; ``None`` where there is no such view (a GPU or sparse array,
    a dtype numpy lacks). The view keeps ``array`` alive. Reading it while MXNet writes the
    array is the caller's business: use it at once, as ``asnumpy`` would."""
    if getattr(array, "stype", "default") != "default":
        return None
    from ..._compat import device_of

    if device_of(array).device_type not in HOST_DEVICES:
        return None
    try:
        dtype = np.dtype(array.dtype)
    except TypeError:
        return None
    shape = array.shape
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return None
    from mxnet.base import _LIB, check_call

    array.wait_to_read()
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(ptr)))
    if ptr.value is None:  # no data pointer: nothing to view
        return None
    memory = (ctypes.c_uint8 * nbytes).from_address(ptr.value)
    # The view's base keeps the MXNet array alive. (ctypes arrays take new attributes; the
    # stubs do not say so.)
    memory.owner = array  # type: ignore[attr-defined]
    # numpy's stubs leave out ctypes arrays, which export the buffer protocol.
    return np.frombuffer(memory, dtype=dtype).reshape(shape)  # type: ignore[call-overload]


def reap_some() -> None:
    """Release the memory of a few wrapped arrays that MXNet has finished with, oldest
    first. Cheap enough for the per-batch path: the consuming thread calls it before it
    hands work to workers, so that released slots go back to them promptly."""
    if _registry.pending:
        _registry.reap(_HOT_REAP)


def reap_all() -> None:
    """Check every outstanding lease now (for tests and diagnostics)."""
    _registry.reap(_registry.pending)


# Leases checked per call on the per-batch path, and per background poll (round robin).
_HOT_REAP = 8
_REAP_BATCH = 256


class _DLContext(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("ctx", _DLContext),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Lease(ctypes.Structure):
    """DLPack's ``DLManagedTensor``. MXNet reads ``dl_tensor`` once, while it builds the
    array; afterwards the leading bytes hold the lease's semaphore, and at release MXNet
    reads only ``deleter`` (``sem_post``) and calls it with the struct's address."""

    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


_SEM_T_BYTES = 32  # sizeof(sem_t) on 64-bit glibc and musl
assert ctypes.sizeof(_DLTensor) >= _SEM_T_BYTES  # the semaphore fits before manager_ctx


class _Native:
    """libc's semaphore calls and MXNet's DLPack entry point, looked up once, with the
    constant parts of a tensor description made once (assigning a struct field copies)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.sem_init = libc.sem_init
        self.sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
        self.sem_getvalue = libc.sem_getvalue
        self.sem_getvalue.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        self.sem_post_addr = ctypes.cast(libc.sem_post, ctypes.c_void_p).value
        from mxnet.base import _LIB, NDArrayHandle, check_call

        from ..._compat import dlpack_importer

        self.from_dlpack = dlpack_importer(_LIB)
        self.handle_type = NDArrayHandle
        self.check_call = check_call
        self.cpu = _DLContext(1, 0)
        self.dtypes = {
            dtype: _DLDataType(code, bits, 1) for dtype, (code, bits) in _DLPACK_DTYPES.items()
        }
        self.shapes = [ctypes.c_int64 * max(ndim, 1) for ndim in range(33)]  # numpy's limit
        # sem_getvalue's output, reused: ``posted`` runs under the registry's lock.
        self._value = ctypes.c_int(0)
        self._value_ref = ctypes.byref(self._value)

    def posted(self, address: int) -> bool:
        """Whether the semaphore at ``address`` (a lease's) has been posted."""
        self.sem_getvalue(address, self._value_ref)
        return self._value.value > 0


class _Entry:
    """A lease (and its address), the buffer it keeps alive, and whether its semaphore is
    set up yet."""

    __slots__ = ("lease", "address", "array", "armed")

    def __init__(self, lease: _Lease, array: np.ndarray) -> None:
        self.lease, self.array, self.armed = lease, array, False
        self.address = ctypes.addressof(lease)


class _Registry:
    """Every outstanding lease, with the numpy buffer it keeps alive.

    Safe against a ``KeyboardInterrupt`` at any bytecode: a lease is registered before
    MXNet sees it and armed only once its MXNet array exists (an adoption interrupted before
    that takes its entry back: MXNet can never call that deleter), and ``reap`` never takes
    an entry out of the queue before it knows MXNet is done with it.
    """

    def __init__(self) -> None:
        self._native: Optional[_Native] = None
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._leases: Deque[_Entry] = collections.deque()
        self._reaper: Optional[threading.Thread] = None

    @property
    def pending(self) -> int:
        return len(self._leases)

    def adopt(self, array: np.ndarray, cls):
        """An MXNet array of class ``cls`` over ``array``'s memory (C-contiguous, of a
        ``_DLPACK_DTYPES`` dtype), released by a lease. About 15 us with its release: the
        per-batch path wraps every array of every batch here."""
        native = self._native
        if native is None:
            native = self._native = _Native()
        if len(self._leases) > 1:
            # Amortised: each new lease checks the two oldest. First, so that an exception
            # raised in it (Ctrl-C) leaves no half-delivered array behind.
            self.reap(2)
        lease = _Lease()
        tensor = lease.dl_tensor
        tensor.data = array.__array_interface__["data"][0]
        tensor.ctx = native.cpu
        tensor.ndim = array.ndim
        tensor.dtype = native.dtypes[array.dtype]
        tensor.shape = native.shapes[array.ndim](*array.shape)  # MXNet copies it
        lease.deleter = native.sem_post_addr
        entry = _Entry(lease, array)
        wrapped = None
        try:
            # Registered before MXNet can call the deleter, inside the try: a Ctrl-C at any
            # point up to the array's existence takes the entry back.
            with self._lock:
                self._leases.append(entry)
                if self._reaper is None:
                    # Started before it is recorded: an interrupt in between costs at most a
                    # second reaper, never none.
                    reaper = threading.Thread(
                        target=self._reap_forever, name="shardloader-release", daemon=True
                    )
                    reaper.start()
                    self._reaper = reaper
            handle = native.handle_type()
            native.check_call(native.from_dlpack(ctypes.byref(lease), False, ctypes.byref(handle)))
            # MXNet has copied the tensor description: the leading bytes become the semaphore.
            if native.sem_init(entry.address, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "sem_init failed for a DLPack lease")
            wrapped = cls(handle=handle)
        finally:
            if wrapped is not None:
                entry.armed = True
            else:
                # Interrupted (Ctrl-C) before the array existed: MXNet never saw the lease,
                # or holds a handle nobody can free, so it will never call this deleter.
                with self._lock:
                    if entry in self._leases:
                        self._leases.remove(entry)
        return wrapped

    def reap(self, limit: int) -> None:
        """Check up to ``limit`` leases, oldest first; release the posted ones."""
        native = self._native
        if native is None:
            return  # no lease was ever made
        released = []
        with self._lock:
            leases = self._leases
            for _ in range(min(limit, len(leases))):
                entry = leases[0]
                if entry.armed and native.posted(entry.address):
                    leases.popleft()
                    released.append(entry)
                else:
                    leases.rotate(-1)
        # Dropping the buffers may run finalizers (a slot goes home): outside the lock.
        while released:
            array = released.pop().array
            buffers.give_back(array)
            del array

    def _reap_forever(self) -> None:
        idle_since = None
        event = threading.Event()
        while True:
            event.wait(timing.REAP_INTERVAL_S)
            if self._leases:
                idle_since = None
                self.reap(_REAP_BATCH)
                continue
            now = time.monotonic()
            if idle_since is None:
                idle_since = now
            elif now - idle_since >= timing.REAPER_LINGER_S:
                with self._lock:
                    if not self._leases:
                        self._reaper = None
                        return
                idle_since = None


_registry = _Registry()


def _after_fork_in_child() -> None:
    # The reaper thread does not exist in the child, and the lock may have been held by it
    # at the moment of the fork. The child keeps its copies of the leases (its copies of
    # the arrays may still be in use there) and polls them itself.
    leases = _registry._leases
    _registry._reset()
    _registry._leases = leases


def _at_exit() -> None:
    # MXNet may still run operators that read leased memory, and it frees its arrays (and
    # calls their deleters) as the interpreter tears objects down, in no useful order. So
    # let pending work finish, then keep every lease (struct and buffer) alive for good:
    # the process is ending, and no deleter may write into freed memory.
    if _registry.pending:
        try:
            import mxnet as mx

            mx.nd.waitall()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_registry))


os.register_at_fork(after_in_child=_after_fork_in_child)
# Registered at import, before any pool exists, so it runs after the pools' own exit hooks.
atexit.register(_at_exit)
