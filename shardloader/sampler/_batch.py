"""Batching: indices into batches (Gluon's ``BatchSampler``), and batches into sharded steps.

Both classes group the items of a wrapped sampler and have a policy for the last, incomplete
group of an epoch: ``'discard'`` drops it, and ``'rollover'`` puts it at the front of the next
epoch (the rollover leftovers, the *carry*, are part of ``state_dict``). ``'keep'`` keeps it:
``BatchSampler`` yields a short batch, as Gluon does, while ``ShardGroupSampler`` spreads the
samples of the leftover batches over ``num_shards`` shards, so that every step it yields is full
(``fill_step``); ``ShardGroupSampler``'s ``'partial'`` yields the short step as it is.

Neither class yields an item of its wrapped sampler twice, with one exception: a
``ShardGroupSampler`` pass whose last step has fewer samples than shards repeats samples of the
step before it (or, in a pass of a single step, of that step) to give every shard one.
"""

from __future__ import annotations

import itertools
from typing import (
    Any,
    Callable,
    Dict,
    Generator,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
)

import numpy as np

from .._validate import LAST_BATCH_CHOICES, check_choice, check_int
from ._base import FilledStep, Sampler
from ._state import StateTypeError, is_index, json_ready, state_value
from ._wrap import _WrapperMixin, check_sampler, initial_epoch

__all__ = ["BatchSampler", "ShardGroupSampler", "fill_step"]

# Gluon's last-batch policies (defined with the argument checks, which the loader shares).
LAST_POLICIES = LAST_BATCH_CHOICES
GROUP_POLICIES = ("keep", "partial", "discard", "rollover")

# What ``full_groups`` returns after its last full group: the short rest (possibly empty),
# the last full group (``None`` if there was none), and how many groups were left to skip.
Rest = Tuple[List[Any], Optional[List[Any]], int]


def count_groups(total: int, size: int, keep_short: bool) -> int:
    """How many groups of ``size`` come of ``total`` items: the full ones, and the short last
    one if ``keep_short``."""
    if keep_short:
        return (total + size - 1) // size
    return total // size


def full_groups(
    items: Iterator[Any],
    size: int,
    carry: Iterable[Any] = (),
    skip: int = 0,
    check: Optional[Callable[[Any], None]] = None,
) -> Generator[List[Any], None, Rest]:
    """The full groups of ``size`` consecutive items of ``items``, the first starting with the
    items of ``carry``, without the first ``skip`` of them; ``check`` sees every item first.

    Its return value (``rest = yield from full_groups(...)``) is a ``Rest``: what a
    last-group policy decides on.
    """
    # Slices rather than a loop per item: this runs for every batch of every epoch.
    group = list(carry)
    previous: Optional[List[Any]] = None
    while True:
        group.extend(itertools.islice(items, size - len(group)))
        if check is not None:
            for item in group:
                check(item)
        if len(group) < size:
            return group, previous, skip
        if skip:
            skip -= 1
        else:
            yield group
        previous, group = group, []


def last_step(
    tail: List[Any], previous: Optional[List[Any]], num_shards: int, policy: str
) -> List[Any]:
    """The step that ``'keep'`` (see ``fill_step``) or ``'partial'`` (``tail`` as it is) makes
    of ``tail``, the short last step of a pass; ``previous`` is the full step before it."""
    if policy == "partial":
        return tail
    before = [i for batch in reversed(previous or []) for i in reversed(batch)]
    return fill_step(tail, num_shards, before)


def fill_step(tail: Sequence[Sequence[Any]], num_shards: int, before: Sequence[Any] = ()) -> list:
    """A step of ``num_shards`` non-empty shards made from the ``tail`` batches of a pass.

    While the tail has at least ``num_shards`` samples, they are only redistributed: each
    batch is cut into contiguous pieces (the longer pieces first), and the extra pieces go,
    one at a time, to the batch whose pieces are then the largest (the earlier one on a tie),
    so every shard holds part of a single batch and no sample appears twice. A tail with fewer
    samples than shards gives each of its samples a shard of its own, and fills the remaining
    shards with one sample each, taken from ``before`` (the samples of the pass before the
    tail, most recent first), or cycled from the tail itself when ``before`` is empty. That
    step is a ``FilledStep`` whose ``repeated`` is the number of samples added.

    A tail without any sample is returned as it is, as is a tail that is already a full step.

    Examples
    --------
    >>> fill_step([[6, 7, 8, 9]], 3)
    [[6, 7], [8], [9]]
    >>> fill_step([[0, 1, 2], [3, 4]], 3)
    [[0, 1], [2], [3, 4]]
    >>> step = fill_step([[9]], 3, before=[8, 7, 6])
    >>> step, step.repeated
    ([[9], [8], [7]], 2)
    """
    batches = [list(batch) for batch in tail if len(batch)]
    total = sum(len(batch) for batch in batches)
    if total == 0 or (len(tail) == num_shards and len(batches) == num_shards):
        return list(tail)
    if total >= num_shards:
        return _spread(batches, num_shards)
    own = [i for batch in batches for i in batch]
    pool = list(before) or own
    missing = num_shards - total
    shards = [[i] for i in own] + [[pool[k % len(pool)]] for k in range(missing)]
    return FilledStep(shards, repeated=missing)


def _spread(batches: List[List[Any]], num_shards: int) -> List[List[Any]]:
    """``batches`` (non-empty, with at least ``num_shards`` samples in all) cut into
    ``num_shards`` contiguous pieces, as ``fill_step`` describes."""
    pieces = [1] * len(batches)
    for _ in range(num_shards - len(batches)):
        widest = max(
            range(len(batches)),
            key=lambda b: -(-len(batches[b]) // pieces[b]) if pieces[b] < len(batches[b]) else 0,
        )
        pieces[widest] += 1
    step = []
    for batch, count in zip(batches, pieces):
        size, extra = divmod(len(batch), count)
        begin = 0
        for k in range(count):
            end = begin + size + (k < extra)
            step.append(batch[begin:end])
            begin = end
    return step


class _Grouper(_WrapperMixin, Sampler):
    """Groups the items of a wrapped sampler into lists of ``_size``, with a last-group policy.

    One constructor serves both subclasses: ``_arg_names`` names its three arguments (the
    wrapped sampler, the group size and the policy) in messages and in ``state_dict``, and
    ``_policies`` lists the policies. Subclasses say what ``'keep'`` makes of a short last
    group (``_last_group``) and may check each item (``_check_item``).
    """

    _arg_names: Tuple[str, str, str]
    _policies: Tuple[str, ...]

    def __init__(self, sampler: Any, size: int, policy: str) -> None:
        sampler_name, size_name, policy_name = self._arg_names
        self._sampler = check_sampler(sampler_name, sampler)
        if getattr(sampler, "yields_steps", False):
            raise ValueError(self._steps_message(sampler))
        self._size = check_int(size_name, size, minimum=1)
        self._policy = check_choice(policy_name, policy, self._policies)
        self._carry: List[Any] = []
        self._epoch = initial_epoch(sampler)

    @staticmethod
    def _steps_message(sampler: Any) -> str:
        """The message refusing a wrapped ``sampler`` that yields steps."""
        raise NotImplementedError

    def __len__(self) -> int:
        total = len(self._sampler)
        if self._policy == "rollover":
            total += len(self._carry)
        return count_groups(total, self._size, self._policy in ("keep", "partial"))

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[List[Any]]:
        # As in Gluon, the carry is taken when the pass starts: a pass given up half way loses
        # it, and len() during a pass no longer counts it.
        carry, self._carry = self._carry, []
        return self._groups(carry, start)

    def _groups(self, carry: List[Any], skip: int) -> Iterator[List[Any]]:
        check = None if type(self)._check_item is _Grouper._check_item else self._check_item
        items = iter(self._sampler)
        tail, previous, skip = yield from full_groups(items, self._size, carry, skip, check)
        if not tail:
            return
        if self._policy == "rollover":
            self._carry = tail
        elif self._policy != "discard" and not skip:
            yield self._last_group(tail, previous)

    def _last_group(self, group: List[Any], previous: Optional[List[Any]]) -> List[Any]:
        """What ``'keep'`` yields for the short last ``group``; ``previous`` is the full group
        before it, if any."""
        return group

    def _check_item(self, item: Any) -> None:
        """Raise if ``item`` is not what this grouper expects from its wrapped sampler."""

    def _config(self) -> Dict[str, Any]:
        _, size_name, policy_name = self._arg_names
        return {size_name: self._size, policy_name: self._policy}

    def _replay_state(self) -> Dict[str, Any]:
        state = {"carry": json_ready(self._carry)}
        state.update(self._inner_replay())
        return state

    def _load_replay_state(self, state: Dict[str, Any]) -> None:
        name = type(self).__name__
        carry = state_value(state, "carry", name)
        # The carry holds items of the wrapped sampler: indices, or batches for a grouper
        # that makes steps.
        what = "batches (lists of ints)" if self.yields_steps else "indices (ints)"
        if not isinstance(carry, list):
            raise StateTypeError(
                f"{name} state_dict['carry'] must be a list of {what}, got {carry!r:.100}"
            )
        if len(carry) >= self._size or (carry and self._policy != "rollover"):
            raise ValueError(
                f"{name} state_dict['carry'] holds {len(carry)} items, which does not fit "
                f"{self._policy!r} groups of {self._size}"
            )
        for position, item in enumerate(carry):
            if self.yields_steps:
                fits = isinstance(item, list) and all(map(is_index, item))
            else:
                fits = is_index(item)
            if not fits:
                raise StateTypeError(
                    f"{name} state_dict['carry'] must be a list of {what}, got {item!r:.100} "
                    f"at position {position}"
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

    _arg_names = ("sampler", "batch_size", "last_batch")
    _policies = LAST_POLICIES

    def __init__(self, sampler: Any, batch_size: int, last_batch: str = "keep") -> None:
        super().__init__(sampler, batch_size, last_batch)

    @staticmethod
    def _steps_message(sampler: Any) -> str:
        return (
            f"sampler must yield indices, but the given {type(sampler).__name__} yields "
            "steps (lists of index lists)"
        )

    @property
    def batch_size(self) -> int:
        """The size of a full batch."""
        return self._size

    @property
    def last_batch(self) -> str:
        """The policy for the last, short batch of an epoch."""
        return self._policy


class ShardGroupSampler(_Grouper):
    """Wraps a batch sampler and yields steps: lists of ``num_shards`` batches, one per shard.

    Parameters
    ----------
    batch_sampler : Sampler
        Yields batches (lists of indices), such as ``BatchSampler`` or a
        ``FixedBucketSampler`` with ``num_shards=0``.
    num_shards : int
        Batches per step, usually the number of devices.
    last_group : {'keep', 'partial', 'discard', 'rollover'}, default 'keep'
        What happens to the last step of an epoch when it has fewer than ``num_shards``
        batches:

        - ``'keep'`` spreads the samples of its batches over ``num_shards`` shards (see
          ``fill_step``), so that every step is full and every sample of the pass is yielded.
          Only when fewer samples than shards are left are samples repeated: each missing
          shard gets one sample of the step before. ``repeated_samples`` counts them.
        - ``'partial'`` yields it with fewer shards. With one shard per device, a Gluon
          ``Trainer`` then sums the stale gradients of the devices left without a shard, so
          use it only where no gradient is taken (evaluation).
        - ``'discard'`` drops its batches.
        - ``'rollover'`` carries its batches to the front of the next epoch.

        Apart from ``'keep'``'s repeats in a tail shorter than ``num_shards`` samples, no
        sample is ever repeated in a pass.

    Raises
    ------
    ValueError
        If ``batch_sampler`` already yields steps, or ``last_group`` is not one of the above.

    Examples
    --------
    >>> batches = BatchSampler(SequentialSampler(8), 3)
    >>> list(batches)
    [[0, 1, 2], [3, 4, 5], [6, 7]]
    >>> list(ShardGroupSampler(batches, 2))
    [[[0, 1, 2], [3, 4, 5]], [[6], [7]]]
    >>> list(ShardGroupSampler(batches, 2, 'partial'))
    [[[0, 1, 2], [3, 4, 5]], [[6, 7]]]
    >>> list(ShardGroupSampler(batches, 2, 'discard'))
    [[[0, 1, 2], [3, 4, 5]]]
    >>> steps = ShardGroupSampler(BatchSampler(SequentialSampler(7), 3), 3)
    >>> list(steps), steps.repeated_samples
    ([[[0, 1, 2], [3, 4, 5], [6]]], 0)
    >>> steps = ShardGroupSampler(BatchSampler(SequentialSampler(10), 3), 3)
    >>> list(steps), steps.repeated_samples
    ([[[0, 1, 2], [3, 4, 5], [6, 7, 8]], [[9], [8], [7]]], 2)
    """

    yields_steps = True

    _arg_names = ("batch_sampler", "num_shards", "last_group")
    _policies = GROUP_POLICIES

    def __init__(self, batch_sampler: Any, num_shards: int, last_group: str = "keep") -> None:
        super().__init__(batch_sampler, num_shards, last_group)

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

    def _last_group(self, group: List[Any], previous: Optional[List[Any]]) -> List[Any]:
        return last_step(group, previous, self._size, self._policy)

    def _check_item(self, item: Any) -> None:
        if isinstance(item, (int, np.integer)):
            raise TypeError(
                f"batch_sampler must yield batches (lists of indices), but the given "
                f"{type(self._sampler).__name__} yielded the index {item!r}; wrap it in a "
                "BatchSampler first"
            )
        if len(item) and isinstance(item[0], (list, tuple, np.ndarray)):
            raise ValueError(self._steps_message(self._sampler))
