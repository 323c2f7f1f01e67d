"""Partitioning for distributed training: each of ``num_parts`` machines reads one part.

Both samplers cut their sequence into ``num_parts`` contiguous slices whose lengths differ by
at most one, the longer slices first: with ``n`` items, part ``p`` gets ``n // num_parts``
items, plus one if ``p < n % num_parts``. The parts are disjoint and cover every item.

``even_size=True`` makes every part ``ceil(n / num_parts)`` long by *padding*: a part that is
one item short repeats one item of its own slice. Padding never reaches into another part, so
the parts stay disjoint as sets and together still cover every item; the only repeats are the
pad items, at most one per part and pass. Every part then has at least one item of its own,
so ``even_size=True`` needs ``n >= num_parts``.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .._validate import check_bool, check_int
from ._base import Sampler, _SeededMixin, check_seed
from ._wrap import _WrapperMixin, check_sampler, initial_epoch

__all__ = ["PartitionSampler", "SplitSampler"]


def part_bounds(total: int, num_parts: int, part_index: int) -> Tuple[int, int]:
    """``(start, stop)`` of part ``part_index`` when ``total`` items are cut into
    ``num_parts`` balanced contiguous slices, the longer ones first."""
    size, extra = divmod(total, num_parts)
    start = part_index * size + min(part_index, extra)
    return start, start + size + (part_index < extra)


def part_items(items: List[Any], num_parts: int, part_index: int, even_size: bool) -> List[Any]:
    """Part ``part_index`` of ``items`` cut into ``num_parts`` (see the module docstring),
    padded to ``ceil(len(items) / num_parts)`` with ``even_size``: with one item of its own,
    or, for a part left without any (fewer items than parts), with item ``part_index`` modulo
    ``len(items)`` of another part."""
    lo, hi = part_bounds(len(items), num_parts, part_index)
    part = items[lo:hi]
    if even_size and items:
        pad = _even_length(len(items), num_parts) - len(part)
        part += part[:pad] if part else [items[part_index % len(items)]]
    return part


def _check_part(num_parts: Any, part_index: Any) -> Tuple[int, int]:
    num_parts = check_int("num_parts", num_parts, minimum=1)
    part_index = check_int("part_index", part_index)
    if part_index >= num_parts:
        raise ValueError(
            f"part_index must be an int in [0, num_parts) = [0, {num_parts}), got {part_index}"
        )
    return num_parts, part_index


def _even_length(total: int, num_parts: int) -> int:
    return -(-total // num_parts)


class PartitionSampler(_WrapperMixin, Sampler):
    """Yields part ``part_index`` of every epoch of another sampler, for distributed training.

    Each pass runs one full pass of ``sampler`` at the same epoch and yields the
    ``part_index``-th of ``num_parts`` contiguous slices of it (see the module docstring for
    the slicing and the ``even_size`` padding). The wrapped sampler's order depends only on
    its ``(seed, epoch)``, so machines that build it with the same explicit ``seed`` agree on
    it and their parts are disjoint and cover the epoch. Build it with an explicit ``seed``
    (or seed numpy identically everywhere): ``seed=None`` draws a different seed per process.

    The wrapped sampler may yield anything: indices, batches or steps.

    Parameters
    ----------
    sampler : Sampler
        The sampler to partition; ``len(sampler)`` must be exact.
    num_parts : int
        Number of parts, e.g. ``kv.num_workers``.
    part_index : int
        The part to yield, in ``[0, num_parts)``, e.g. ``kv.rank``.
    even_size : bool, default False
        Pad shorter parts with one item of their own, so that every part has
        ``ceil(len(sampler) / num_parts)`` items.

    Examples
    --------
    >>> [list(PartitionSampler(SequentialSampler(5), 2, i)) for i in range(2)]
    [[0, 1, 2], [3, 4]]
    >>> list(PartitionSampler(SequentialSampler(5), 2, 1, even_size=True))
    [3, 4, 3]
    >>> parts = [PartitionSampler(RandomSampler(10, seed=7), 3, i) for i in range(3)]
    >>> sorted(i for part in parts for i in part)
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """

    def __init__(
        self, sampler: Any, num_parts: int, part_index: int, even_size: bool = False
    ) -> None:
        self._sampler = check_sampler("sampler", sampler)
        self._num_parts, self._part_index = _check_part(num_parts, part_index)
        self._even_size = check_bool("even_size", even_size)
        if self._even_size and len(sampler) < self._num_parts:
            raise ValueError(
                f"even_size=True needs a sampler with at least num_parts={self._num_parts} "
                f"items, got one with {len(sampler)}"
            )
        self._epoch = initial_epoch(sampler)

    @property
    def yields_steps(self) -> bool:  # type: ignore[override]
        """Whether the items are steps: the same as for the wrapped sampler."""
        return bool(getattr(self._sampler, "yields_steps", False))

    def __len__(self) -> int:
        total = len(self._sampler)
        if self._even_size:
            return _even_length(total, self._num_parts)
        start, stop = part_bounds(total, self._num_parts, self._part_index)
        return stop - start

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[Any]:
        items = list(self._sampler)
        if self._even_size and len(items) < self._num_parts:
            raise ValueError(
                f"even_size=True needs at least num_parts={self._num_parts} items per "
                f"epoch, but the wrapped sampler yielded {len(items)} in epoch {epoch}"
            )
        part = part_items(items, self._num_parts, self._part_index, self._even_size)
        yield from part[start:]

    def _with_part(self, num_parts: int, part_index: int, even_size: bool) -> PartitionSampler:
        """A sampler like this one, over the same wrapped sampler, for another part."""
        return PartitionSampler(self._sampler, num_parts, part_index, even_size)

    def _config(self) -> Dict[str, Any]:
        return {
            "num_parts": self._num_parts,
            "part_index": self._part_index,
            "even_size": self._even_size,
        }

    def _replay_state(self) -> Dict[str, Any]:
        return self._inner_replay()

    def _load_replay_state(self, state: Dict[str, Any]) -> None:
        self._load_inner(state)


class SplitSampler(_SeededMixin, Sampler):
    """Yields part ``part_index`` of ``range(length)``, shuffled per epoch (gluon-nlp's).

    The indices are cut into ``num_parts`` contiguous ranges (see the module docstring), and
    each pass yields this part's range ``repeat`` times, each repetition shuffled anew from
    ``(seed, epoch)`` when ``shuffle`` is true. Unlike gluon-nlp's, ``even_size`` pads a short
    part with one of its own indices rather than a random index of the whole dataset, so the
    parts stay disjoint.

    Parameters
    ----------
    length : int
        Number of samples in the dataset; at least ``num_parts``.
    num_parts : int, default 1
        Number of parts.
    part_index : int, default 0
        The part to yield, in ``[0, num_parts)``.
    even_size : bool, default False
        Give every part ``ceil(length / num_parts)`` indices per repetition by repeating one
        index of a shorter part.
    repeat : int, default 1
        How many times each pass yields the part's indices.
    shuffle : bool, default True, keyword-only
        Shuffle each repetition.
    seed : int or None, keyword-only
        Base seed of the shuffles. ``None`` draws one from numpy's global RNG at
        construction when ``shuffle`` is true.

    Examples
    --------
    >>> list(SplitSampler(10, num_parts=3, part_index=1, shuffle=False))
    [4, 5, 6]
    >>> list(SplitSampler(10, 3, 2, even_size=True, shuffle=False))
    [7, 8, 9, 7]
    >>> list(SplitSampler(10, 3, 2, repeat=2, shuffle=False))
    [7, 8, 9, 7, 8, 9]
    >>> sorted(SplitSampler(10, 3, 0, seed=1))
    [0, 1, 2, 3]
    """

    def __init__(
        self,
        length: int,
        num_parts: int = 1,
        part_index: int = 0,
        even_size: bool = False,
        repeat: int = 1,
        *,
        shuffle: bool = True,
        seed: Optional[int] = None,
    ) -> None:
        self._length = check_int("length", length)
        self._num_parts, self._part_index = _check_part(num_parts, part_index)
        if self._length < self._num_parts:
            raise ValueError(
                f"length must be at least num_parts={self._num_parts}, got {self._length}"
            )
        self._even_size = check_bool("even_size", even_size)
        self._repeat = check_int("repeat", repeat, minimum=1)
        self._shuffle = check_bool("shuffle", shuffle)
        self._seed = check_seed(seed, random=self._shuffle)
        self._start, self._stop = part_bounds(self._length, self._num_parts, self._part_index)
        if self._even_size:
            self._part_len = _even_length(self._length, self._num_parts)
        else:
            self._part_len = self._stop - self._start

    def __len__(self) -> int:
        return self._part_len * self._repeat

    def _with_part(self, num_parts: int, part_index: int, even_size: bool) -> SplitSampler:
        """A replica (``Sampler._replica``) that yields part ``part_index`` of ``num_parts``."""
        clone: Any = self._replica()
        clone.__init__(
            self._length,
            num_parts,
            part_index,
            even_size,
            self._repeat,
            shuffle=self._shuffle,
            seed=self._seed,
        )
        return clone

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[int]:
        own = np.arange(self._start, self._stop)
        pad = self._part_len - len(own)
        rng = self._epoch_rng(epoch) if self._shuffle else None
        rounds: List[np.ndarray] = []
        for _ in range(self._repeat):
            if rng is None:
                indices = np.concatenate([own, own[:pad]])
            else:
                extra = rng.choice(own, size=pad, replace=False) if pad else own[:0]
                indices = rng.permutation(np.concatenate([own, extra]))
            rounds.append(indices)
        return iter(np.concatenate(rounds)[start:].tolist())

    def _config(self) -> Dict[str, Any]:
        return {
            "length": self._length,
            "num_parts": self._num_parts,
            "part_index": self._part_index,
            "even_size": self._even_size,
            "repeat": self._repeat,
            "shuffle": self._shuffle,
        }
