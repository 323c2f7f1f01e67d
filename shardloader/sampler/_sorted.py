"""Samplers that order the samples by a key, from gluon-nlp: ``SortedBucketSampler`` yields
batches of samples of similar keys, ``SortedSampler`` yields indices sorted by key.

``SortedBucketSampler`` draws its shuffles afresh from ``(seed, epoch)`` on every pass, instead
of gluon-nlp's in-place shuffles of the previous pass's order, so a pass is reproducible on its
own.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

from .._validate import check_bool, check_int, check_number
from ._base import Sampler, _SeededMixin, check_seed

__all__ = ["SortedBucketSampler", "SortedSampler"]


def _check_sort_keys(sort_keys: Any, accepted: str) -> Sequence[Any]:
    """``sort_keys`` if it is a non-empty sequence; ``accepted`` is what the ``TypeError``
    for a value that is not a sequence says is accepted."""
    if not hasattr(sort_keys, "__len__") or not hasattr(sort_keys, "__getitem__"):
        raise TypeError(f"sort_keys must be {accepted}, got {type(sort_keys).__name__}")
    if len(sort_keys) == 0:
        raise ValueError("sort_keys must be a non-empty sequence, got an empty one")
    return sort_keys


class SortedBucketSampler(_SeededMixin, Sampler):
    """Batches of samples sorted by key within chunks: gluon-nlp's ``SortedBucketSampler``.

    The sample indices (shuffled from ``(seed, epoch)`` if ``shuffle``) are cut into chunks
    of ``int(mult * batch_size)``; each chunk is sorted by ``sort_keys`` (stably) and cut into
    batches of ``batch_size``, whose order within the chunk is shuffled if ``shuffle``. Only
    the last batch of a chunk can be short; ``len()`` counts them all.

    Parameters
    ----------
    sort_keys : sequence
        The key of each sample, e.g. its length.
    batch_size : int
        Samples per batch.
    mult : int or float, default 100
        Chunk size as a multiple of ``batch_size``; at least 1.
    reverse : bool, default True
        Sort in descending order.
    shuffle : bool, default False
        Shuffle the samples before chunking and the batches within each chunk.
    seed : int or None, keyword-only
        Base seed of the shuffles; ``None`` draws one from numpy's global RNG at construction
        when ``shuffle`` is true.

    Examples
    --------
    >>> list(SortedBucketSampler([5, 1, 4, 2, 3, 6], batch_size=2, mult=2))
    [[0, 2], [3, 1], [5, 4]]
    """

    def __init__(
        self,
        sort_keys: Sequence[Any],
        batch_size: int,
        mult: float = 100,
        reverse: bool = True,
        shuffle: bool = False,
        *,
        seed: Optional[int] = None,
    ) -> None:
        self._sort_keys = _check_sort_keys(sort_keys, "a sequence")
        self._batch_size = check_int("batch_size", batch_size, minimum=1)
        self._mult = check_number("mult", mult, 1)
        self._reverse = check_bool("reverse", reverse)
        self._shuffle = check_bool("shuffle", shuffle)
        self._seed = check_seed(seed, random=self._shuffle)

    def __len__(self) -> int:
        # Exact even when the chunk size is not a multiple of batch_size (gluon-nlp's
        # ceil(n / batch_size) undercounts then).
        total, size = len(self._sort_keys), self._batch_size
        chunk = int(self._mult * size)
        full, rest = divmod(total, chunk)
        return full * -(-chunk // size) + -(-rest // size)

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[List[int]]:
        total, size = len(self._sort_keys), self._batch_size
        rng = self._epoch_rng(epoch) if self._shuffle else None
        ids = rng.permutation(total).tolist() if rng is not None else list(range(total))
        chunk = int(self._mult * size)
        keys = self._sort_keys
        batches: List[List[int]] = []
        for begin in range(0, total, chunk):
            ranked = sorted(ids[begin : begin + chunk], key=keys.__getitem__, reverse=self._reverse)
            starts = np.arange(0, len(ranked), size)
            if rng is not None:
                starts = rng.permutation(starts)
            batches.extend(ranked[s : s + size] for s in starts.tolist())
        return iter(batches[start:])

    def _config(self) -> Dict[str, Any]:
        return {
            "length": len(self._sort_keys),
            "batch_size": self._batch_size,
            "shuffle": self._shuffle,
        }


class SortedSampler(Sampler):
    """Yields the sample indices ordered by their keys: gluon-nlp's ``SortedSampler``.

    The order is that of gluon-nlp 0.10.0: indices sorted by ``sort_keys[i]``, in descending
    order when ``reverse`` (the default); equal keys keep their index order either way. The
    order is computed once, at construction, and is the same in every pass; ``set_epoch``,
    ``state_dict`` and ``load_state_dict`` follow the sampler protocol (the state records the
    position in the pass, for a mid-epoch resume).

    Parameters
    ----------
    sort_keys : sequence
        The key of each sample, e.g. its length; any mutually comparable values.
    reverse : bool, default True
        Sort in descending order.

    Examples
    --------
    >>> list(SortedSampler([5, 1, 4, 1, 9]))
    [4, 0, 2, 1, 3]
    >>> list(SortedSampler([5, 1, 4, 1, 9], reverse=False))
    [1, 3, 2, 0, 4]
    >>> batches = BatchSampler(SortedSampler([3, 8, 1, 6]), 2)
    >>> list(batches)
    [[1, 3], [0, 2]]
    """

    def __init__(self, sort_keys: Sequence[Any], reverse: bool = True) -> None:
        _check_sort_keys(sort_keys, "a non-empty sequence")
        self._reverse = check_bool("reverse", reverse)
        # Python's sort is stable also with reverse=True, as gluon-nlp relies on.
        self._order: List[int] = sorted(
            range(len(sort_keys)), key=sort_keys.__getitem__, reverse=self._reverse
        )

    def __len__(self) -> int:
        return len(self._order)

    @property
    def reverse(self) -> bool:
        """Whether the keys come in descending order."""
        return self._reverse

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[int]:
        return iter(self._order[start:])

    def _config(self) -> Dict[str, Any]:
        return {"length": len(self._order), "reverse": self._reverse}
