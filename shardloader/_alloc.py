"""Where batchify functions get their output buffers, and what they return.

Batchify functions never know about shared memory. They ask ``empty`` for an output
buffer and hand the filled numpy array to ``to_output``. By default that allocates with
``np.empty`` and returns an ``NDArray`` (the Gluon contract). Inside a worker process the
transport installs an allocator that carves buffers out of a reusable shared-memory slot and
asks for raw numpy results, so a batch is stacked straight into the memory the main process
will read, with no further copy.
"""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, Optional, Tuple

import numpy as np

Allocator = Callable[[Tuple[int, ...], np.dtype], np.ndarray]

_state = threading.local()


def _default_empty(shape, dtype) -> np.ndarray:
    return np.empty(shape, dtype=dtype)


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised, C-contiguous output buffer from the current allocator."""
    alloc = getattr(_state, "alloc", None) or _default_empty
    return alloc(tuple(int(s) for s in shape), np.dtype(dtype))


def to_output(array: np.ndarray):
    """The batch form of ``array``: an ``NDArray`` wrapping it without a copy, or the numpy
    array itself while a worker is collecting raw results."""
    if getattr(_state, "raw", False):
        promoted = getattr(_state, "promoted", None)
        if promoted is not None:
            promoted[id(array)] = array  # kept alive so the id stays unique
        return array
    return as_ndarray(array)


# dtypes MXNet 1.9.1 adopts through DLPack without a copy: (type code, bits).
_DLPACK_DTYPES = {
    "float16": (2, 16),
    "float32": (2, 32),
    "float64": (2, 64),
    "uint8": (1, 8),
    "int32": (0, 32),
    "int64": (0, 64),
}


def as_ndarray(array: np.ndarray):
    """Wrap a numpy array as an ``mx.nd.NDArray`` on ``cpu(0)``, without a copy when the
    dtype allows it. The NDArray keeps ``array`` alive."""
    import mxnet as mx

    array = np.asarray(array)
    if array.ndim == 0:
        # Legacy NDArrays have no 0-d shape; Gluon's nd.array gives (1,) too.
        array = array.reshape(1)
    code = _DLPACK_DTYPES.get(array.dtype.name)
    if code is None:
        return mx.nd.array(array, dtype=array.dtype)
    if not array.flags["C_CONTIGUOUS"]:
        array = np.ascontiguousarray(array)
    return _adopt(array, code)


def _adopt(array: np.ndarray, code: Tuple[int, int]):
    """What ``mx.nd.from_numpy(zero_copy=True)`` does, with less per-call overhead (this is
    on the per-batch path): hand MXNet a DLPack tensor whose deleter releases ``array``."""
    from mxnet.base import _LIB, check_call
    from mxnet.ndarray import ndarray as nd

    managed = nd.DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = array.__array_interface__["data"][0]
    tensor.ctx = nd.DLContext(1, 0)
    tensor.ndim = array.ndim
    tensor.dtype = nd.DLDataType(code[0], code[1], 1)
    tensor.shape = (ctypes.c_int64 * array.ndim)(*array.shape)  # MXNet copies the shape
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(array))  # released by the deleter
    managed.manager_ctx = id(array)
    managed.deleter = nd.dl_managed_tensor_deleter
    handle = nd.NDArrayHandle()
    check_call(_LIB.MXNDArrayFromDLPackEx(ctypes.byref(managed), True, ctypes.byref(handle)))
    return nd.NDArray(handle=handle)


def raw_mode() -> bool:
    """Whether batchify output should stay numpy (inside a worker)."""
    return getattr(_state, "raw", False)


@contextmanager
def allocating(
    alloc: Allocator, raw: bool = True, promoted: Optional[Dict[int, np.ndarray]] = None
) -> Iterator[None]:
    """Install ``alloc`` (and raw numpy results) for the current thread.

    With ``promoted``, every array passed to ``to_output`` is recorded there by ``id``,
    so the transport can tell batch arrays (NDArrays for the user) from numpy arrays a
    batchify function passed through unchanged.
    """
    saved = (
        getattr(_state, "alloc", None),
        getattr(_state, "raw", False),
        getattr(_state, "promoted", None),
    )
    _state.alloc, _state.raw, _state.promoted = alloc, raw, promoted
    try:
        yield
    finally:
        _state.alloc, _state.raw, _state.promoted = saved
