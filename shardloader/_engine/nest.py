"""The one walker over nested batches.

A batch is a leaf (an array, a number, a string, anything else) or a container of batches:
a ``list``, a ``tuple`` (a namedtuple included) or a ``dict`` (its subclasses included).
Every stage that looks inside a batch (the transport carving it into shared memory, device
placement, the byte count in ``stats()``, the benchmarks' ``touch``) walks it with these two
functions, so they all agree on what a container is. ``is_sharded`` tells, in the same
terms, whether a batch sampler's item is one batch or a step of several.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np

__all__ = ["is_sharded", "leaves", "map_leaves"]


def leaves(batch: Any) -> Iterator[Any]:
    """Every leaf of ``batch``, depth first, in order (a dict's in its key order)."""
    if isinstance(batch, (list, tuple)):
        for item in batch:
            yield from leaves(item)
    elif isinstance(batch, dict):
        for item in batch.values():
            yield from leaves(item)
    else:
        yield batch


def map_leaves(fn: Callable[[Any], Any], batch: Any) -> Any:
    """``batch`` with every leaf replaced by ``fn(leaf)``, in containers of the same types.

    A namedtuple is rebuilt from its fields, a dict subclass from a dict of the new values
    (one that cannot be, such as a ``defaultdict``, becomes a plain ``dict``).
    """
    if isinstance(batch, list):
        return [map_leaves(fn, item) for item in batch]
    if isinstance(batch, tuple):
        items = [map_leaves(fn, item) for item in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    if isinstance(batch, dict):
        values = {key: map_leaves(fn, value) for key, value in batch.items()}
        if type(batch) is dict:
            return values
        try:
            return type(batch)(values)
        except TypeError:  # e.g. a defaultdict wants its factory first
            return values
    return fn(batch)


def is_sharded(indices: Sequence) -> bool:
    """Whether a batch sampler item is a step (a list of per-shard index lists). Raises a
    ``TypeError`` naming the item when it is neither a batch nor a step (a bare index, say)."""
    try:
        return len(indices) > 0 and isinstance(indices[0], (list, tuple, np.ndarray))
    except (TypeError, KeyError, IndexError):
        pass
    try:
        shown = repr(indices)
    except Exception:  # noqa: BLE001 - only for the message
        shown = "an object"
    raise TypeError(
        f"the batch sampler yielded {shown[:200]} (type {type(indices).__name__}) where a "
        f"batch was expected: a batch_sampler must yield lists of sample indices (or, for "
        f"sharded steps, lists of such lists), e.g. [[0, 1], [2, 3]] rather than [0, 1, 2, 3]"
    )
