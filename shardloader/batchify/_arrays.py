"""Samples as numpy arrays, the dtypes a batch may have, and output buffers."""

from __future__ import annotations

import sys
import typing

import numpy as np

from .._compat import ARRAY_DTYPES
from .._engine.ipc import alloc as _alloc
from .._engine.ipc.lease import host_view as _host_view

# The dtypes the installed MXNet's arrays hold (2.x holds four more integer types than 1.x).
_MX_DTYPES = ARRAY_DTYPES
_MX_DTYPE_NAMES = ", ".join(
    d.name for d in sorted(_MX_DTYPES, key=lambda d: ("buif".index(d.kind), d.itemsize))
)

# An MXNet sample at least this large is read in place rather than copied (see _to_numpy).
_IN_PLACE_MIN_BYTES = 16 * 1024

# numpy dtype kinds that are not numbers: object, bytes, str, void, datetime, timedelta.
_NON_NUMERIC_KINDS = frozenset("OSUVMm")


def _ndarray_class():
    """``mx.nd.NDArray`` if MXNet has been imported, else ``None``.

    No sample can be an NDArray before MXNet is imported, so the check need not import it.
    (Importing ``shardloader`` imports MXNet anyway, for the loader; this only keeps the
    per-sample type test from touching MXNet's modules.)
    """
    mx = sys.modules.get("mxnet")
    nd = getattr(mx, "nd", None)
    return getattr(nd, "NDArray", None)


def _is_mx_array(x) -> bool:
    """Whether ``x`` is an MXNet array (an ``mx.nd.NDArray``, or a subclass of it)."""
    nd = _ndarray_class()
    return nd is not None and isinstance(x, nd)


def _is_array(x) -> bool:
    """Whether ``x`` is a numpy array or an MXNet array."""
    return isinstance(x, np.ndarray) or _is_mx_array(x)


def _to_numpy(x) -> np.ndarray:
    """One sample as a numpy array (NDArrays via ``asnumpy``)."""
    if isinstance(x, np.ndarray):
        return np.asarray(x)
    if _is_mx_array(x):
        # A large array's host memory is read in place: stacking then copies it once, not
        # twice. Mapping costs about 25 us an array, MXNet's own copy about 13 us plus the
        # copy, so small arrays are cheaper copied; at 150 kB (W6's images) copying made the
        # loader 2x slower, so only arrays under 16 kB are.
        if x.size * np.dtype(x.dtype).itemsize < _IN_PLACE_MIN_BYTES:
            return x.asnumpy()
        view = _host_view(x)
        return x.asnumpy() if view is None else view
    return np.asarray(x)


def _array_sample(x, position: int, owner: str) -> np.ndarray:
    """One array sample as a plain numpy array, refusing to drop a mask.

    numpy's subclasses become plain arrays, as ``np.asarray`` (Gluon's path) makes them. A
    masked array with masked values would silently become the values under its mask, so it
    is an error; one with nothing masked is just its data. A masked scalar becomes ``nan``
    (with numpy's warning), as in Gluon.
    """
    if isinstance(x, np.ma.MaskedArray):
        if x.ndim == 0:
            return np.asarray(np.asarray([x])[0])
        masked = int(np.ma.count_masked(x))
        if masked:
            raise ValueError(
                f"{owner}: sample {position} is a masked array with {masked} masked "
                f"value(s); batching it would keep the values under the mask and drop the "
                f"mask (Gluon's default_batchify_fn does that silently). Fill the masked "
                f"values first (sample.filled(value)), or return the mask as a field of its own"
            )
    return _to_numpy(x)


def _array_samples(data, owner: str) -> typing.List[np.ndarray]:
    """Every sample of ``data`` through ``_array_sample``, in order."""
    return [_array_sample(sample, position, owner) for position, sample in enumerate(data)]


def _output_dtype(dtype: np.dtype) -> np.dtype:
    """``dtype`` if an NDArray can hold it, else a ``TypeError`` that says which can."""
    if dtype in _MX_DTYPES:
        return dtype
    native = dtype.newbyteorder("=")
    if native in _MX_DTYPES:
        return native
    raise TypeError(
        f"cannot batchify samples of dtype {dtype}: this MXNet's arrays hold only "
        f"{_MX_DTYPE_NAMES}; convert the samples, or use batchify.Stack(dtype=...)"
    )


def _filled_buffer(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """An allocator buffer of ``values``' shape and ``dtype``, holding ``values`` (cast as
    need be)."""
    buf = _alloc.empty(values.shape, dtype)
    np.copyto(buf, values, casting="unsafe")
    return buf


def _dtype_repr(dtype: typing.Optional[np.dtype]) -> str:
    return "None" if dtype is None else repr(dtype.name)
