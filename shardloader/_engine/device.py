"""Device placement: copy the NDArrays of a batch, or of each shard of a step, to a device.

A device is what MXNet 1.x calls a context (``mx.Context``) and 2.x a device
(``mx.device.Device``): ``mx.cpu(0)``, ``mx.gpu(1)``, ``mx.cpu_pinned(0)``. Both versions'
spellings go through ``shardloader._compat``.

These helpers start no threads and never wait unless asked to (``wait_to_read``). Where
they run is chosen in one place, ``shardloader._pipeline``: ``ctx=`` placement runs on a
prefetch thread (``shardloader.prefetch``), so a copy overlaps with training, and
``pin_memory`` runs in ``PinStage`` on the consumer's thread, as Gluon does (a host copy is
a plain memcpy, cheaper than handing every batch across threads).

Only ``NDArray`` leaves move. numpy arrays, numbers, strings and anything else pass through
unchanged, so a batch can carry lengths or metadata next to its arrays.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple, Union

import mxnet as mx
import numpy as np
from mxnet.ndarray import NDArray

from .._compat import DEVICE_ARG, DeviceType, device_of, is_device, to_device
from .ipc.lease import HOST_DEVICES, host_view
from .nest import is_sharded, leaves, map_leaves
from .stage import Stage

__all__ = [
    "PinStage",
    "device_argument",
    "normalize_ctx",
    "pin",
    "place",
    "place_shards",
    "wait_to_read",
]

CtxArg = Union[DeviceType, Sequence[DeviceType]]


def normalize_ctx(ctx: CtxArg, name: str = "ctx") -> Union[DeviceType, List[DeviceType]]:
    """Validate a context argument: one MXNet context (a device, in MXNet 2.x), or a
    non-empty list or tuple of them.

    Parameters
    ----------
    ctx : Context or list of Context
        The value to check.
    name : str
        The argument's name, used in error messages (``"device"`` where the caller passed
        MXNet 2.x's name for it).

    Returns
    -------
    Context or list of Context
        A single context unchanged, or a sequence of contexts as a new list.

    Raises
    ------
    TypeError
        If ``ctx`` is neither a Context nor a list or tuple of Contexts.
    ValueError
        If ``ctx`` is an empty list or tuple.

    Examples
    --------
    >>> import mxnet as mx
    >>> normalize_ctx((mx.cpu(0), mx.cpu(1)))
    [cpu(0), cpu(1)]
    """
    kind = "Context" if DeviceType.__name__ == "Context" else "Device"
    if is_device(ctx):
        return ctx
    if isinstance(ctx, (list, tuple)):
        if not ctx:
            raise ValueError(
                f"{name} must name at least one {kind.lower()}, got an empty {type(ctx).__name__}"
            )
        for i, item in enumerate(ctx):
            if not is_device(item):
                raise TypeError(
                    f"{name}[{i}] must be an mxnet {kind} such as mx.gpu({i}) or mx.cpu({i}), "
                    f"got {type(item).__name__}: {item!r}"
                )
        return list(ctx)
    raise TypeError(
        f"{name} must be an mxnet {kind} (e.g. mx.gpu(0), mx.cpu_pinned(0)) or a list of them, "
        f"got {type(ctx).__name__}: {ctx!r}"
    )


def device_argument(ctx: Any, device: Any) -> Tuple[Any, str]:
    """The placement argument given as ``ctx`` (MXNet 1.x's name) or ``device`` (2.x's),
    and the name it was given under, for messages. ``(None, name)`` when neither was given,
    with the name this MXNet uses.

    Raises
    ------
    ValueError
        If both were given: they are two names for one argument.

    Examples
    --------
    >>> import mxnet as mx
    >>> device_argument(None, mx.cpu(1))
    (cpu(1), 'device')
    """
    if ctx is not None and device is not None:
        raise ValueError(
            "ctx and device are two names for one argument (device is MXNet 2.x's name for "
            f"ctx); pass only one of them, got ctx={ctx!r} and device={device!r}"
        )
    if device is not None:
        return device, "device"
    if ctx is not None:
        return ctx, "ctx"
    return None, DEVICE_ARG


def place(batch: Any, ctx: DeviceType) -> Any:
    """Copy every NDArray in a nested batch to ``ctx``; other leaves are returned as they are.

    Lists, tuples, namedtuples and dicts are rebuilt with the same type and keys. An NDArray
    already on ``ctx`` is returned without a copy. The copies are asynchronous, as
    ``as_in_context`` is; call ``wait_to_read`` on the result to wait for them.

    Examples
    --------
    >>> import mxnet as mx, numpy as np
    >>> out = place({"x": mx.nd.ones((2,)), "n": np.arange(2)}, mx.cpu(1))
    >>> out["x"].context, type(out["n"]).__name__
    (cpu(1), 'ndarray')
    """
    return map_leaves(lambda leaf: _copy(leaf, ctx) if isinstance(leaf, NDArray) else leaf, batch)


def pin(batch: Any, ctx: DeviceType) -> Any:
    """What Gluon's ``pin_memory=True`` returns: ``batch`` with every NDArray copied to
    ``ctx``, in Gluon's containers.

    Gluon's ``_as_in_context`` rebuilds every list and tuple, namedtuples included and at any
    depth, as a ``list``; so does this, so that ``batch[0] = batch[0].as_in_context(gpu)``
    keeps working. Gluon returns a dict as it is, its NDArrays not pinned; here its NDArrays
    are copied too, and the dict and everything in it keep their types (as with ``place``).

    Examples
    --------
    >>> import collections, mxnet as mx
    >>> Pair = collections.namedtuple("Pair", "x y")
    >>> out = pin((mx.nd.ones((2,)), Pair(mx.nd.zeros((1,)), 3)), mx.cpu_pinned(0))
    >>> type(out).__name__, type(out[1]).__name__, out[0].context, out[1][1]
    ('list', 'list', cpu_pinned(0), 3)
    """
    if isinstance(batch, NDArray):
        return _copy(batch, ctx)
    if isinstance(batch, (list, tuple)):
        return [pin(item, ctx) for item in batch]
    if isinstance(batch, dict):
        return place(batch, ctx)
    return batch


# Host-to-host copies smaller than this stay with MXNet: its copy costs ~50 µs of fixed
# overhead per array where the numpy path (two waits, an empty array, a view of each) costs
# ~125 µs, and their bandwidths (2 against ~8 GB/s) only make up the difference above it.
_NUMPY_COPY_MIN_BYTES = 128 << 10


def _copy(array: NDArray, ctx: DeviceType) -> NDArray:
    """``array.as_in_context(ctx)`` (``to_device`` in MXNet 2.x), but large host-to-host
    copies go through numpy.

    MXNet 1.9.1 copies a 9.6 MB uint8 batch between CPU contexts at about 2 GB/s;
    ``np.copyto`` into the new array's memory is several times faster, and its result is
    ready when this returns.
    """
    if device_of(array) == ctx:
        return array
    nbytes = array.size * np.dtype(array.dtype).itemsize
    if ctx.device_type not in HOST_DEVICES or nbytes < _NUMPY_COPY_MIN_BYTES:
        return to_device(array, ctx)
    source = host_view(array)  # waits for pending writes to the source
    if source is None:
        return to_device(array, ctx)
    out = mx.nd.empty(array.shape, ctx=ctx, dtype=array.dtype)
    if isinstance(array, mx.np.ndarray):
        out = out.as_np_ndarray()  # numpy mode: the same array type as the source
    target = host_view(out)
    if target is None:  # not host memory after all: let MXNet copy
        return to_device(array, ctx)
    np.copyto(target, source)
    return out


def place_shards(step: Sequence[Any], ctxs: Sequence[DeviceType]) -> List[Any]:
    """Put shard ``i`` of a sharded step on ``ctxs[i]``.

    Parameters
    ----------
    step : list or tuple
        One batch per shard, in shard order.
    ctxs : list of Context
        One context per shard. A step may have fewer shards than contexts (the last,
        incomplete group of an epoch with ``last_batch='keep'``): shard ``i`` still goes to
        ``ctxs[i]`` and the remaining contexts get nothing.

    Returns
    -------
    list
        The placed shards, in the same order.

    Raises
    ------
    TypeError
        If ``step`` is not a list or tuple of per-shard batches.
    ValueError
        If the step has more shards than there are contexts.

    Examples
    --------
    >>> import mxnet as mx
    >>> step = [mx.nd.zeros((2,)), mx.nd.ones((2,))]
    >>> [shard.context for shard in place_shards(step, [mx.cpu(0), mx.cpu(1)])]
    [cpu(0), cpu(1)]
    """
    if not isinstance(step, (list, tuple)):
        raise TypeError(
            f"a sharded step must be a list with one batch per context, got {type(step).__name__}"
        )
    if not step or len(step) > len(ctxs):
        raise ValueError(
            f"the step has {len(step)} shards but {len(ctxs)} contexts were given "
            f"({list(ctxs)}); each shard needs a context of its own"
        )
    return [place(shard, ctx) for shard, ctx in zip(step, ctxs)]


def wait_to_read(batch: Any) -> None:
    """Block until every NDArray in a nested batch is ready to read."""
    for leaf in leaves(batch):
        if isinstance(leaf, NDArray):
            leaf.wait_to_read()


def placement(ctx: Any, name: str = "ctx") -> Any:
    """Where batches go: ``None``, one context, or a list of them (one per shard)."""
    if ctx is not None:
        ctx = normalize_ctx(ctx, name)
        if isinstance(ctx, list) and len(ctx) == 1:
            return ctx[0]
        return ctx
    return None


class PinStage(Stage):
    """The stage that copies each batch to pinned memory on the consumer's thread."""

    def __init__(self, source: Any, ctx: DeviceType) -> None:
        self._source = source
        self._ctx = ctx

    def _next(self) -> Any:
        return pin(next(self._source), self._ctx)  # Gluon's containers: tuples become lists


def pin_context(pin_memory: bool, pin_device_id: int) -> Any:
    """Gluon's ``pin_memory``: the pinned context batches are copied to, or ``None``."""
    if pin_memory:
        import mxnet as mx

        return mx.cpu_pinned(pin_device_id)
    return None


def check_shards_fit(ctx, num_shards: int, batch_sampler, name: str = "ctx") -> None:
    """Several contexts need steps of at most that many shards, where that is known now.
    ``name`` is the argument's name as given: ``ctx``, or MXNet 2.x's ``device``."""
    if not isinstance(ctx, list):
        return
    what = "devices" if name == "device" else "contexts"
    if num_shards > len(ctx):
        raise ValueError(
            f"num_shards={num_shards} but {name} has {len(ctx)} {what} ({ctx}); each shard "
            f"needs its own {what[:-1]}"
        )
    if not num_shards and getattr(batch_sampler, "yields_steps", None) is False:
        raise ValueError(
            f"{name} lists {len(ctx)} {what}, one per shard, but the batches are not sharded; "
            f"pass num_shards=len({name}), a batch_sampler that yields steps, or a single "
            f"{what[:-1]}"
        )


def require_steps(items, num_ctx: int, name: str = "ctx"):
    """Refuse a plain batch when ctx lists several contexts: placing it would split it field
    by field (data on ctx[0], labels on ctx[1])."""
    what = "devices" if name == "device" else "contexts"
    for seq, indices in items:
        if not is_sharded(indices):
            raise ValueError(
                f"{name} lists {num_ctx} {what}, one per shard, but batch {seq} of the batch "
                "sampler is a plain batch, not a step (a list of per-shard index lists); "
                f"pass num_shards=len({name}) or a single {what[:-1]}"
            )
        yield seq, indices
