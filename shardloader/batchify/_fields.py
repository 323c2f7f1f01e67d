"""Batchify functions that apply one function per field or key of a sample (gluon-nlp's
``Tuple``, ``Dict`` and ``NamedTuple``, MXNet 2.x's ``Group``), and the plain lists
(gluon-nlp's ``List``, MXNet 2.x's ``AsList``)."""

from __future__ import annotations

import typing

from ._checks import (
    Batchify,
    BatchifyTypeError,
    _check_callable,
    _describe,
    _mx_handle,
    _require_samples,
    uses_batch_allocator,
)


def _split_fields(data, count: int, owner: str) -> typing.Iterator[tuple]:
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
    >>> tokens, label = Tuple(Pad(pad_val=0), Stack())([([1, 2, 3], 0), ([4], 1)])
    >>> tokens.asnumpy()
    array([[1., 2., 3.],
           [4., 0., 0.]], dtype=float32)
    >>> label.asnumpy()
    array([0, 1])
    """

    # Group (below) is this class under MXNet 2.x's name: the constructor, the call and the
    # repr serve both, and name the class they belong to in messages.

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

    @property
    def uses_batch_allocator(self) -> bool:
        """True when every field's function allocates through the batch allocator."""
        return all(uses_batch_allocator(fn) for fn in self._fns)

    def __call__(self, data: typing.Sequence[typing.Any]) -> tuple:
        """Batchify field ``i`` of every sample in ``data`` with function ``i``."""
        name = type(self).__name__
        _require_samples(data, name)
        fields = _split_fields(data, len(self._fns), name)
        return tuple(fn(list(field)) for fn, field in zip(self._fns, fields))

    @property
    def __mx_handle__(self) -> typing.Callable[[], typing.Any]:
        """Under MXNet 2.x, builds the C++ batchify function of Gluon 2.x's ``Group`` over
        the functions' own handles, for its C++ data pipeline (``try_nopython``); missing
        where one of the functions has no handle (Gluon's ``Group`` raises
        ``NotImplementedError`` there), and under MXNet 1.x."""
        return _mx_handle(self, "GroupBatchify", {}, self._fns)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self._fns))})"


class Group(Tuple):
    """MXNet 2.x's name for ``Tuple``: one batchify function per field of tuple (or list)
    samples; returns a tuple with one batch per field.

    Parameters
    ----------
    fn, *fns : callable, or a list or tuple of callables
        As for ``Tuple``: the functions of fields 0, 1, 2, ..., one by one or in one list.

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


class List:
    """Return the samples as a plain list, unchanged (for text, ids and other objects).

    Examples
    --------
    >>> from shardloader.batchify import List, Stack, Tuple
    >>> _, words = Tuple(Stack(), List())([([1, 2], "hello"), ([3, 4], "world")])
    >>> words
    ['hello', 'world']
    """

    uses_batch_allocator = True  # no arrays of its own

    def __call__(self, data: typing.Sequence[typing.Any]) -> list:
        """The samples of one batch, as a list."""
        return list(data)

    def __repr__(self) -> str:
        return "List()"


class AsList(List):
    """MXNet 2.x's name for ``List``: the samples as a plain list, unchanged.

    Examples
    --------
    >>> AsList()(["I am using MXNet", "Gluon rocks!"])
    ['I am using MXNet', 'Gluon rocks!']
    """

    def __repr__(self) -> str:
        return "AsList()"


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
    >>> batch = Dict({"data": Pad(pad_val=0), "label": Stack()})(
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

    @property
    def uses_batch_allocator(self) -> bool:
        """True when every key's function allocates through the batch allocator."""
        return all(uses_batch_allocator(fn) for fn in self._fn_dict.values())

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


def _field_functions(container: typing.Any, fn_info) -> tuple:
    """``NamedTuple``'s ``fn_info`` as one function per field of ``container`` (a namedtuple
    class, which no type names), in order."""
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
    return fns


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
    >>> batchify = NamedTuple(Sample, {"data": Pad(pad_val=0), "label": Stack()})
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
        fns = _field_functions(container, fn_info)
        self._container = container
        self._fns = fns

    uses_batch_allocator = Tuple.uses_batch_allocator

    def __call__(self, data: typing.Sequence[typing.Any]):
        """Batchify each field across the samples in ``data``; return a ``container``."""
        _require_samples(data, "NamedTuple")
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
