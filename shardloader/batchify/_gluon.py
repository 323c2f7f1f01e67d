"""Gluon's own batchify functions swapped for this package's, and which functions are this
package's throughout."""

from __future__ import annotations

import sys
import typing

from .._compat import MX2
from ._append import Append
from ._checks import uses_batch_allocator
from ._default import _FieldStack, default_batchify_fn
from ._fields import AsList, Group
from ._pad import _PadEveryAxis


def gluon_equivalent(fn: typing.Any) -> typing.Any:
    """shardloader's implementation of one of Gluon's own batchify functions, or ``fn``.

    MXNet 2.x's ``mx.gluon.data.batchify.Stack``, ``Pad``, ``Group``, ``AsList`` and
    ``Append`` objects, and Gluon's ``default_batchify_fn`` and ``default_mp_batchify_fn``
    (both versions), are swapped for functions of this package that give the same batches:
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


def is_native(fn: typing.Any) -> bool:
    """Whether ``fn`` allocates every array it returns through the batch allocator: whether
    it declares the capability ``uses_batch_allocator`` (``_checks.ALLOCATOR_ATTR``).

    A worker process then lets it write the batch straight into shared memory. This
    package's functions declare it; a ``Tuple``, ``NamedTuple`` or ``Dict`` declares it when
    all its functions do, so any user function in the tree makes the answer ``False`` (its
    output is still shipped correctly, with one copy). Any other batchify function may
    declare it too (``shardloader.vision``'s fused one does).

    >>> from shardloader.batchify import Pad, Stack, Tuple
    >>> is_native(Tuple(Stack(), Pad(pad_val=0))), is_native(Tuple(Stack(), len))
    (True, False)
    """
    return uses_batch_allocator(fn)


def loader_default() -> typing.Callable:
    """The batchify function a loader uses for ``batchify_fn=None``: Gluon's default, that is
    ``default_batchify_fn`` under MXNet 1.x and 2.x's ``batchify.Stack()`` (which splits list
    samples into fields as it does tuples) under 2.x."""
    return _FieldStack() if MX2 else default_batchify_fn


def as_loader_default(fn: typing.Any) -> typing.Optional[typing.Callable]:
    """``loader_default()`` if ``fn`` is ``None``; shardloader's equivalent if ``fn`` is a
    default batchify function (Gluon's or ours, of either MXNet); else ``None``."""
    if fn is None:
        return loader_default()
    ours = gluon_equivalent(fn)
    if ours is default_batchify_fn or type(ours) is _FieldStack:
        return ours
    return None
