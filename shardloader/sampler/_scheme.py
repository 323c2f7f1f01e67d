"""Bucket schemes: how ``FixedBucketSampler`` picks its bucket keys from the lengths.

A scheme maps ``(max_lengths, min_lengths, num_buckets)`` to ``num_buckets`` keys. For tuple
lengths (several sequences per sample) it is applied to each position on its own and the
results are zipped into tuple keys. The largest key always equals the largest length, so
every sample fits some bucket.
"""

from __future__ import annotations

import abc
import math
import numbers
from typing import Any, List, Sequence, Tuple, Union, cast

import numpy as np

from .._validate import check_int

__all__ = ["BucketScheme", "ConstWidthBucket", "LinearWidthBucket", "ExpWidthBucket"]

Key = Union[int, Tuple[int, ...]]


def _is_scalar(value: Any) -> bool:
    return np.ndim(value) == 0


class BucketScheme(abc.ABC):
    """Base class of the bucket schemes; subclasses define ``keys_1d``.

    Examples
    --------
    >>> class Halving(BucketScheme):
    ...     def keys_1d(self, max_length, min_length, num_buckets):
    ...         return [max(max_length >> k, min_length) for k in range(num_buckets)]
    >>> Halving()((64, 8), (1, 2), 3)
    [(64, 8), (32, 4), (16, 2)]
    """

    def __call__(
        self,
        max_lengths: Union[int, Sequence[int]],
        min_lengths: Union[int, Sequence[int]],
        num_buckets: int,
    ) -> List[Key]:
        """The bucket keys: ints for int lengths, tuples for tuple lengths.

        Parameters
        ----------
        max_lengths : int or sequence of int
            The largest length (per position, for tuple lengths).
        min_lengths : int or sequence of int
            The smallest length (per position, for tuple lengths).
        num_buckets : int
            How many keys to make.
        """
        num_buckets = check_int("num_buckets", num_buckets, minimum=1)
        if _is_scalar(max_lengths):  # an int, or a numpy one
            highest, lowest = cast(int, max_lengths), cast(int, min_lengths)
            return list(self.keys_1d(int(highest), int(lowest), num_buckets))
        highs, lows = cast(Sequence[int], max_lengths), cast(Sequence[int], min_lengths)
        if len(highs) != len(lows):
            raise ValueError(
                f"max_lengths and min_lengths must have the same size, got {len(highs)} "
                f"and {len(lows)}"
            )
        columns = [self.keys_1d(int(hi), int(lo), num_buckets) for hi, lo in zip(highs, lows)]
        return [tuple(key) for key in zip(*columns)]

    @abc.abstractmethod
    def keys_1d(self, max_length: int, min_length: int, num_buckets: int) -> List[int]:
        """``num_buckets`` keys between ``min_length`` and ``max_length`` for int lengths."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ConstWidthBucket(BucketScheme):
    """Buckets of equal width: ``max(1, (max - min + 1) // num_buckets)``.

    Keys step down from the largest length by that width and stop at the smallest length.

    Examples
    --------
    >>> ConstWidthBucket()(20, 1, 4)
    [20, 15, 10, 5]
    >>> ConstWidthBucket()((20, 8), (1, 5), 2)
    [(20, 8), (10, 6)]
    """

    def keys_1d(self, max_length: int, min_length: int, num_buckets: int) -> List[int]:
        width = max((max_length - min_length + 1) // num_buckets, 1)
        return [max(max_length - k * width, min_length) for k in range(num_buckets)]


class LinearWidthBucket(BucketScheme):
    """Buckets whose width grows linearly: bucket ``i`` (from 1) is ``alpha * i + 1`` wide.

    ``alpha = 2 * (max - min - num_buckets) / (num_buckets * (num_buckets + 1))``, so the
    widths add up to ``max - min`` and the keys run from just above the smallest length to the
    largest.

    Examples
    --------
    >>> LinearWidthBucket()(100, 10, 4)
    [20, 38, 65, 100]
    """

    def keys_1d(self, max_length: int, min_length: int, num_buckets: int) -> List[int]:
        n = num_buckets
        alpha = 2.0 * (max_length - min_length - n) / (n * (n + 1))
        keys = [int(round(min_length + alpha * ((k + 1) * (k + 2) / 2) + k + 1)) for k in range(n)]
        keys[-1] = max(keys[-1], max_length)
        return keys


class ExpWidthBucket(BucketScheme):
    """Buckets whose width grows geometrically: each is ``bucket_len_step`` times the last.

    Parameters
    ----------
    bucket_len_step : float, default 1.1
        The growth factor of the width; must be greater than 1.

    Examples
    --------
    >>> ExpWidthBucket(2.0)(16, 1, 4)
    [2, 4, 8, 16]
    """

    def __init__(self, bucket_len_step: float = 1.1) -> None:
        if isinstance(bucket_len_step, bool) or not isinstance(bucket_len_step, numbers.Real):
            raise TypeError(
                f"bucket_len_step must be a number greater than 1, got {bucket_len_step!r}"
            )
        if not bucket_len_step > 1:
            raise ValueError(
                f"bucket_len_step must be a number greater than 1, got {bucket_len_step!r}"
            )
        self.bucket_len_step: float = float(bucket_len_step)

    def keys_1d(self, max_length: int, min_length: int, num_buckets: int) -> List[int]:
        step = self.bucket_len_step
        first = (max_length - min_length) * (step - 1) / (math.pow(step, num_buckets) - 1)
        keys = [
            int(round(min_length + first * (math.pow(step, k + 1) - 1) / (step - 1)))
            for k in range(num_buckets)
        ]
        keys[-1] = max(keys[-1], max_length)
        return keys

    def __repr__(self) -> str:
        return f"ExpWidthBucket(bucket_len_step={self.bucket_len_step!r})"
