"""Gluon's index samplers: ``SequentialSampler``, ``RandomSampler``, ``FilterSampler`` and
``IntervalSampler``, on the shardloader sampler protocol (see ``_base``).

Each yields sample indices, in the order of MXNet's sampler of the same name, except that
``RandomSampler`` draws its permutation from ``(seed, epoch)`` instead of numpy's global RNG.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

from .._validate import check_bool, check_int
from ._base import Sampler, _SeededMixin, check_seed

__all__ = ["SequentialSampler", "RandomSampler", "FilterSampler", "IntervalSampler"]


class SequentialSampler(Sampler):
    """Yields ``start, start + 1, ..., start + length - 1`` on every pass, as Gluon's does.

    Parameters
    ----------
    length : int
        Number of indices.
    start : int, default 0
        The first index.

    Examples
    --------
    >>> list(SequentialSampler(4, start=2))
    [2, 3, 4, 5]
    """

    def __init__(self, length: int, start: int = 0) -> None:
        self._length = check_int("length", length)
        self._start = check_int("start", start, minimum=None)

    def __len__(self) -> int:
        return self._length

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[int]:
        return iter(range(self._start + start, self._start + self._length))

    def _config(self) -> Dict[str, Any]:
        return {"length": self._length, "start": self._start}


class RandomSampler(_SeededMixin, Sampler):
    """Yields a permutation of ``range(length)`` drawn from ``(seed, epoch)``.

    Unlike Gluon's, which draws from numpy's global RNG, the order does not depend on
    anything else the program does; it changes with the epoch, which ``set_epoch`` sets and
    each pass advances.

    Parameters
    ----------
    length : int
        Number of indices.
    seed : int or None, keyword-only
        Base seed. ``None`` draws one from numpy's global RNG at construction, so
        ``np.random.seed(...)`` beforehand makes a program reproducible, as with Gluon.

    Examples
    --------
    >>> sampler = RandomSampler(5, seed=42)
    >>> first = list(sampler)
    >>> sorted(first)
    [0, 1, 2, 3, 4]
    >>> sampler.set_epoch(0)
    >>> list(sampler) == first
    True
    """

    def __init__(self, length: int, *, seed: Optional[int] = None) -> None:
        self._length = check_int("length", length)
        self._seed = check_seed(seed)

    def __len__(self) -> int:
        return self._length

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[int]:
        order = self._epoch_rng(epoch).permutation(self._length)
        return iter(order[start:].tolist())

    def _config(self) -> Dict[str, Any]:
        return {"length": self._length}


class FilterSampler(Sampler):
    """Yields, in order, the indices of the samples of ``dataset`` for which ``fn`` is true.

    As in Gluon, ``dataset`` is scanned once, at construction.

    Parameters
    ----------
    fn : callable
        Takes a sample and returns a truth value.
    dataset : iterable
        The dataset to filter.

    Examples
    --------
    >>> list(FilterSampler(lambda x: x % 3 == 0, [3, 4, 5, 6, 9]))
    [0, 3, 4]
    """

    def __init__(self, fn: Callable[[Any], Any], dataset: Iterable) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r} ({type(fn).__name__})")
        self._fn = fn
        self._dataset = dataset
        self._indices: List[int] = [i for i, sample in enumerate(dataset) if fn(sample)]

    def __len__(self) -> int:
        return len(self._indices)

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[int]:
        return iter(self._indices[start:])

    def _config(self) -> Dict[str, Any]:
        return {"length": len(self._indices)}


class IntervalSampler(Sampler):
    """Yields every ``interval``-th index of ``range(length)``, then, with ``rollover``, the
    same from 1, from 2, ... until every index has come once: MXNet 2.x's
    ``gluon.data.IntervalSampler`` (1.x's ``gluon.contrib.data.IntervalSampler``), in the
    same order.

    Unlike MXNet's, whose ``len()`` is ``length`` even with ``rollover=False``,
    ``len()`` is the number of indices a pass yields, so a ``BatchSampler`` over it counts
    its batches right.

    Parameters
    ----------
    length : int
        Number of indices.
    interval : int
        The step between two indices of one sweep, from 1 to ``length``.
    rollover : bool, default True
        Sweep again from each skipped start, so every index comes once; ``False`` stops
        after the sweep from 0.

    Examples
    --------
    >>> list(IntervalSampler(13, interval=3))
    [0, 3, 6, 9, 12, 1, 4, 7, 10, 2, 5, 8, 11]
    >>> sampler = IntervalSampler(13, interval=3, rollover=False)
    >>> list(sampler), len(sampler)
    ([0, 3, 6, 9, 12], 5)
    """

    def __init__(self, length: int, interval: int, rollover: bool = True) -> None:
        self._length = check_int("length", length)
        self._interval = check_int("interval", interval, minimum=1)
        if self._interval > self._length:
            raise ValueError(
                f"interval must be an int in [1, length={self._length}], got {self._interval}"
            )
        self._rollover = check_bool("rollover", rollover)

    def __len__(self) -> int:
        if self._rollover:
            return self._length
        return -(-self._length // self._interval)

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[int]:
        sweeps = self._interval if self._rollover else 1
        order = (j for i in range(sweeps) for j in range(i, self._length, self._interval))
        return itertools.islice(order, start, None)

    def _config(self) -> Dict[str, Any]:
        return {"length": self._length, "interval": self._interval, "rollover": self._rollover}
