"""What differs between MXNet 1.x and 2.x, in one place.

shardloader runs on MXNet 1.9.1 and 2.0.0b1 from one code base. Every place where the two
versions spell something differently goes through a name defined here, so the rest of the
package never tests the version itself:

=================================  ==========================  ===========================
what                               MXNet 1.x                   MXNet 2.x
=================================  ==========================  ===========================
the class of ``mx.cpu(0)``         ``mx.context.Context``      ``mx.device.Device``
                                                               (``mx.Context`` is a function)
where an array lives               ``array.context``           ``array.device``
copy an array to a device          ``as_in_context``           ``to_device`` (``mx.np``),
                                                               ``as_in_context`` (``mx.nd``)
the placement argument's name      ``ctx``                     ``device``
DLPack import with a kept handle   ``MXNDArrayFromDLPackEx``   ``MXNDArrayFromDLPack``
Gluon DataLoader's 14th argument   ``auto_reload``             ``try_nopython``
the default device                 ``current_context()``       ``current_device()`` (the
                                                               other warns: deprecated)
the dtypes an array holds          bool, uint8, int8, int32,   also int16, uint16, uint32,
                                   int64, float16/32/64        uint64 (asked of MXNet:
                                                               ``ARRAY_DTYPES``)
C++ batchify functions             none                        ``cpp_batchify(name)``
                                                               (``__mx_handle__``)
=================================  ==========================  ===========================

This module sits below everything else: it imports MXNet and nothing of ours.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any, Callable, FrozenSet, Optional, Tuple

import mxnet as mx
import numpy as np

__all__ = [
    "MX_VERSION",
    "MX2",
    "DEVICE_ARG",
    "DeviceType",
    "ARRAY_DTYPES",
    "is_device",
    "device_of",
    "to_device",
    "current_device",
    "cpp_batchify",
    "dlpack_importer",
    "gluon_positional_order",
]

MX_VERSION: Tuple[int, int] = tuple(int(n) for n in re.findall(r"\d+", mx.__version__)[:2])  # type: ignore[assignment]
MX2: bool = MX_VERSION >= (2, 0)
"""Whether the MXNet in use is a 2.x release (numpy semantics on by default, devices)."""

DEVICE_ARG = "device" if MX2 else "ctx"
"""What this MXNet calls the argument that names where arrays go, for messages."""

if MX2:
    from mxnet.device import Device as DeviceType
else:
    from mxnet.context import Context as DeviceType


def _array_dtypes() -> FrozenSet[np.dtype]:
    """The numpy dtypes this MXNet's arrays hold, read from MXNet's own table of them (the
    one ``mx.nd.array`` converts through). bfloat16, which numpy lacks, is left out."""
    from mxnet.ndarray import ndarray as legacy

    table = getattr(legacy, "_DTYPE_NP_TO_MX", {})
    found = set()
    for key in table:
        if key is None:
            continue
        dtype = np.dtype(key)
        if dtype.kind in "biuf" and dtype.names is None:
            found.add(dtype)
    if not found:  # an MXNet that keeps its table elsewhere: what every version holds
        names = ("bool", "uint8", "int8", "int32", "int64", "float16", "float32", "float64")
        found = {np.dtype(name) for name in names}
    return frozenset(found)


ARRAY_DTYPES: FrozenSet[np.dtype] = _array_dtypes()
"""The dtypes an MXNet array can hold here: bool, uint8, int8, int32, int64 and float16, 32
and 64 in 1.x; 2.x adds int16, uint16, uint32 and uint64."""


def is_device(value: Any) -> bool:
    """Whether ``value`` names a device, such as ``mx.cpu(0)`` or ``mx.gpu(1)``."""
    return isinstance(value, DeviceType)


def device_of(array: Any) -> Any:
    """The device an MXNet array lives on (``array.device`` in 2.x, where
    ``mx.np.ndarray.context`` is deprecated; ``array.context`` in 1.x)."""
    return array.device if MX2 else array.context


def to_device(array: Any, device: Any) -> Any:
    """``array`` copied to ``device`` (the array itself if it is there already), with the
    method this MXNet offers for the array's type: 2.x's ``mx.np.ndarray`` has
    ``to_device`` and warns on ``as_in_context``; legacy ``mx.nd.NDArray`` has only
    ``as_in_context`` in both versions."""
    if MX2 and isinstance(array, mx.np.ndarray):
        return array.to_device(device)
    return array.as_in_context(device)


def current_device() -> Any:
    """The device MXNet puts new arrays on when none is named (``cpu(0)`` unless a
    ``with device:`` block says otherwise). 2.x's ``current_context()`` still works but
    raises MXNet's ``DeprecationWarning``, which ``-W error`` turns into an error."""
    if MX2:
        return mx.device.current_device()
    return mx.context.current_context()


def cpp_batchify(name: str) -> Optional[Callable[..., Any]]:
    """The creator of MXNet's C++ batchify function ``name`` (``"StackBatchify"``,
    ``"PadBatchify"``, ``"GroupBatchify"``: what Gluon 2.x's batchify objects return from
    ``__mx_handle__`` for its C++ data pipeline), or ``None`` where this MXNet has none
    (1.x has no C++ pipeline)."""
    if not MX2:
        return None
    try:
        from mxnet.gluon.data import _internal
    except ImportError:
        return None
    return getattr(_internal, name, None)


def dlpack_importer(lib: Any) -> Any:
    """MXNet's C entry point that wraps a ``DLManagedTensor`` as an array and keeps the
    tensor's address for its deleter: ``(tensor, transient_handle, out)``.

    MXNet 1.9.1 calls it ``MXNDArrayFromDLPackEx`` (its ``MXNDArrayFromDLPack`` has no
    transient flag); 2.x calls it ``MXNDArrayFromDLPack``, with the same three arguments and
    the same meaning of ``transient_handle=False``: MXNet neither copies nor frees the
    struct, and calls its deleter with the struct's own address when the array is released.
    """
    entry = getattr(lib, "MXNDArrayFromDLPackEx", None)
    return entry if entry is not None else lib.MXNDArrayFromDLPack


def gluon_positional_order(init: Callable) -> Callable:
    """``init`` with the positional parameters of the installed MXNet's Gluon DataLoader.

    ``ShardedDataLoader.__init__`` is written with MXNet 1.x's order, whose 14th parameter is
    ``auto_reload``. MXNet 2.x's Gluon has no ``auto_reload`` and its 14th parameter is
    ``try_nopython``; there ``auto_reload`` becomes keyword-only, so that a positional call
    written for either version's Gluon means the same here.
    """
    if not MX2:
        return init
    signature = inspect.signature(init)
    params = [p for p in signature.parameters.values() if p.name != "auto_reload"]
    first_keyword = next(i for i, p in enumerate(params) if p.kind is p.KEYWORD_ONLY)
    moved = signature.parameters["auto_reload"].replace(kind=inspect.Parameter.KEYWORD_ONLY)
    params.insert(first_keyword, moved)
    gluon_order = signature.replace(parameters=params)

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        arguments = gluon_order.bind(self, *args, **kwargs).arguments
        arguments.pop("self")
        init(self, **arguments)

    __init__.__signature__ = gluon_order  # type: ignore[attr-defined]
    return __init__
