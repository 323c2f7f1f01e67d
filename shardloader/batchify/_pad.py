"""Padding variable-length samples: gluon-nlp's ``Pad`` (one axis) and MXNet 2.x's ``Pad``
(every axis)."""

from __future__ import annotations

import numbers
import typing
import warnings

import numpy as np

from .._engine.ipc import alloc as _alloc
from ._arrays import (
    _NON_NUMERIC_KINDS,
    _array_samples,
    _dtype_repr,
    _is_array,
    _is_mx_array,
    _output_dtype,
)
from ._checks import (
    BatchifyShapeError,
    _check_dtype,
    _describe,
    _is_flag,
    _is_int,
    _mx_handle,
    _require_samples,
)


def _check_round_to(round_to, shown: typing.Callable[[typing.Any], str]) -> typing.Optional[int]:
    """``round_to`` as an int, or ``None``; ``shown`` writes a value of the wrong type into the
    message."""
    if round_to is None:
        return None
    if not _is_int(round_to):
        raise TypeError(f"Pad: round_to must be None or a positive int, got {shown(round_to)}")
    if round_to < 1:
        raise ValueError(f"Pad: round_to must be None or a positive int, got {round_to}")
    return int(round_to)


def _round_up(size: int, round_to: typing.Optional[int]) -> int:
    """``size`` rounded up to a multiple of ``round_to`` (``None``: left as it is)."""
    if round_to is None:
        return size
    return -(-size // round_to) * round_to


class Pad:
    """Pad variable-length samples to the longest along ``axis``, then stack them.

    Every sample must have the same number of dimensions and the same size on every axis but
    ``axis``. Samples may be NDArrays, numpy arrays or (nested) lists of numbers.

    Parameters
    ----------
    axis : int, default 0
        The axis of each sample to pad (negative values count from the end). The batch has one
        more axis in front, so a sample's ``axis`` is the batch's ``axis + 1``.
    pad_val : int or float, optional
        The value written in the padding. Not given, it is 0 and, as in gluon-nlp, a
        ``UserWarning`` says so: the right value is often a vocabulary's padding index.
    ret_length : bool, default False
        Also return each sample's length along ``axis``, as an int32 array of shape ``(N,)``
        (gluon-nlp's ``valid_length``).
    dtype : str or numpy.dtype, optional
        The dtype of the batch. By default array samples keep their dtype (promoted, if they
        differ) and list samples give float32, as in gluon-nlp.
    round_to : int, optional
        Round the padded length up to a multiple of this, for instance to keep the number of
        distinct shapes small.

    Returns
    -------
    NDArray, or a tuple ``(NDArray, NDArray)`` with ``ret_length``
        The padded batch of shape ``(N, ...)``, and with ``ret_length`` the int32 lengths.

    Warns
    -----
    UserWarning
        When ``pad_val`` is not given; and, the first time this ``Pad`` is called with MXNet
        arrays, that numpy arrays or lists pad faster (each MXNet array is copied out of MXNet
        on its own: several times slower than numpy samples, as gluon-nlp's ``Pad`` warns).

    Examples
    --------
    >>> import numpy as np
    >>> from shardloader.batchify import Pad
    >>> Pad(pad_val=0)([[1, 2, 3, 4], [5, 6], [7]]).asnumpy()
    array([[1., 2., 3., 4.],
           [5., 6., 0., 0.],
           [7., 0., 0., 0.]], dtype=float32)
    >>> batch, length = Pad(pad_val=-1, ret_length=True, round_to=4)(
    ...     [np.array([1, 2, 3, 4, 5]), np.array([6, 7])])
    >>> batch.asnumpy()
    array([[ 1,  2,  3,  4,  5, -1, -1, -1],
           [ 6,  7, -1, -1, -1, -1, -1, -1]])
    >>> length.asnumpy()
    array([5, 2], dtype=int32)
    >>> Pad(axis=1, pad_val=0)([np.ones((2, 3)), np.ones((2, 1))]).shape
    (2, 2, 3)
    """

    uses_batch_allocator = True  # batchify._checks.ALLOCATOR_ATTR

    def __init__(
        self,
        axis: int = 0,
        pad_val: typing.Optional[typing.Union[int, float]] = None,
        ret_length: bool = False,
        dtype=None,
        round_to: typing.Optional[int] = None,
    ) -> None:
        if not _is_int(axis):
            raise TypeError(f"Pad: axis must be an int, got {_describe(axis)}")
        if pad_val is not None and not isinstance(pad_val, numbers.Real):
            raise TypeError(
                f"Pad: pad_val must be None, an int or a float, got {_describe(pad_val)}"
            )
        if not _is_flag(ret_length):
            raise TypeError(f"Pad: ret_length must be True or False, got {_describe(ret_length)}")
        round_to = _check_round_to(round_to, _describe)
        dtype = _check_dtype("Pad", dtype)
        if pad_val is None:
            warnings.warn(
                "Pad: no pad_val given, so the padding is 0; pass pad_val= to say what it "
                "should be (for token ids, often the vocabulary's padding index)",
                UserWarning,
                stacklevel=2,
            )
            pad_val = 0
        self._axis = int(axis)
        self._pad_val = pad_val
        self._warned_mx = False  # about MXNet samples, once per Pad, as gluon-nlp does
        self._ret_length = bool(ret_length)
        self._dtype = dtype
        self._round_to = round_to

    def __call__(self, data: typing.Sequence[typing.Any]):
        """Pad and stack ``data``, the samples of one batch."""
        _require_samples(data, "Pad")
        if not self._warned_mx and _is_mx_array(data[0]):
            self._warned_mx = True
            warnings.warn(
                "Pad: padding MXNet arrays is several times slower than padding numpy arrays "
                "or lists, which is what the dataset should return for speed (each MXNet "
                "array is copied out of MXNet on its own)",
                UserWarning,
                stacklevel=2,
            )
        arrays = _array_samples(data, "Pad")
        first = arrays[0]
        axis = self._normalized_axis(first)
        self._check_shapes(arrays, axis)
        lengths = [a.shape[axis] for a in arrays]
        size = _round_up(max(lengths), self._round_to)
        buf = _alloc.empty(
            (len(arrays),) + first.shape[:axis] + (size,) + first.shape[axis + 1 :],
            self._batch_dtype(data[0], arrays),
        )
        lead = (slice(None),) * axis
        for row, array, length in zip(buf, arrays, lengths):
            if length == size:
                row[...] = array
            else:
                row[lead + (slice(0, length),)] = array
                row[lead + (slice(length, None),)] = self._pad_val
        padded = _alloc.to_output(buf)
        if not self._ret_length:
            return padded
        valid = _alloc.empty((len(lengths),), np.int32)
        valid[:] = lengths
        return padded, _alloc.to_output(valid)

    @property
    def __mx_handle__(self) -> typing.Callable[[], typing.Any]:
        """Under MXNet 2.x, builds the C++ batchify function of Gluon 2.x's ``Pad`` with
        this ``pad_val``, for its C++ data pipeline (``try_nopython``). That function pads
        every axis, which gives these batches wherever this ``Pad`` accepts the samples. It
        is missing with ``ret_length``, ``round_to`` or ``dtype``, which it cannot do (in
        MXNet 2.0.0b1 its ``round_to`` aborts the process and its ``dtype`` fails), and under
        MXNet 1.x."""
        same = not self._ret_length and self._round_to is None and self._dtype is None
        return _mx_handle(self, "PadBatchify", {"pad_val": self._pad_val} if same else None)

    def _normalized_axis(self, first: np.ndarray) -> int:
        if not -first.ndim <= self._axis < first.ndim:
            raise ValueError(
                f"Pad: axis {self._axis} is out of range for samples of shape {first.shape}; "
                f"it must be in [{-first.ndim}, {first.ndim})"
            )
        return self._axis % first.ndim

    @staticmethod
    def _check_shapes(arrays, axis: int) -> None:
        first = arrays[0].shape
        for position, array in enumerate(arrays):
            shape = array.shape
            if len(shape) != len(first) or any(
                a != b for i, (a, b) in enumerate(zip(shape, first)) if i != axis
            ):
                template = (
                    f"Cannot pad the sample at {{0}}, of shape {shape}, to the one at {{1}}, "
                    f"of shape {first}.\n"
                    f"Pad: only axis {axis} of the samples may differ; make the other axes one "
                    f"size in the dataset, or pad another axis with Pad(axis=...)."
                )
                raise BatchifyShapeError.about(template, (position, 0), len(arrays))

    def _batch_dtype(self, first_sample, arrays) -> np.dtype:
        found = np.result_type(*{a.dtype for a in arrays})
        if found.kind in _NON_NUMERIC_KINDS:
            raise TypeError(
                f"Pad: cannot pad samples that are not numbers, such as "
                f"{_describe(arrays[0])}; use batchify.List to keep them"
            )
        if self._dtype is not None:
            return self._dtype
        if not _is_array(first_sample):
            # gluon-nlp hands list samples to mx.nd.array without a dtype: float32.
            return np.dtype(np.float32)
        return _output_dtype(found)

    def __repr__(self) -> str:
        return (
            f"Pad(axis={self._axis}, pad_val={self._pad_val!r}, ret_length={self._ret_length}, "
            f"dtype={_dtype_repr(self._dtype)}, round_to={self._round_to})"
        )


class _PadEveryAxis:
    """MXNet 2.x's ``Pad``: pad samples with ``val`` to the largest size on every axis (each
    rounded up to a multiple of ``round_to``), then stack them.

    The batch's dtype is ``dtype``, else the first sample's (a list sample's as numpy reads
    it: int64 or float64). Samples must have one number of dimensions. Not exported:
    gluon-nlp's ``Pad`` has the name here.
    """

    uses_batch_allocator = True  # batchify._checks.ALLOCATOR_ATTR

    def __init__(self, val=None, dtype=None, round_to=None) -> None:
        self._pad_val = 0 if val is None else val
        self._dtype = _check_dtype("Pad", dtype)
        self._round_to = _check_round_to(round_to, repr)

    def __call__(self, data: typing.Sequence[typing.Any]):
        _require_samples(data, "Pad")
        first = data[0]
        if not (_is_array(first) or isinstance(first, list)):
            raise TypeError(
                f"Pad: sample 0 must be an array or a list of numbers, got {_describe(first)}; "
                "for samples of several fields use Group(Pad(), Stack(), ...)"
            )
        arrays = _array_samples(data, "Pad")
        self._check_samples(data, arrays)
        shape = [
            _round_up(max(a.shape[axis] for a in arrays), self._round_to)
            for axis in range(arrays[0].ndim)
        ]
        dtype = self._dtype if self._dtype is not None else _output_dtype(arrays[0].dtype)
        buf = _alloc.empty([len(arrays)] + shape, dtype)
        buf[...] = self._pad_val
        for row, array in zip(buf, arrays):
            row[tuple(slice(0, size) for size in array.shape)] = array
        return _alloc.to_output(buf)

    @property
    def __mx_handle__(self) -> typing.Callable[[], typing.Any]:
        """Under MXNet 2.x, builds the C++ batchify function Gluon 2.x's ``Pad`` builds, where
        it gives these batches: not with ``dtype`` or ``round_to`` (see ``Pad``)."""
        same = self._dtype is None and self._round_to is None
        return _mx_handle(self, "PadBatchify", {"pad_val": self._pad_val} if same else None)

    @staticmethod
    def _check_samples(data, arrays) -> None:
        """Every sample must have sample 0's number of dimensions, and hold numbers."""
        ndim = arrays[0].ndim
        for position, array in enumerate(arrays):
            if array.ndim != ndim:
                raise ValueError(
                    f"Pad: sample {position} has {array.ndim} dimensions (shape {array.shape}) "
                    f"but sample 0 has {ndim} (shape {arrays[0].shape}); Pad pads every axis "
                    "of samples with one number of dimensions"
                )
            if array.dtype.kind in _NON_NUMERIC_KINDS:
                raise TypeError(
                    f"Pad: cannot pad sample {position}, which is not numbers: "
                    f"{_describe(data[position])}"
                )

    def __repr__(self) -> str:
        return (
            f"Pad(val={self._pad_val!r}, dtype={_dtype_repr(self._dtype)}, "
            f"round_to={self._round_to})"
        )
