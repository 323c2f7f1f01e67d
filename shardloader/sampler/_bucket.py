"""gluon-nlp's ``FixedBucketSampler``: batches of samples of similar length.

It yields batches (lists of indices), or, with ``num_shards=N``, steps of ``N`` batches, grouped
as ``ShardGroupSampler`` groups them (``full_groups``, ``last_step``), plus gluon-nlp's ``'pad'``
for the last step. Shuffling is drawn afresh from ``(seed, epoch)`` on every pass, instead of
gluon-nlp's in-place shuffles of the previous pass's order, so a pass is reproducible on its own.
The length-sorted samplers are in ``_sorted``.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .._validate import check_bool, check_choice, check_int, check_number
from ._base import FilledStep, Sampler, _SeededMixin, check_seed
from ._batch import GROUP_POLICIES as _GROUPER_POLICIES
from ._batch import count_groups, full_groups, last_step
from ._scheme import BucketScheme, ConstWidthBucket, Key

__all__ = ["FixedBucketSampler"]

_DEFAULT_SCHEME = ConstWidthBucket()
_ASSIGN_CHUNK = 4096  # rows per step when matching tuple lengths to keys, to bound memory
# ShardGroupSampler's policies, but gluon-nlp's 'pad' instead of 'rollover'.
GROUP_POLICIES = _GROUPER_POLICIES[:3] + ("pad",)


def _as_array(value: Any) -> np.ndarray:
    """``np.asarray(value)``, or an empty object array for a ragged ``value``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy < 1.24 warns before making a ragged array
        try:
            return np.asarray(value)
        except ValueError:
            return np.empty(0, dtype=object)


def _as_lengths(lengths: Any) -> np.ndarray:
    """``lengths`` as an ``(n,)`` or ``(n, k)`` int64 array of positive values."""
    accepted = "a non-empty sequence of ints or of equal-size tuples of ints"
    array = _as_array(lengths)
    if array.dtype == object or array.ndim not in (1, 2):
        raise ValueError(f"lengths must be {accepted}, got {_short(lengths)}")
    if array.size == 0:
        raise ValueError(f"lengths must be {accepted}, got an empty one")
    if array.dtype.kind not in "iu":
        raise TypeError(
            "lengths must be a sequence of ints or of equal-size tuples of ints, got an array "
            f"of dtype {array.dtype}"
        )
    if array.min() <= 0:
        raise ValueError(f"lengths must all be positive, got a length of {array.min()}")
    return array.astype(np.int64)


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_keys(bucket_keys: Any, width: int) -> List[Key]:
    """The given bucket keys as ints (``width == 0``) or as tuples of ``width`` ints."""
    shape = "ints" if width == 0 else f"tuples of {width} ints"
    array = _as_array(bucket_keys)
    expected_ndim = 1 if width == 0 else 2
    if (
        array.dtype.kind not in "iu"
        or array.ndim != expected_ndim
        or array.shape[0] == 0
        or (width and array.shape[1] != width)
    ):
        raise ValueError(
            f"bucket_keys must be a non-empty sequence of {shape}, got {bucket_keys!r}"
        )
    if width == 0:
        return [int(k) for k in array]
    return [tuple(int(v) for v in row) for row in array]


def _assign(keys: List[Key], lengths: np.ndarray) -> np.ndarray:
    """For each sample, the index into sorted ``keys`` of the bucket with the least padding
    among those whose key is at least its length in every position (the first on a tie)."""
    key_array = np.asarray(keys, dtype=np.int64)
    if lengths.ndim == 1:
        # With sorted int keys the least padding is the smallest key that fits.
        found = np.searchsorted(key_array, lengths, side="left")
    else:
        found = np.empty(len(lengths), dtype=np.int64)
        for begin in range(0, len(lengths), _ASSIGN_CHUNK):
            block = lengths[begin : begin + _ASSIGN_CHUNK]
            slack = key_array[None, :, :] - block[:, None, :]
            padding = np.where((slack >= 0).all(axis=2), slack.sum(axis=2), np.iinfo(np.int64).max)
            best = padding.argmin(axis=1)
            best[padding[np.arange(len(block)), best] == np.iinfo(np.int64).max] = len(keys)
            found[begin : begin + len(block)] = best
    misfits = np.nonzero(found == len(keys))[0]
    if len(misfits):
        raise ValueError(
            f"{len(misfits)} samples fit no bucket, e.g. sample {misfits[0]} of length "
            f"{lengths[misfits[0]].tolist()}; bucket_keys={keys}. Increase the bucket keys."
        )
    return found


def _pad_step(batches: List[List[int]], num_shards: int, short: int) -> FilledStep:
    """gluon-nlp's last step (``'pad'``) when the last step has ``short`` batches: the last
    ``num_shards`` batches of the pass, so it repeats whole batches of the step before; cycled
    if there are fewer batches than that."""
    if len(batches) >= num_shards:
        last = batches[-num_shards:]
        repeated = sum(len(b) for b in last[: num_shards - short])
    else:
        last = [batches[i % len(batches)] for i in range(num_shards)]
        repeated = sum(len(b) for b in last[len(batches) :])
    return FilledStep(last, repeated=repeated)


class FixedBucketSampler(_SeededMixin, Sampler):
    r"""Batches samples of similar length together: gluon-nlp's ``FixedBucketSampler``.

    Each sample goes to the bucket with the least padding among those whose key is at least
    its length (in every position, for tuple lengths). Empty buckets are removed with a
    warning. Bucket ``i`` with key :math:`K_i` gets batches of

    .. math:: B_i = \max(\lfloor \alpha B \max_j |K_j| / |K_i| \rfloor, B)

    samples, where :math:`B` is ``batch_size``, :math:`\alpha` is ``ratio`` and :math:`|K|`
    is the key, or the sum of a tuple key. Without shuffling the batches come bucket by
    bucket, the largest key first; with it, the samples of each bucket and the order of all
    batches are shuffled from ``(seed, epoch)``.

    Parameters
    ----------
    lengths : sequence of int or of tuples of int
        The length of each sample; all positive.
    batch_size : int
        The base batch size :math:`B`.
    num_buckets : int, default 10
        Number of buckets to generate; ignored when ``bucket_keys`` is given.
    bucket_keys : sequence of int or of tuples of int, optional
        The bucket keys, instead of generating them with ``bucket_scheme``.
    ratio : float, default 0
        Scale-up factor :math:`\alpha` of the batch size of buckets with smaller keys.
    shuffle : bool, default False
        Shuffle the samples within buckets and the order of the batches.
    use_average_length : bool, default False
        Make ``batch_size`` a budget of elements: bucket ``i`` gets
        ``max(int(batch_size / (mean_i + std_i)), 1)`` samples, from the mean and standard
        deviation of its lengths; ``ratio`` is then ignored.
    num_shards : int, default 0
        When positive, yield steps: lists of ``num_shards`` consecutive batches. Every step
        has ``num_shards`` non-empty shards, as with gluon-nlp, unless
        ``last_group='partial'``.
    bucket_scheme : BucketScheme, default ConstWidthBucket()
        Makes the keys when ``bucket_keys`` is not given.
    last_group : {'keep', 'partial', 'discard', 'pad'}, default 'keep', keyword-only
        With ``num_shards``, what happens to a last step with fewer batches:

        - ``'keep'`` spreads the samples of its batches over ``num_shards`` shards (see
          ``ShardGroupSampler``), each shard a piece of one batch and so of one bucket. No
          sample is repeated unless fewer samples than shards are left; then each missing
          shard gets one sample of the step before, and ``repeated_samples`` counts them.
        - ``'partial'`` yields it with fewer shards; with one shard per device, a Gluon
          ``Trainer`` then sums stale gradients, so use it only for evaluation.
        - ``'discard'`` drops it.
        - ``'pad'`` fills it as gluon-nlp does, with whole batches of the step before (or,
          with fewer than ``num_shards`` batches in all, by cycling them), which repeats up
          to ``num_shards - 1`` batches; ``repeated_samples`` counts their samples.
    seed : int or None, keyword-only
        Base seed of the shuffles; ``None`` draws one from numpy's global RNG at construction
        when ``shuffle`` is true.

    Examples
    --------
    >>> lengths = [3, 9, 4, 8, 2, 10, 7]
    >>> sampler = FixedBucketSampler(lengths, batch_size=2, bucket_keys=[5, 10])
    >>> list(sampler)
    [[1, 3], [5, 6], [0, 2], [4]]
    >>> print(sampler.stats())
    FixedBucketSampler:
      sample_num=7, batch_num=4
      key=[5, 10]
      cnt=[3, 4]
      batch_size=[2, 2]
    >>> list(FixedBucketSampler(lengths, 2, bucket_keys=[5, 10], num_shards=2))
    [[[1, 3], [5, 6]], [[0, 2], [4]]]
    >>> list(FixedBucketSampler(lengths, 3, bucket_keys=[5, 10], num_shards=2))
    [[[1, 3, 5], [6]], [[0, 2], [4]]]
    >>> steps = FixedBucketSampler(lengths, 2, bucket_keys=[5, 10], num_shards=3)
    >>> list(steps), steps.repeated_samples
    ([[[1, 3], [5, 6], [0, 2]], [[4], [2], [0]]], 2)
    >>> list(FixedBucketSampler(lengths, 2, bucket_keys=[5, 10], num_shards=3,
    ...                         last_group='partial'))
    [[[1, 3], [5, 6], [0, 2]], [[4]]]
    """

    def __init__(
        self,
        lengths: Sequence[Any],
        batch_size: int,
        num_buckets: Optional[int] = 10,
        bucket_keys: Optional[Sequence[Any]] = None,
        ratio: float = 0,
        shuffle: bool = False,
        use_average_length: bool = False,
        num_shards: int = 0,
        bucket_scheme: BucketScheme = _DEFAULT_SCHEME,
        *,
        last_group: str = "keep",
        seed: Optional[int] = None,
    ) -> None:
        self._lengths = _as_lengths(lengths)
        self._batch_size = check_int("batch_size", batch_size, minimum=1)
        self._ratio = check_number("ratio", ratio, 0)
        self._shuffle = check_bool("shuffle", shuffle)
        self._use_average_length = check_bool("use_average_length", use_average_length)
        self._num_shards = check_int("num_shards", num_shards)
        self._last_group = check_choice("last_group", last_group, GROUP_POLICIES)
        self._seed = check_seed(seed, random=self._shuffle)
        keys = sorted(set(self._make_keys(num_buckets, bucket_keys, bucket_scheme)))
        members = self._fill(keys)
        self._keys: List[Key] = [k for k, m in zip(keys, members) if len(m)]
        self._members: List[np.ndarray] = [m for m in members if len(m)]
        self._batch_sizes = self._bucket_batch_sizes()
        # Unshuffled batch order: bucket by bucket, the largest key first.
        self._batch_infos: List[Tuple[int, int]] = [
            (b, begin)
            for b in reversed(range(len(self._keys)))
            for begin in range(0, len(self._members[b]), self._batch_sizes[b])
        ]

    # -- construction --------------------------------------------------------------------------

    def _make_keys(self, num_buckets: Any, bucket_keys: Any, scheme: Any) -> List[Key]:
        width = 0 if self._lengths.ndim == 1 else self._lengths.shape[1]
        if bucket_keys is not None:
            return _check_keys(bucket_keys, width)
        num_buckets = check_int("num_buckets", num_buckets, minimum=1)
        if not callable(scheme):
            raise TypeError(f"bucket_scheme must be a BucketScheme, got {scheme!r}")
        if width == 0:
            hi, lo = int(self._lengths.max()), int(self._lengths.min())
        else:
            hi, lo = self._lengths.max(axis=0).tolist(), self._lengths.min(axis=0).tolist()
        return _check_keys(scheme(hi, lo, num_buckets), width)

    def _fill(self, keys: List[Key]) -> List[np.ndarray]:
        found = _assign(keys, self._lengths)
        order = np.argsort(found, kind="stable")
        bounds = np.searchsorted(found[order], np.arange(len(keys) + 1))
        members = [order[bounds[b] : bounds[b + 1]] for b in range(len(keys))]
        empty = [key for key, m in zip(keys, members) if not len(m)]
        if empty:
            warnings.warn(
                f"Some buckets are empty and will be removed; unused bucket keys={empty}",
                stacklevel=3,
            )
        return members

    def _bucket_batch_sizes(self) -> List[int]:
        size = self._batch_size
        if self._use_average_length:
            if self._ratio > 0:
                warnings.warn(
                    f"ratio={self._ratio} is ignored when use_average_length is True",
                    stacklevel=3,
                )
            sizes = []
            for m in self._members:
                lengths = self._lengths[m]
                sizes.append(max(int(size / (np.mean(lengths) + np.std(lengths))), 1))
            return sizes
        scales = [k if isinstance(k, int) else sum(k) for k in self._keys]
        top = max(scales)
        return [max(int(top / float(s) * self._ratio * size), size) for s in scales]

    # -- iteration -----------------------------------------------------------------------------

    def _batches(self, epoch: int) -> List[List[int]]:
        infos, members = self._batch_infos, self._members
        if self._shuffle:
            rng = self._epoch_rng(epoch)
            infos = [infos[i] for i in rng.permutation(len(infos))]
            members = [m[rng.permutation(len(m))] for m in members]
        sizes = self._batch_sizes
        return [members[b][begin : begin + sizes[b]].tolist() for b, begin in infos]

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[Any]:
        batches = self._batches(epoch)
        if self._num_shards:
            return self._steps(batches, start)
        return iter(batches[start:])

    def _steps(self, batches: List[List[int]], skip: int) -> Iterator[List[List[int]]]:
        """The steps of ``num_shards`` consecutive ``batches``, without the first ``skip``."""
        size, policy = self._num_shards, self._last_group
        tail, previous, skip = yield from full_groups(iter(batches), size, skip=skip)
        if not tail or skip or policy == "discard":
            return
        if policy == "pad":
            yield _pad_step(batches, size, len(tail))
        else:
            yield last_step(tail, previous, size, policy)

    @property
    def yields_steps(self) -> bool:  # type: ignore[override]
        """True when ``num_shards > 0``: every item is a list of index lists."""
        return self._num_shards > 0

    def __len__(self) -> int:
        total = len(self._batch_infos)
        if not self._num_shards:
            return total
        # 'keep', 'partial' and 'pad' keep the last step.
        return count_groups(total, self._num_shards, self._last_group != "discard")

    @property
    def bucket_keys(self) -> List[Key]:
        """The keys of the non-empty buckets, in increasing order."""
        return list(self._keys)

    @property
    def bucket_batch_sizes(self) -> List[int]:
        """The batch size of each bucket, in the order of ``bucket_keys``."""
        return list(self._batch_sizes)

    def bucket_of(self) -> np.ndarray:
        """The position in ``bucket_keys`` of each sample's bucket."""
        found = np.empty(len(self._lengths), dtype=np.int64)
        for b, m in enumerate(self._members):
            found[m] = b
        return found

    def stats(self) -> str:
        """A readable summary: sample and batch counts, and per bucket its key, sample count
        and batch size."""
        lines = [
            f"{type(self).__name__}:",
            f"  sample_num={len(self._lengths)}, batch_num={len(self._batch_infos)}",
            f"  key={self._keys}",
            f"  cnt={[len(m) for m in self._members]}",
            f"  batch_size={self._batch_sizes}",
        ]
        if self._num_shards:
            lines.append(
                f"  num_shards={self._num_shards}, step_num={len(self)}, "
                f"last_group={self._last_group!r}"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.stats()

    def _config(self) -> Dict[str, Any]:
        return {
            "length": len(self._lengths),
            "batch_size": self._batch_size,
            "num_batches": len(self._batch_infos),
            "num_shards": self._num_shards,
            "last_group": self._last_group,
            "shuffle": self._shuffle,
        }
