"""Argument checks shared by the batchify functions, and the error they raise for a wrong
type where gluon-nlp raises ``ValueError``."""

from __future__ import annotations

import typing

import numpy as np

from ._arrays import _MX_DTYPE_NAMES, _MX_DTYPES

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


def _describe(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_int(value) -> bool:
    """Whether ``value`` is an int (numpy's included), but not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _is_flag(value) -> bool:
    """Whether ``value`` is a bool (numpy's included)."""
    return isinstance(value, (bool, np.bool_))


def _require_samples(data, owner: typing.Optional[str]) -> None:
    """Raise the ``ValueError`` for an empty batch (its message prefixed by ``owner``)."""
    if len(data) == 0:
        prefix = "" if owner is None else f"{owner}: "
        raise ValueError(f"{prefix}cannot batchify an empty batch: it has no samples")


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
            f"{owner}: dtype must be None or one of {_MX_DTYPE_NAMES} (the dtypes this "
            f"MXNet's arrays hold), got {dtype!r}"
        )
    return resolved


def _check_callable(owner: str, name: str, fn) -> None:
    if not callable(fn):
        raise BatchifyTypeError(
            f"{owner}: {name} must be a callable batchify function, got {_describe(fn)}"
        )
