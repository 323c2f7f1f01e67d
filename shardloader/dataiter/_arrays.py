"""Field descriptions and array helpers shared by ``LoaderDataIter`` and ``PrefetchingIter``:
``DataDesc`` normalisation and renaming, shapes and dtypes of NDArray or numpy fields, and
``NDArrayIter``-style padding of a short batch."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np
from mxnet.io import DataDesc
from mxnet.ndarray import NDArray

from .._compat import device_of
from .._engine.ipc.alloc import numpy_mode

_Descs = List[DataDesc]


def _as_desc(desc: Any, arg: str) -> DataDesc:
    """A ``DataDesc`` from a ``DataDesc`` or a ``(name, shape)`` pair."""
    if isinstance(desc, DataDesc):
        return desc
    if isinstance(desc, (list, tuple)) and len(desc) == 2 and isinstance(desc[0], str):
        return DataDesc(desc[0], tuple(desc[1]))
    raise TypeError(f"{arg} must hold mx.io.DataDesc objects or (name, shape) pairs, got {desc!r}")


def _renamed(descs: Sequence[Any], rename: Optional[Dict[str, str]]) -> _Descs:
    """``descs`` as ``DataDesc`` objects, each name looked up in ``rename`` (if given)."""
    out = []
    for desc in descs:
        desc = _as_desc(desc, "provide_data/provide_label")
        name = rename.get(desc.name, desc.name) if rename else desc.name
        out.append(DataDesc(name, desc.shape, desc.dtype, layout=desc.layout))
    return out


def _batch_axis(desc: DataDesc) -> int:
    """The batch axis of a description's layout (0 when the layout has none)."""
    axis = DataDesc.get_batch_axis(getattr(desc, "layout", None))
    return max(axis, 0)


def _descs_matching(descs: _Descs, arrays: List[NDArray]) -> _Descs:
    """``descs`` if the arrays fit them, else descriptions of the arrays' real shapes."""
    if all(tuple(d.shape) == a.shape for d, a in zip(descs, arrays)):
        return descs
    return [DataDesc(d.name, a.shape, d.dtype, layout=d.layout) for d, a in zip(descs, arrays)]


def _shape_of(value: Any) -> tuple:
    """The shape of an NDArray or of anything numpy accepts."""
    return tuple(value.shape) if isinstance(value, NDArray) else np.shape(value)


def _dtype_of(value: Any) -> type:
    """The numpy scalar type of an NDArray or of anything numpy accepts."""
    if isinstance(value, NDArray):
        return np.dtype(value.dtype).type
    return np.asarray(value).dtype.type


def _to_ndarray(value: Any, dtype: Any) -> NDArray:
    """An NDArray of ``dtype`` from an NDArray or anything numpy accepts (an ``mx.np.ndarray``
    under numpy semantics, the default in MXNet 2.x, as the loader's batches are)."""
    if isinstance(value, NDArray):
        return value if np.dtype(value.dtype) == np.dtype(dtype) else value.astype(dtype)
    array = mx.nd.array(np.asarray(value), dtype=dtype)
    return array.as_np_ndarray() if numpy_mode() else array


def _pad_rows(array: NDArray, pad: int, axis: int) -> NDArray:
    """Append ``pad`` rows along ``axis``, wrapping around from the start of the batch, with
    the operators of the array's own type (legacy ``mx.nd`` operators refuse ``mx.np``
    arrays, and the other way round)."""
    n = array.shape[axis]
    rows = mx.nd.array(np.arange(pad) % n, ctx=device_of(array), dtype="int32")
    if isinstance(array, mx.np.ndarray):
        extra = mx.np.take(array, rows.as_np_ndarray(), axis=axis)
        return mx.np.concatenate([array, extra], axis=axis)
    return mx.nd.concat(array, mx.nd.take(array, rows, axis=axis), dim=axis)
