"""Batching: indices into batches (Gluon's ``BatchSampler``), and batches into sharded steps.

Both classes treat the last, incomplete group of an epoch the same way: ``'keep'`` yields it
short, ``'discard'`` drops it, and ``'rollover'`` puts it at the front of the next epoch. The
rollover leftovers (the *carry*) are part of ``state_dict``. Neither class ever yields an item
of its wrapped sampler twice.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, Iterator, List

import numpy as np

from ._base import (
    Sampler,
    _WrapperMixin,
    check_choice,
    check_int,
    check_sampler,
    plain,
    state_value,
)

__all__ = ["BatchSampler", "ShardGroupSampler"]

LAST_POLICIES = ("keep", "discard", "rollover")


def _initial_epoch(sampler: Any) -> int:
    """A wrapper starts at the epoch its wrapped sampler is at, if that has one."""
    epoch = getattr(sampler, "epoch", 0)
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0


def _count(total: int, size: int, policy: str) -> int:
    """How many groups of ``size`` a policy makes of ``total`` items."""
    if policy == "keep":
        return (total + size - 1) // size
    return total // size


class _Grouper(_WrapperMixin, Sampler):
    """Groups the items of a wrapped sampler into lists of ``_size``, with a last-group policy.

    Subclasses set ``_sampler``, ``_size``, ``_policy``, ``_carry`` and ``_epoch``, and may
    check each item with ``_check_item``.
    """

    _sampler: Any
    _size: int
    _policy: str
    _carry: List[Any]

    def __len__(self) -> int:
        total = len(self._sampler)
        if self._policy == "rollover":
            total += len(self._carry)
        return _count(total, self._size, self._policy)

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[List[Any]]:
        # As in Gluon, the carry is taken when the pass starts: a pass given up half way loses
        # it, and len() during a pass no longer counts it.
        carry, self._carry = self._carry, []
        return self._groups(carry, start)

    def _groups(self, carry: List[Any], skip: int) -> Iterator[List[Any]]:
        # Slices rather than a loop per item: this runs for every batch of every epoch.
        size = self._size
        items = iter(self._sampler)
        check = None if type(self)._check_item is _Grouper._check_item else self._check_item
        group = list(carry)
        while True:
            group.extend(itertools.islice(items, size - len(group)))
            if check is not None:
                for item in group:
                    check(item)
            if len(group) < size:
                break
            if skip:
                skip -= 1
            else:
                yield group
            group = []
        if not group:
            return
        if self._policy == "rollover":
            self._carry = group
        elif self._policy == "keep" and not skip:
            yield group

    def _check_item(self, item: Any) -> None:
        """Raise if ``item`` is not what this grouper expects from its wrapped sampler."""

    def _replay_state(self) -> Dict[str, Any]:
        state = {"carry": plain(self._carry)}
        state.update(self._inner_replay())
        return state

    def _load_replay_state(self, state: Dict[str, Any]) -> None:
        name = type(self).__name__
        carry = state_value(state, "carry", name)
        if not isinstance(carry, list):
            raise ValueError(f"{name} state_dict['carry'] must be a list, got {carry!r}")
        if len(carry) >= self._size or (carry and self._policy != "rollover"):
            raise ValueError(
                f"{name} state_dict['carry'] holds {len(carry)} items, which does not fit "
                f"{self._policy!r} groups of {self._size}"
            )
        self._load_inner(state)
        self._carry = list(carry)


class BatchSampler(_Grouper):
    """Wraps a sampler and yields its indices in lists of ``batch_size``, as Gluon's does.

    The order, the last-batch policies and ``len()`` are those of MXNet 1.9.1's
    ``gluon.data.BatchSampler``. A pass of this sampler at epoch ``e`` runs one pass of the
    wrapped sampler at epoch ``e``; any Gluon sampler can be wrapped, including ones without
    ``set_epoch`` (their own randomness then decides the order, as in Gluon).

    Parameters
    ----------
    sampler : Sampler
        The source of indices.
    batch_size : int
        Size of a batch.
    last_batch : {'keep', 'discard', 'rollover'}, default 'keep'
        What happens to the last batch of an epoch when it is short. ``'keep'`` yields it,
        ``'discard'`` drops it, and ``'rollover'`` carries its indices to the front of the next
        epoch; ``len()`` counts the indices carried in. As in Gluon, a batch that starts
        with carried indices can hold an index twice, once from each epoch.

    Examples
    --------
    >>> list(BatchSampler(SequentialSampler(10), 3, 'keep'))
    [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    >>> sampler = BatchSampler(SequentialSampler(10), 3, 'rollover')
    >>> list(sampler)
    [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    >>> len(sampler), sampler.state_dict()['carry']
    (3, [9])
    >>> next(iter(sampler))
    [9, 0, 1]
    """

    def __init__(self, sampler: Any, batch_size: int, last_batch: str = "keep") -> None:
        self._sampler = check_sampler("sampler", sampler)
        if getattr(sampler, "yields_steps", False):
            raise ValueError(
                f"sampler must yield indices, but the given {type(sampler).__name__} yields "
                "steps (lists of index lists)"
            )
        self._size = check_int("batch_size", batch_size, minimum=1)
        self._policy = check_choice("last_batch", last_batch, LAST_POLICIES)
        self._carry: List[Any] = []
        self._epoch = _initial_epoch(sampler)

    @property
    def batch_size(self) -> int:
        """The size of a full batch."""
        return self._size

    @property
    def last_batch(self) -> str:
        """The policy for the last, short batch of an epoch."""
        return self._policy

    def _config(self) -> Dict[str, Any]:
        return {"batch_size": self._size, "last_batch": self._policy}


class ShardGroupSampler(_Grouper):
    """Wraps a batch sampler and yields steps: lists of ``num_shards`` batches, one per shard.

    Parameters
    ----------
    batch_sampler : Sampler
        Yields batches (lists of indices), such as ``BatchSampler`` or a
        ``FixedBucketSampler`` with ``num_shards=0``.
    num_shards : int
        Batches per step, usually the number of devices.
    last_group : {'keep', 'discard', 'rollover'}, default 'keep'
        What happens to the last step of an epoch when it has fewer than ``num_shards``
        batches. ``'keep'`` yields it with fewer shards, ``'discard'`` drops its batches, and
        ``'rollover'`` carries them to the front of the next epoch. No batch is ever repeated.

    Raises
    ------
    ValueError
        If ``batch_sampler`` already yields steps.

    Examples
    --------
    >>> batches = BatchSampler(SequentialSampler(7), 2)
    >>> list(ShardGroupSampler(batches, 2))
    [[[0, 1], [2, 3]], [[4, 5], [6]]]
    >>> list(ShardGroupSampler(batches, 3, 'discard'))
    [[[0, 1], [2, 3], [4, 5]]]
    """

    yields_steps = True

    def __init__(self, batch_sampler: Any, num_shards: int, last_group: str = "keep") -> None:
        self._sampler = check_sampler("batch_sampler", batch_sampler)
        if getattr(batch_sampler, "yields_steps", False):
            raise ValueError(self._steps_message(batch_sampler))
        self._size = check_int("num_shards", num_shards, minimum=1)
        self._policy = check_choice("last_group", last_group, LAST_POLICIES)
        self._carry: List[Any] = []
        self._epoch = _initial_epoch(batch_sampler)

    @property
    def num_shards(self) -> int:
        """The number of batches in a full step."""
        return self._size

    @property
    def last_group(self) -> str:
        """The policy for the last, incomplete step of an epoch."""
        return self._policy

    @staticmethod
    def _steps_message(batch_sampler: Any) -> str:
        return (
            f"batch_sampler must yield batches (lists of indices), but the given "
            f"{type(batch_sampler).__name__} yields steps (lists of index lists); it already "
            "groups shards, so use it directly or give it num_shards=0"
        )

    def _check_item(self, item: Any) -> None:
        if isinstance(item, (int, np.integer)):
            raise TypeError(
                f"batch_sampler must yield batches (lists of indices), but the given "
                f"{type(self._sampler).__name__} yielded the index {item!r}; wrap it in a "
                "BatchSampler first"
            )
        if len(item) and isinstance(item[0], (list, tuple, np.ndarray)):
            raise ValueError(self._steps_message(self._sampler))

    def _config(self) -> Dict[str, Any]:
        return {"num_shards": self._size, "last_group": self._policy}
