"""Batchify functions: turn a list of samples into one batch.

A batchify function is a small callable that receives the samples of one batch, in sampler
order, and returns the batch. ``default_batchify_fn`` reproduces Gluon's function of that
name (MXNet 1.9.1's default); ``Stack``, ``Pad``, ``Tuple``, ``List``, ``Dict`` and
``NamedTuple`` reproduce gluon-nlp's ``gluonnlp.data.batchify``; ``Group``, ``AsList`` and
``Append`` reproduce MXNet 2.x's ``mxnet.gluon.data.batchify``.

MXNet 2.x's ``Stack`` and ``Pad`` share their names with gluon-nlp's but not their meaning
(2.x's ``Stack`` splits list samples into fields; its ``Pad`` pads every axis and has no
``axis`` or ``ret_length``). The names here keep gluon-nlp's meaning. Pass 2.x's own
``mx.gluon.data.batchify.Stack()`` or ``Pad()`` to a loader: ``gluon_equivalent`` swaps
them, and 2.x's ``Group``, ``AsList``, ``Append`` and Gluon's ``default_batchify_fn``, for
implementations here that give the same batches and stack straight into a worker's shared
memory.

None of them knows about shared memory or devices. Every output array is a buffer from
``shardloader._alloc.empty``, filled in place and handed back through
``shardloader._alloc.to_output``. By default that is an MXNet array wrapping the buffer on
``cpu(0)``: an ``mx.np.ndarray`` under numpy semantics (MXNet 2.x's default), else an
``mx.nd.NDArray``; inside a worker process the transport makes the buffer a piece of shared
memory and keeps the result a numpy array, so a batch is written once, where the main process
will read it.

Samples may be ``mx.nd.NDArray``, numpy arrays, numpy scalars, Python numbers, or nested
tuples, lists and dicts of those. The output dtypes are the ones an MXNet ``NDArray`` can hold:
bool, uint8, int8, int32, int64, float16, float32 and float64.
"""

from __future__ import annotations

import numbers
import sys
import typing

import numpy as np

from ._engine.ipc import alloc as _alloc

__all__ = [
    "default_batchify_fn",
    "default_mp_batchify_fn",
    "Stack",
    "Pad",
    "Tuple",
    "List",
    "Dict",
    "NamedTuple",
    "Group",
    "AsList",
    "Append",
    "BatchifyTypeError",
    "gluon_equivalent",
]

# The dtypes an mx.nd.NDArray can hold (mxnet.ndarray.ndarray._DTYPE_NP_TO_MX, less bfloat16).
_MX_DTYPES = frozenset(
    np.dtype(name)
    for name in ("bool", "uint8", "int8", "int32", "int64", "float16", "float32", "float64")
)
_MX_DTYPE_NAMES = "bool, uint8, int8, int32, int64, float16, float32, float64"

# numpy dtype kinds that are not numbers: object, bytes, str, void, datetime, timedelta.
_NON_NUMERIC_KINDS = frozenset("OSUVMm")

_PAD_HINT = "use batchify.Pad to pad variable-length samples"

Batchify = typing.Callable[[typing.Sequence[typing.Any]], typing.Any]


class BatchifyTypeError(TypeError, ValueError):
    """A wrong type given to a batchify function: a ``TypeError`` that is also a ``ValueError``.

    gluon-nlp's ``Dict`` and ``NamedTuple`` raise ``ValueError`` where a type is wrong (a
    function that is not callable, ``fn_dict`` that is not a dict, a sample of another
    namedtuple type). shardloader raises this instead, so that code written for gluon-nlp
    (``except ValueError``) and code that expects a ``TypeError`` both catch it.

    Examples
    --------
    >>> from shardloader.batchify import BatchifyTypeError, Dict
    >>> try:
    ...     Dict({"data": "not a function"})
    ... except ValueError as exc:
    ...     print(type(exc) is BatchifyTypeError, isinstance(exc, TypeError))
    True True
    """


# ----------------------------------------------------------------------------------------------
# Private helpers


def _ndarray_class():
    """``mx.nd.NDArray`` if MXNet has been imported, else ``None``.

    No sample can be an NDArray before MXNet is imported, so the check need not import it.
    (Importing ``shardloader`` imports MXNet anyway, for the loader; this only keeps the
    per-sample type test from touching MXNet's modules.)
    """
    mx = sys.modules.get("mxnet")
    nd = getattr(mx, "nd", None)
    return getattr(nd, "NDArray", None)


def _to_numpy(x) -> np.ndarray:
    """One sample as a numpy array (NDArrays via ``asnumpy``)."""
    if isinstance(x, np.ndarray):
        return np.asarray(x)
    nd = _ndarray_class()
    if nd is not None and isinstance(x, nd):
        # Host memory is read in place: stacking then copies each sample once, not twice.
        view = _alloc.host_view(x)
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


def _is_array(x) -> bool:
    if isinstance(x, np.ndarray):
        return True
    nd = _ndarray_class()
    return nd is not None and isinstance(x, nd)


def _describe(value) -> str:
    return f"{value!r} ({type(value).__name__})"


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
    """The first value in ``x`` that is not a list or tuple, depth first, or ``_NO_LEAF``."""
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


def _mismatch_error(position: int, shape, first_shape) -> ValueError:
    return ValueError(
        f"cannot stack sample {position} of shape {tuple(shape)} with sample 0 of shape "
        f"{tuple(first_shape)}; {_PAD_HINT}"
    )


def _check_same_shapes(samples) -> None:
    """Raise the mismatch error for the first sample whose shape differs from sample 0's."""
    first_shape = _shape_of(samples[0])
    for position, sample in enumerate(samples):
        shape = _shape_of(sample) if position else first_shape
        if shape != first_shape:
            raise _mismatch_error(position, shape, first_shape)
        if None in shape:
            raise ValueError(
                f"cannot stack sample {position} of shape {shape}: its nested lists differ in "
                f"length; {_PAD_HINT}"
            )


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


def _output_dtype(dtype: np.dtype) -> np.dtype:
    """``dtype`` if an NDArray can hold it, else a ``TypeError`` that says which can."""
    if dtype in _MX_DTYPES:
        return dtype
    native = dtype.newbyteorder("=")
    if native in _MX_DTYPES:
        return native
    raise TypeError(
        f"cannot batchify samples of dtype {dtype}: MXNet NDArrays hold only {_MX_DTYPE_NAMES}; "
        "convert the samples, or use batchify.Stack(dtype=...)"
    )


def _check_dtype(owner: str, dtype) -> typing.Optional[np.dtype]:
    if dtype is None:
        return None
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"{owner}: dtype must be None or a numpy dtype ({_MX_DTYPE_NAMES}), "
            f"got {_describe(dtype)}"
        ) from None
    if resolved not in _MX_DTYPES:
        raise ValueError(
            f"{owner}: dtype must be None or one of {_MX_DTYPE_NAMES} (the dtypes MXNet "
            f"NDArrays hold), got {dtype!r}"
        )
    return resolved


def _check_callable(owner: str, name: str, fn) -> None:
    if not callable(fn):
        raise BatchifyTypeError(
            f"{owner}: {name} must be a callable batchify function, got {_describe(fn)}"
        )


def _stack_arrays(
    data, dtype: typing.Optional[np.dtype], owner: str
) -> typing.Optional[np.ndarray]:
    """Stack array samples (numpy or NDArray) into one allocator buffer.

    Returns ``None`` when the arrays hold no numbers (strings, objects).
    """
    # One pass: a (1, ...) view of every sample, ready to concatenate into the output buffer.
    views = [
        a[None] if type(a) is np.ndarray else _array_sample(a, position, owner)[None]
        for position, a in enumerate(data)
    ]
    try:
        found = np.result_type(*views)
    except TypeError:  # no common dtype, e.g. strings and numbers
        return None
    if found.kind in _NON_NUMERIC_KINDS:
        return None
    if dtype is None:
        dtype = _output_dtype(found)
    buf = _alloc.empty((len(views),) + views[0].shape[1:], dtype)
    try:
        np.concatenate(views, out=buf, casting="unsafe")
    except ValueError:
        # numpy checks the shapes for us; only a failure pays for finding the culprit.
        _check_same_shapes([v[0] for v in views])
        raise
    return buf


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
    try:
        values = np.asarray(data)
    except ValueError:
        # numpy refuses some ragged inputs outright; say which sample it was.
        _check_same_shapes(data)
        raise
    found = values.dtype
    if found.kind in _NON_NUMERIC_KINDS:
        if found.kind == "O" and _is_numeric_leaf(_first_leaf(data)):
            _check_same_shapes(data)
        return None
    buf = _alloc.empty(values.shape, _output_dtype(found) if dtype is None else dtype)
    np.copyto(buf, values, casting="unsafe")
    return buf


def _stack(
    data, dtype: typing.Optional[np.dtype] = None, owner: str = "default_batchify_fn"
) -> typing.Optional[np.ndarray]:
    """Stack the leaves of one batch into an allocator buffer, or ``None`` if not numeric."""
    if len(data) == 0:
        raise ValueError("cannot batchify an empty batch: it has no samples")
    if _is_array(data[0]):
        return _stack_arrays(data, dtype, owner)
    return _stack_values(data, dtype)


def _fields(data, count: int, owner: str) -> typing.Iterator[tuple]:
    """Transpose samples of ``count`` fields each into ``count`` tuples of values."""
    try:
        lengths = set(map(len, data))
    except TypeError:
        lengths = None
    if lengths != {count}:
        for position, sample in enumerate(data):
            if not hasattr(sample, "__len__"):
                raise TypeError(
                    f"{owner}: sample {position} must be a tuple or list of {count} fields, "
                    f"got {_describe(sample)}"
                )
            if len(sample) != count:
                raise ValueError(
                    f"{owner}: sample {position} has {len(sample)} fields, expected {count}: "
                    f"{_describe(sample)}"
                )
    return zip(*data)


# ----------------------------------------------------------------------------------------------
# Gluon's default


def default_batchify_fn(data: typing.Sequence[typing.Any]):
    """Collate a list of samples into a batch, as Gluon 1.9.1's ``default_batchify_fn`` does.

    - NDArray or numpy-array samples are stacked along a new first axis.
    - Tuple samples give a *list* with one batch per field, batchified recursively.
    - Anything else goes through ``np.asarray(data)`` and keeps that dtype: Python ints
      become int64, Python floats float64, numpy scalars keep their dtype.

    Extensions beyond Gluon, which would fail on these inputs:

    - Dict samples give a dict with one batch per key (every sample needs the same keys).
    - Namedtuple samples give the same namedtuple type, one batch per field (Gluon gives a
      list).
    - Leaves that are not numbers (strings, ``None``, other objects, record and structured
      arrays, which keep their field names) come back as the plain Python list of those
      leaves.
    - A masked array with masked values raises a ``ValueError`` (Gluon silently stacks the
      values under the mask). One with nothing masked is stacked as its data, and a masked
      scalar becomes ``nan``, as in Gluon.
    - Samples of different shapes raise a ``ValueError`` that names the first offending
      sample and both shapes; tuple samples with different numbers of fields raise too
      (Gluon silently drops the extra fields).

    Parameters
    ----------
    data : sequence
        The samples of one batch.

    Returns
    -------
    NDArray, list, dict or namedtuple
        The batch. Inside a worker the array leaves are numpy arrays instead of NDArrays.

    Examples
    --------
    >>> import numpy as np
    >>> from shardloader.batchify import default_batchify_fn
    >>> batch = default_batchify_fn([np.array([1.0, 2.0], dtype=np.float32),
    ...                              np.array([3.0, 4.0], dtype=np.float32)])
    >>> batch.asnumpy()
    array([[1., 2.],
           [3., 4.]], dtype=float32)
    >>> data, label = default_batchify_fn([(np.zeros(3), 0), (np.ones(3), 1)])
    >>> data.shape, label.asnumpy()
    ((2, 3), array([0, 1]))
    >>> batch = default_batchify_fn([{"x": 1.5, "name": "a"}, {"x": 2.5, "name": "b"}])
    >>> batch["x"].asnumpy(), batch["name"]
    (array([1.5, 2.5]), ['a', 'b'])
    """
    return _collate(data, split_lists=False, owner="default_batchify_fn")


def _collate(data, split_lists: bool, owner: str):
    """``default_batchify_fn``; with ``split_lists``, list samples are split into fields as
    tuple samples are (MXNet 2.x's ``Stack``)."""
    first = data[0] if len(data) else None
    if isinstance(first, tuple) or (split_lists and isinstance(first, list)):
        fields = _fields(data, len(first), owner)
        container = type(first)
        if hasattr(container, "_fields"):
            for position, sample in enumerate(data):
                if type(sample) is not container:
                    raise TypeError(
                        f"{owner}: sample {position} is {_describe(sample)}, but "
                        f"sample 0 is a {container.__name__}; all samples must have one type"
                    )
            return container(*[_collate(field, split_lists, owner) for field in fields])
        return [_collate(field, split_lists, owner) for field in fields]
    if isinstance(first, dict):
        return _batchify_dicts(data, split_lists, owner)
    buf = _stack(data, owner=owner)
    if buf is None:
        return list(data)
    return _alloc.to_output(buf)


def _batchify_dicts(data, split_lists: bool, owner: str) -> dict:
    keys = data[0].keys()
    for position, sample in enumerate(data):
        if not isinstance(sample, dict) or sample.keys() != keys:
            raise ValueError(
                f"{owner}: sample {position} must be a dict with the keys of "
                f"sample 0 {sorted(keys, key=repr)}, got {_describe(sample)}"
            )
    return {key: _collate([sample[key] for sample in data], split_lists, owner) for key in keys}


default_mp_batchify_fn = default_batchify_fn
"""Gluon's name for the batchify function its worker processes use; the same function here,
since the transport, not the batchify function, decides where the buffers live."""


# ----------------------------------------------------------------------------------------------
# gluon-nlp's batchify functions


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

    def __repr__(self) -> str:
        return f"Stack(dtype={_dtype_repr(self._dtype)})"


class Pad:
    """Pad variable-length samples to the longest along ``axis``, then stack them.

    Every sample must have the same number of dimensions and the same size on every axis but
    ``axis``. Samples may be NDArrays, numpy arrays or (nested) lists of numbers.

    Parameters
    ----------
    axis : int, default 0
        The axis of each sample to pad (negative values count from the end). The batch has one
        more axis in front, so a sample's ``axis`` is the batch's ``axis + 1``.
    pad_val : int or float, default 0
        The value written in the padding.
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

    Examples
    --------
    >>> import numpy as np
    >>> from shardloader.batchify import Pad
    >>> Pad()([[1, 2, 3, 4], [5, 6], [7]]).asnumpy()
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
    >>> Pad(axis=1)([np.ones((2, 3)), np.ones((2, 1))]).shape
    (2, 2, 3)
    """

    def __init__(
        self,
        axis: int = 0,
        pad_val: typing.Union[int, float] = 0,
        ret_length: bool = False,
        dtype=None,
        round_to: typing.Optional[int] = None,
    ) -> None:
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise TypeError(f"Pad: axis must be an int, got {_describe(axis)}")
        if not isinstance(pad_val, numbers.Real):
            raise TypeError(f"Pad: pad_val must be an int or a float, got {_describe(pad_val)}")
        if not isinstance(ret_length, (bool, np.bool_)):
            raise TypeError(f"Pad: ret_length must be True or False, got {_describe(ret_length)}")
        if round_to is not None:
            if isinstance(round_to, bool) or not isinstance(round_to, (int, np.integer)):
                raise TypeError(
                    f"Pad: round_to must be None or a positive int, got {_describe(round_to)}"
                )
            if round_to < 1:
                raise ValueError(f"Pad: round_to must be None or a positive int, got {round_to}")
            round_to = int(round_to)
        self._axis = int(axis)
        self._pad_val = pad_val
        self._ret_length = bool(ret_length)
        self._dtype = _check_dtype("Pad", dtype)
        self._round_to = round_to

    def __call__(self, data: typing.Sequence[typing.Any]):
        """Pad and stack ``data``, the samples of one batch."""
        if len(data) == 0:
            raise ValueError("Pad: cannot batchify an empty batch: it has no samples")
        arrays = [_array_sample(sample, position, "Pad") for position, sample in enumerate(data)]
        first = arrays[0]
        axis = self._normalized_axis(first)
        self._check_shapes(arrays, axis)
        lengths = [a.shape[axis] for a in arrays]
        size = max(lengths)
        if self._round_to is not None:
            size = -(-size // self._round_to) * self._round_to
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
                raise ValueError(
                    f"Pad: cannot pad sample {position} of shape {shape} to sample 0 of shape "
                    f"{first}: only axis {axis} may differ"
                )

    def _batch_dtype(self, first_sample, arrays) -> np.dtype:
        found = np.result_type(*{a.dtype for a in arrays})
        if found.kind in _NON_NUMERIC_KINDS:
            raise TypeError(
                f"Pad: cannot pad samples that are not numbers, such as "
                f"{_describe(_first_leaf(arrays))}; use batchify.List to keep them"
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


class Tuple:
    """Apply one batchify function per field of tuple (or list) samples.

    Parameters
    ----------
    fn : callable, or a list or tuple of callables
        The batchify function of field 0, or the functions of all fields.
    *fns : callable
        The batchify functions of fields 1, 2, ... (only when ``fn`` is a single callable).

    Returns
    -------
    tuple
        One batch per field, in field order.

    Raises
    ------
    ValueError
        At call time, if a sample does not have one field per function.

    Examples
    --------
    >>> from shardloader.batchify import Pad, Stack, Tuple
    >>> tokens, label = Tuple(Pad(), Stack())([([1, 2, 3], 0), ([4], 1)])
    >>> tokens.asnumpy()
    array([[1., 2., 3.],
           [4., 0., 0.]], dtype=float32)
    >>> label.asnumpy()
    array([0, 1])
    """

    def __init__(self, fn, *fns) -> None:
        name = type(self).__name__
        if isinstance(fn, (list, tuple)):
            if fns:
                raise ValueError(
                    f"{name}: pass the functions as {name}(a, b, c) or {name}([a, b, c]), not "
                    f"both; got fn={fn!r} and {len(fns)} more"
                )
            fns = tuple(fn)
        else:
            fns = (fn,) + fns
        if not fns:
            raise ValueError(f"{name}: needs at least one batchify function, got an empty list")
        for index, each in enumerate(fns):
            _check_callable(name, f"fn[{index}]", each)
        self._fns = fns

    def __call__(self, data: typing.Sequence[typing.Any]) -> tuple:
        """Batchify field ``i`` of every sample in ``data`` with function ``i``."""
        name = type(self).__name__
        if len(data) == 0:
            raise ValueError(f"{name}: cannot batchify an empty batch: it has no samples")
        fields = _fields(data, len(self._fns), name)
        return tuple(fn(list(field)) for fn, field in zip(self._fns, fields))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self._fns))})"


class List:
    """Return the samples as a plain list, unchanged (for text, ids and other objects).

    Examples
    --------
    >>> from shardloader.batchify import List, Stack, Tuple
    >>> _, words = Tuple(Stack(), List())([([1, 2], "hello"), ([3, 4], "world")])
    >>> words
    ['hello', 'world']
    """

    def __call__(self, data: typing.Sequence[typing.Any]) -> list:
        """The samples of one batch, as a list."""
        return list(data)

    def __repr__(self) -> str:
        return "List()"


class Dict:
    """Apply one batchify function per key of dict samples.

    Parameters
    ----------
    fn_dict : dict
        Maps each key to the batchify function of that key's values. Keys of the samples that
        are not in ``fn_dict`` are left out of the batch.

    Returns
    -------
    dict
        One batch per key of ``fn_dict``, in its order.

    Examples
    --------
    >>> from shardloader.batchify import Dict, Pad, Stack
    >>> batch = Dict({"data": Pad(), "label": Stack()})(
    ...     [{"data": [1, 2, 3], "label": 0}, {"data": [4], "label": 1}])
    >>> batch["data"].asnumpy()
    array([[1., 2., 3.],
           [4., 0., 0.]], dtype=float32)
    >>> batch["label"].asnumpy()
    array([0, 1])
    """

    def __init__(self, fn_dict: typing.Mapping[typing.Any, Batchify]) -> None:
        if not isinstance(fn_dict, typing.Mapping):
            raise BatchifyTypeError(
                f"Dict: fn_dict must be a dict of key -> batchify function, got "
                f"{_describe(fn_dict)}"
            )
        for key, fn in fn_dict.items():
            _check_callable("Dict", f"fn_dict[{key!r}]", fn)
        self._fn_dict = dict(fn_dict)

    def __call__(self, data: typing.Sequence[typing.Any]) -> dict:
        """Batchify the values of each key of ``fn_dict`` across the samples in ``data``."""
        for position, sample in enumerate(data):
            if not isinstance(sample, typing.Mapping):
                raise TypeError(f"Dict: sample {position} must be a dict, got {_describe(sample)}")
            missing = [key for key in self._fn_dict if key not in sample]
            if missing:
                raise ValueError(
                    f"Dict: sample {position} lacks the keys {missing}; it has {list(sample)}"
                )
        return {key: fn([sample[key] for sample in data]) for key, fn in self._fn_dict.items()}

    def __repr__(self) -> str:
        return f"Dict({self._fn_dict!r})"


class NamedTuple:
    """Apply one batchify function per field of namedtuple samples; return that namedtuple.

    Parameters
    ----------
    container : type
        The namedtuple class of the samples (and of the batch).
    fn_info : list, tuple or dict
        The batchify functions, one per field, in field order or keyed by field name.

    Examples
    --------
    >>> from collections import namedtuple
    >>> from shardloader.batchify import NamedTuple, Pad, Stack
    >>> Sample = namedtuple("Sample", ["data", "label"])
    >>> batchify = NamedTuple(Sample, {"data": Pad(), "label": Stack()})
    >>> batch = batchify([Sample([1, 2, 3], 0), Sample([4], 1)])
    >>> type(batch).__name__, batch.data.shape, batch.label.asnumpy()
    ('Sample', (2, 3), array([0, 1]))
    """

    def __init__(self, container: type, fn_info) -> None:
        if not (isinstance(container, type) and issubclass(container, tuple)) or not hasattr(
            container, "_fields"
        ):
            raise TypeError(
                f"NamedTuple: container must be a namedtuple class, got {_describe(container)}"
            )
        fields = tuple(container._fields)
        if isinstance(fn_info, typing.Mapping):
            missing = [name for name in fields if name not in fn_info]
            extra = [name for name in fn_info if name not in fields]
            if missing or extra:
                raise ValueError(
                    f"NamedTuple: fn_info must have one function per field of "
                    f"{container.__name__} {list(fields)}; missing {missing}, unknown {extra}"
                )
            fns = tuple(fn_info[name] for name in fields)
        elif isinstance(fn_info, (list, tuple)):
            if len(fn_info) != len(fields):
                raise ValueError(
                    f"NamedTuple: fn_info must have {len(fields)} functions, one per field of "
                    f"{container.__name__} {list(fields)}, got {len(fn_info)}"
                )
            fns = tuple(fn_info)
        else:
            raise BatchifyTypeError(
                f"NamedTuple: fn_info must be a list, tuple or dict of batchify functions, got "
                f"{_describe(fn_info)}"
            )
        for name, fn in zip(fields, fns):
            _check_callable("NamedTuple", f"fn_info[{name!r}]", fn)
        self._container = container
        self._fns = fns

    def __call__(self, data: typing.Sequence[typing.Any]):
        """Batchify each field across the samples in ``data``; return a ``container``."""
        if len(data) == 0:
            raise ValueError("NamedTuple: cannot batchify an empty batch: it has no samples")
        for position, sample in enumerate(data):
            if not isinstance(sample, self._container):
                raise BatchifyTypeError(
                    f"NamedTuple: sample {position} must be a {self._container.__name__}, got "
                    f"{_describe(sample)}"
                )
        fields = zip(*data)
        return self._container(*[fn(list(field)) for fn, field in zip(self._fns, fields)])

    def __repr__(self) -> str:
        return f"NamedTuple({self._container.__name__}, {list(self._fns)!r})"


# ----------------------------------------------------------------------------------------------
# MXNet 2.x's batchify functions


class Group(Tuple):
    """MXNet 2.x's name for ``Tuple``: one batchify function per field of tuple (or list)
    samples; returns a tuple with one batch per field.

    Parameters
    ----------
    fn : callable, or a list or tuple of callables
        The batchify function of field 0, or the functions of all fields.
    *fns : callable
        The batchify functions of fields 1, 2, ... (only when ``fn`` is a single callable).

    Raises
    ------
    ValueError
        At call time, if a sample does not have one field per function (MXNet 2.x checks
        only the first sample, with an ``AssertionError``).

    Examples
    --------
    >>> from shardloader.batchify import AsList, Group, Stack
    >>> tokens, words = Group(Stack(), AsList())([([1, 2], "a"), ([3, 4], "b")])
    >>> tokens.asnumpy(), words
    (array([[1, 2],
           [3, 4]]), ['a', 'b'])
    """


class AsList(List):
    """MXNet 2.x's name for ``List``: the samples as a plain list, unchanged.

    Examples
    --------
    >>> AsList()(["I am using MXNet", "Gluon rocks!"])
    ['I am using MXNet', 'Gluon rocks!']
    """

    def __repr__(self) -> str:
        return "AsList()"


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

    def __init__(self, expand: bool = True, batch_axis: int = 0, use_shared_mem: bool = False):
        if not isinstance(expand, (bool, np.bool_)):
            raise TypeError(f"Append: expand must be True or False, got {_describe(expand)}")
        if isinstance(batch_axis, bool) or not isinstance(batch_axis, (int, np.integer)):
            raise TypeError(f"Append: batch_axis must be an int, got {_describe(batch_axis)}")
        self._expand = bool(expand)
        self._batch_axis = int(batch_axis)

    def __call__(self, data: typing.Sequence[typing.Any]) -> list:
        """One array per sample of ``data``, in order."""
        out = []
        for position, sample in enumerate(data):
            if _is_mx_array(sample):
                array = _array_sample(sample, position, "Append")
            else:
                array = np.asarray(_array_sample(sample, position, "Append"), dtype=np.float32)
            if self._expand:
                if array.ndim == 0:
                    array = array.reshape(1)
                else:
                    axis = self._batch_axis
                    if not -array.ndim - 1 <= axis <= array.ndim:
                        raise ValueError(
                            f"Append: batch_axis {axis} is out of range for sample {position} "
                            f"of shape {array.shape}; it must be in "
                            f"[{-array.ndim - 1}, {array.ndim}]"
                        )
                    array = np.expand_dims(array, axis)
            buf = _alloc.empty(array.shape, _output_dtype(array.dtype))
            buf[...] = array
            out.append(_alloc.to_output(buf))
        return out

    def __repr__(self) -> str:
        return f"Append(expand={self._expand}, batch_axis={self._batch_axis})"


def _is_mx_array(x) -> bool:
    nd = _ndarray_class()
    return nd is not None and isinstance(x, nd)


class _FieldStack:
    """MXNet 2.x's ``Stack`` (its loader's default): ``default_batchify_fn``, except that list
    samples are split into fields as tuple samples are, at any depth.

    Not exported: gluon-nlp's ``Stack`` has the name here. A loader uses this one for MXNet
    2.x's ``Stack()`` and as its default batchify function under MXNet 2.x.
    """

    def __call__(self, data: typing.Sequence[typing.Any]):
        if len(data) == 0:
            raise ValueError("Stack: cannot batchify an empty batch: it has no samples")
        return _collate(data, split_lists=True, owner="Stack")

    def __repr__(self) -> str:
        return "Stack()"


class _PadEveryAxis:
    """MXNet 2.x's ``Pad``: pad samples with ``val`` to the largest size on every axis (each
    rounded up to a multiple of ``round_to``), then stack them.

    The batch's dtype is ``dtype``, else the first sample's (a list sample's as numpy reads
    it: int64 or float64). Samples must have one number of dimensions. Not exported:
    gluon-nlp's ``Pad`` has the name here.
    """

    def __init__(self, val=None, dtype=None, round_to=None) -> None:
        self._pad_val = 0 if val is None else val
        self._dtype = _check_dtype("Pad", dtype)
        if round_to is not None and (
            isinstance(round_to, bool) or not isinstance(round_to, (int, np.integer))
        ):
            raise TypeError(f"Pad: round_to must be None or a positive int, got {round_to!r}")
        if round_to is not None and round_to < 1:
            raise ValueError(f"Pad: round_to must be None or a positive int, got {round_to}")
        self._round_to = None if round_to is None else int(round_to)

    def __call__(self, data: typing.Sequence[typing.Any]):
        if len(data) == 0:
            raise ValueError("Pad: cannot batchify an empty batch: it has no samples")
        first = data[0]
        if not (_is_array(first) or isinstance(first, list)):
            raise TypeError(
                f"Pad: sample 0 must be an array or a list of numbers, got {_describe(first)}; "
                "for samples of several fields use Group(Pad(), Stack(), ...)"
            )
        arrays = [_array_sample(sample, position, "Pad") for position, sample in enumerate(data)]
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
        shape = [max(a.shape[axis] for a in arrays) for axis in range(ndim)]
        if self._round_to is not None:
            shape = [-(-size // self._round_to) * self._round_to for size in shape]
        dtype = self._dtype if self._dtype is not None else _output_dtype(arrays[0].dtype)
        buf = _alloc.empty([len(arrays)] + shape, dtype)
        buf[...] = self._pad_val
        for row, array in zip(buf, arrays):
            row[tuple(slice(0, size) for size in array.shape)] = array
        return _alloc.to_output(buf)

    def __repr__(self) -> str:
        return (
            f"Pad(val={self._pad_val!r}, dtype={_dtype_repr(self._dtype)}, "
            f"round_to={self._round_to})"
        )


def gluon_equivalent(fn: typing.Any) -> typing.Any:
    """shardloader's implementation of one of Gluon's own batchify functions, or ``fn``.

    MXNet 2.x's ``mx.gluon.data.batchify.Stack``, ``Pad``, ``Group``, ``AsList`` and
    ``Append`` objects, and Gluon's ``default_batchify_fn`` and ``default_mp_batchify_fn``
    (both versions), are swapped for functions of this module that give the same batches:
    a worker process then stacks them straight into shared memory, and samples of either
    MXNet array type are accepted. ``use_shared_mem`` is dropped (the loader's transport
    decides where memory lives). A ``Group`` is swapped with its functions, and any other
    callable, a subclass of Gluon's included, is returned as it is.

    Examples
    --------
    >>> import mxnet as mx
    >>> gluon_equivalent(mx.gluon.data.dataloader.default_batchify_fn) is default_batchify_fn
    True
    >>> gluon_equivalent(len) is len
    True
    """
    mx = sys.modules.get("mxnet")
    if mx is None:
        return fn
    loader = sys.modules.get("mxnet.gluon.data.dataloader")
    if loader is not None and any(
        fn is getattr(loader, name, None)
        for name in ("default_batchify_fn", "default_mp_batchify_fn")
    ):
        return default_batchify_fn
    gluon = sys.modules.get("mxnet.gluon.data.batchify")
    if gluon is None:
        return fn
    kind = type(fn)
    try:
        if kind is getattr(gluon, "Stack", None):
            return _FieldStack()
        if kind is getattr(gluon, "Pad", None):
            return _PadEveryAxis(fn._pad_val, fn._dtype, fn._round_to)
        if kind is getattr(gluon, "Group", None):
            return Group([gluon_equivalent(each) for each in fn._fn])
        if kind is getattr(gluon, "AsList", None):
            return AsList()
        if kind is getattr(gluon, "Append", None):
            return Append(fn._expand, fn._batch_axis)
    except (AttributeError, TypeError, ValueError):
        return fn  # another MXNet's private layout, or arguments we do not take: run it as is
    return fn


def _dtype_repr(dtype: typing.Optional[np.dtype]) -> str:
    return "None" if dtype is None else repr(dtype.name)


def is_native(fn: typing.Any) -> bool:
    """Whether ``fn`` is built only from this module's functions and classes.

    Then every array it returns comes from ``shardloader._alloc.to_output``, so a worker
    process may let it stack straight into shared memory. Any user function in the tree
    makes the answer ``False`` (its output is still shipped correctly, with one copy).

    >>> is_native(Tuple(Stack(), Pad())), is_native(Tuple(Stack(), len))
    (True, False)
    """
    if fn is default_batchify_fn or isinstance(
        fn, (Stack, Pad, List, Append, _FieldStack, _PadEveryAxis)
    ):
        return True
    if isinstance(fn, (Tuple, NamedTuple)):
        return all(is_native(f) for f in fn._fns)
    if isinstance(fn, Dict):
        return all(is_native(f) for f in fn._fn_dict.values())
    return False
