"""Stacking samples of one shape into one buffer, and gluon-nlp's ``Stack``."""

from __future__ import annotations

import numbers
import typing

import numpy as np

from .._engine.ipc import alloc as _alloc
from ._arrays import (
    _NON_NUMERIC_KINDS,
    _array_sample,
    _dtype_repr,
    _filled_buffer,
    _is_array,
    _output_dtype,
)
from ._checks import BatchifyShapeError, _check_dtype, _describe, _mx_handle, _require_samples

# What to do with samples of different shapes: the second line of a stacking error.
_PAD_HINT = (
    "Pad the samples to one shape with batchify_fn=batchify.Pad(pad_val=0) (for samples of "
    "several fields, batchify.Tuple(batchify.Pad(pad_val=0), batchify.Stack())), or make them "
    "one shape in the dataset."
)
# Channel counts that make a 3-d array an image (grey, RGB, RGBA).
_IMAGE_CHANNELS = (1, 3, 4)


def _shape_of(x) -> tuple:
    """The shape numpy would give ``x``, without numpy's warning for ragged input.

    ``None`` stands for the size of an axis whose items disagree (a ragged list).
    """
    if _is_array(x):
        return tuple(x.shape)
    if isinstance(x, (list, tuple)):
        inner = {_shape_of(item) for item in x}
        if len(inner) > 1:
            return (len(x), None)
        return (len(x),) + (inner.pop() if inner else ())
    return ()


_NO_LEAF = object()


def _first_leaf(x):
    """The first value in ``x`` that is not a list or tuple, depth first, or ``_NO_LEAF``.

    Unlike ``shardloader._engine.nest.leaves``, a dict is a leaf here: ``np.asarray`` reads
    a dict as one object, so the leaf that decides whether samples are numbers is the dict.
    """
    if not isinstance(x, (list, tuple)):
        return x
    for item in x:
        leaf = _first_leaf(item)
        if leaf is not _NO_LEAF:
            return leaf
    return _NO_LEAF


def _is_numeric_leaf(x) -> bool:
    if x is _NO_LEAF:
        return True
    if isinstance(x, (np.ndarray, np.generic)):
        return np.dtype(x.dtype).kind not in _NON_NUMERIC_KINDS
    return isinstance(x, numbers.Number) or _is_array(x)


def _image_layout(shape: tuple, first_shape: tuple) -> typing.Optional[str]:
    """``"HWC"`` or ``"CHW"`` when both shapes are images with one channel count that
    differ in height or width only, else ``None``."""
    if len(shape) != 3 or len(first_shape) != 3 or None in shape or None in first_shape:
        return None
    if shape[2] == first_shape[2] and shape[2] in _IMAGE_CHANNELS:
        return "HWC"
    if shape[0] == first_shape[0] and shape[0] in _IMAGE_CHANNELS:
        return "CHW"
    return None


def _mismatch_error(position: int, shape, first_shape, count: int) -> BatchifyShapeError:
    """The error for the sample at ``position`` whose shape is not sample 0's: the first
    line says which samples differ, the second what to do (resize or crop images, pad
    anything else)."""
    shape, first_shape = tuple(shape), tuple(first_shape)
    layout = _image_layout(shape, first_shape)
    if layout is None:
        hint, what = _PAD_HINT, "sample"
    else:
        height, width = first_shape[:2] if layout == "HWC" else first_shape[1:]
        size = f"({width}, {height})"
        hint = (
            f"Resize or crop the images to one size in the dataset's transform, e.g. with "
            f"mxnet.gluon.data.vision.transforms.Resize({size}) or CenterCrop({size}) "
            f"(sizes are (width, height){', before ToTensor' if layout == 'CHW' else ''}); "
            f"padding would add borders."
        )
        what = f"image ({layout})"
    template = (
        f"Cannot stack the {what} at {{0}}, of shape {shape}, with the one at {{1}}, "
        f"of shape {first_shape}: the samples of a batch must have one shape.\n{hint}"
    )
    return BatchifyShapeError.about(template, (position, 0), count)


def _check_same_shapes(samples) -> None:
    """Raise the mismatch error for the first sample whose shape differs from sample 0's."""
    first_shape = _shape_of(samples[0])
    for position, sample in enumerate(samples):
        shape = _shape_of(sample) if position else first_shape
        if shape != first_shape:
            raise _mismatch_error(position, shape, first_shape, len(samples))
        if None in shape:
            template = (
                f"Cannot stack the sample at {{0}}, of shape {shape}: its nested lists differ "
                f"in length.\n{_PAD_HINT}"
            )
            raise BatchifyShapeError.about(template, (position,), len(samples))


def _uniform_lists(data) -> bool:
    """Whether list samples nest lists of equal lengths at every level (checked per level, not
    per number), so that ``np.asarray`` will not meet a ragged list."""
    level = data
    while level and type(level[0]) is list:
        length = len(level[0])
        for node in level:
            if type(node) is not list or len(node) != length:
                return False
        level = [item for node in level for item in node]
    return True


def _stack_arrays(
    data, dtype: typing.Optional[np.dtype], owner: str
) -> typing.Optional[np.ndarray]:
    """Stack array samples (numpy or NDArray) into one allocator buffer.

    Returns ``None`` when the arrays hold no numbers (strings, objects).
    """
    first = data[0]
    # The common case, numpy samples of one shape and dtype, is joined along the samples'
    # first axis into a flat view of the buffer, with no view per sample. Otherwise each
    # sample becomes a (1, ...) view, and numpy finds the dtype and checks the shapes.
    uniform = (
        type(first) is np.ndarray
        and first.ndim > 0
        and set(map(type, data)) == {np.ndarray}
        and len({(a.shape, a.dtype) for a in data}) == 1
    )
    if uniform:
        parts, found, shape = data, first.dtype, first.shape
    else:
        parts = [
            a[None] if type(a) is np.ndarray else _array_sample(a, position, owner)[None]
            for position, a in enumerate(data)
        ]
        try:
            found = np.result_type(*parts)
        except TypeError:  # no common dtype, e.g. strings and numbers
            return None
        shape = parts[0].shape[1:]
    if found.kind in _NON_NUMERIC_KINDS:
        return None
    if dtype is None:
        dtype = _output_dtype(found)
    buf = _alloc.empty((len(data),) + shape, dtype)
    out = buf.reshape((len(data) * shape[0],) + shape[1:]) if uniform else buf
    try:
        np.concatenate(parts, out=out, casting="unsafe")
        return buf
    except ValueError as exc:
        # numpy checks the shapes for us; only a failure pays for finding the culprit.
        refused = exc
    # Outside the except clause, so that numpy's message does not lengthen the traceback.
    _check_same_shapes([v[0] for v in parts])  # (a uniform batch never gets here)
    raise refused


def _stack_values(data, dtype: typing.Optional[np.dtype]) -> typing.Optional[np.ndarray]:
    """Stack numbers, numpy scalars or nested lists of them into one allocator buffer.

    Returns ``None`` when the values are not numbers (strings, ``None``, objects).
    """
    first = data[0]
    # Compare list lengths before numpy sees ragged lists: it would warn and build objects.
    if type(first) is list and not _uniform_lists(data):
        if not _is_numeric_leaf(_first_leaf(data)):
            return None
        _check_same_shapes(data)
    refused: typing.Optional[ValueError] = None
    try:
        values = np.asarray(data)
    except ValueError as exc:
        refused = exc
    if refused is not None:
        # numpy refuses some ragged inputs outright; say which sample it was.
        _check_same_shapes(data)
        raise refused
    found = values.dtype
    if found.kind in _NON_NUMERIC_KINDS:
        if found.kind == "O" and _is_numeric_leaf(_first_leaf(data)):
            _check_same_shapes(data)
        return None
    return _filled_buffer(values, _output_dtype(found) if dtype is None else dtype)


def _stack(
    data, dtype: typing.Optional[np.dtype] = None, owner: str = "default_batchify_fn"
) -> typing.Optional[np.ndarray]:
    """Stack the leaves of one batch into an allocator buffer, or ``None`` if not numeric."""
    _require_samples(data, None)
    if _is_array(data[0]):
        return _stack_arrays(data, dtype, owner)
    return _stack_values(data, dtype)


class Stack:
    """Stack samples of one shape along a new first axis.

    Samples may be NDArrays, numpy arrays, numbers, or lists of numbers; lists are read with
    ``np.asarray``, so ``[1, 2]`` becomes an int64 row.

    Parameters
    ----------
    dtype : str or numpy.dtype, optional
        The dtype of the batch. The default keeps the samples' dtype (promoted, if the samples
        differ).

    Raises
    ------
    ValueError
        At call time, if the samples' shapes differ (the message names the first offending
        sample), or if the batch is empty.
    TypeError
        At call time, if the samples are not numbers (use ``List`` for those).

    Examples
    --------
    >>> import numpy as np
    >>> from shardloader.batchify import Stack
    >>> Stack()([[1, 2, 3], [4, 5, 6]]).asnumpy()
    array([[1, 2, 3],
           [4, 5, 6]])
    >>> Stack(dtype="float32")([np.array([1, 2]), np.array([3, 4])]).asnumpy()
    array([[1., 2.],
           [3., 4.]], dtype=float32)
    """

    uses_batch_allocator = True  # batchify._checks.ALLOCATOR_ATTR

    def __init__(self, dtype=None) -> None:
        self._dtype = _check_dtype("Stack", dtype)

    def __call__(self, data: typing.Sequence[typing.Any]):
        """Stack ``data``, the samples of one batch, into an NDArray of shape ``(N, ...)``."""
        buf = _stack(data, self._dtype, "Stack")
        if buf is None:
            raise TypeError(
                f"Stack: cannot stack samples that are not numbers, such as "
                f"{_describe(_first_leaf(data))}; use batchify.List to keep them as a list"
            )
        return _alloc.to_output(buf)

    @property
    def __mx_handle__(self) -> typing.Callable[[], typing.Any]:
        """Under MXNet 2.x, builds the C++ batchify function of Gluon 2.x's ``Stack``, for
        its C++ data pipeline (``try_nopython``); missing with a ``dtype``, which that
        function cannot cast to, and under MXNet 1.x."""
        return _mx_handle(self, "StackBatchify", {} if self._dtype is None else None)

    def __repr__(self) -> str:
        return f"Stack(dtype={_dtype_repr(self._dtype)})"
