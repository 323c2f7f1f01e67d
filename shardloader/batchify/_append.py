"""MXNet 2.x's ``Append``: one array per sample, for samples of different shapes."""

from __future__ import annotations

import typing

import numpy as np

from .._engine.ipc import alloc as _alloc
from ._arrays import _array_sample, _filled_buffer, _is_mx_array, _output_dtype
from ._checks import _describe, _is_flag, _is_int


class Append:
    """MXNet 2.x's ``Append``: one array per sample, in a list, without padding, for samples
    of different shapes.

    Each sample becomes an array of its own: MXNet arrays keep their dtype; anything else
    becomes float32, as ``mx.nd.array`` makes it. With ``expand`` each array gets a batch
    axis of size 1 at ``batch_axis``.

    Parameters
    ----------
    expand : bool, default True
        Add a batch axis to every array.
    batch_axis : int, default 0
        Where the batch axis goes (with ``expand``).
    use_shared_mem : bool, default False
        Accepted for MXNet 2.x's signature and ignored: the loader's transport decides where
        a batch's memory lives.

    Notes
    -----
    Under numpy semantics (MXNet 2.x's default) the arrays are ``mx.np.ndarray``; MXNet
    2.0.0b1's own ``Append`` fails there (it looks for ``mx.np.NDArray``), so the rule
    above is the one its legacy mode follows. A number sample becomes an array of shape
    ``(1,)`` with ``expand`` (2.0.0b1's legacy ``Append`` fails on it).

    Examples
    --------
    >>> from shardloader.batchify import Append
    >>> [a.shape for a in Append()([[1, 2, 3], [4, 5]])]
    [(1, 3), (1, 2)]
    >>> [a.asnumpy().tolist() for a in Append(expand=False)([[1, 2, 3], [4, 5]])]
    [[1.0, 2.0, 3.0], [4.0, 5.0]]
    """

    uses_batch_allocator = True  # batchify._checks.ALLOCATOR_ATTR

    def __init__(self, expand: bool = True, batch_axis: int = 0, use_shared_mem: bool = False):
        if not _is_flag(expand):
            raise TypeError(f"Append: expand must be True or False, got {_describe(expand)}")
        if not _is_int(batch_axis):
            raise TypeError(f"Append: batch_axis must be an int, got {_describe(batch_axis)}")
        self._expand = bool(expand)
        self._batch_axis = int(batch_axis)

    def __call__(self, data: typing.Sequence[typing.Any]) -> list:
        """One array per sample of ``data``, in order."""
        out = []
        for position, sample in enumerate(data):
            array = _array_sample(sample, position, "Append")
            if not _is_mx_array(sample):
                array = np.asarray(array, dtype=np.float32)
            if self._expand:
                array = self._expanded(array, position)
            out.append(_alloc.to_output(_filled_buffer(array, _output_dtype(array.dtype))))
        return out

    def _expanded(self, array: np.ndarray, position: int) -> np.ndarray:
        """``array`` with a batch axis of size 1 at ``batch_axis`` (a number: shape ``(1,)``)."""
        if array.ndim == 0:
            return array.reshape(1)
        axis = self._batch_axis
        if not -array.ndim - 1 <= axis <= array.ndim:
            raise ValueError(
                f"Append: batch_axis {axis} is out of range for sample {position} "
                f"of shape {array.shape}; it must be in "
                f"[{-array.ndim - 1}, {array.ndim}]"
            )
        return np.expand_dims(array, axis)

    def __repr__(self) -> str:
        return f"Append(expand={self._expand}, batch_axis={self._batch_axis})"
