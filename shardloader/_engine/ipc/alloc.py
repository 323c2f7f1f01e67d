"""Where batchify functions get their output buffers, and how batches become NDArrays.

Batchify functions never know about shared memory. They ask ``empty`` for an output
buffer and hand the filled numpy array to ``to_output``. By default that allocates with
``np.empty`` and returns an MXNet array wrapping the buffer (the Gluon contract). Inside a
worker process the transport installs an allocator that carves buffers out of a reusable
shared-memory slot and asks for numpy results, so a batch is stacked straight into the
memory the main process will read, with no further copy.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, Optional, Tuple

import numpy as np

from .bufferpool import buffers
from .lease import as_ndarray

Allocator = Callable[[Tuple[int, ...], np.dtype], np.ndarray]

_state = threading.local()


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised, C-contiguous output buffer from the current allocator (by default
    the host buffer pool, ``bufferpool``)."""
    alloc = getattr(_state, "alloc", None) or buffers.take
    return alloc(tuple(int(s) for s in shape), np.dtype(dtype))


def numpy_mode() -> bool:
    """Whether MXNet's numpy semantics are on in this thread (``npx.set_np()``): then
    batches are ``mx.np.ndarray``, as Gluon's are."""
    from mxnet.util import is_np_array

    return bool(is_np_array())


def numpy_flags() -> Tuple[bool, bool]:
    """This thread's ``(np_shape, np_array)`` settings, to give to worker threads and
    processes (MXNet keeps both per thread)."""
    from mxnet.util import is_np_array, is_np_shape

    return bool(is_np_shape()), bool(is_np_array())


def set_numpy_flags(flags: Tuple[bool, bool]) -> None:
    """Apply ``numpy_flags()`` taken in another thread or process to this thread."""
    from mxnet.util import set_np

    if flags != numpy_flags():
        set_np(shape=flags[0], array=flags[1])


def to_output(array: np.ndarray):
    """The batch form of ``array``: an MXNet array wrapping it without a copy
    (``mx.np.ndarray`` in numpy mode, else ``mx.nd.NDArray``), or the numpy array itself
    while a worker collects numpy results (``allocating(numpy_out=True)``)."""
    if getattr(_state, "numpy_out", False):
        promoted = getattr(_state, "promoted", None)
        if promoted is not None:
            promoted[id(array)] = array  # kept alive so the id stays unique
        return array
    return as_ndarray(array, numpy_mode())


@contextmanager
def allocating(
    alloc: Allocator, numpy_out: bool = True, promoted: Optional[Dict[int, np.ndarray]] = None
) -> Iterator[None]:
    """Install ``alloc`` for the current thread, and with ``numpy_out`` make ``to_output``
    return numpy arrays (a worker process ships them through shared memory itself).

    With ``promoted``, every array passed to ``to_output`` is recorded there by ``id``,
    so the transport can tell batch arrays (MXNet arrays for the user) from numpy arrays a
    batchify function passed through unchanged.
    """
    saved = (
        getattr(_state, "alloc", None),
        getattr(_state, "numpy_out", False),
        getattr(_state, "promoted", None),
    )
    _state.alloc, _state.numpy_out, _state.promoted = alloc, numpy_out, promoted
    try:
        yield
    finally:
        _state.alloc, _state.numpy_out, _state.promoted = saved
