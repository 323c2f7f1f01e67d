"""What ``ShardedDataLoader.stats()`` reports: counters updated a few attribute writes per
batch, and the byte count of a batch."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

import numpy as np

from .nest import leaves

__all__ = ["Stats", "batch_nbytes"]


class Stats:
    """Counters the loader keeps for ``ShardedDataLoader.stats``. Updating them costs
    a few attribute writes per batch."""

    def __init__(self) -> None:
        # Which path images take ('fused', 'exact' or 'exact: <why>'), set when the loader
        # puts its data path together; not a counter, so reset() keeps it.
        self.image_path = "exact"
        self.reset()

    def reset(self) -> None:
        self.batches = 0
        self.bytes = 0
        self.wait_s = 0.0
        self.first_batch_s: Optional[float] = None
        # Set when the consumer first asks for a batch, so start-up counts as waiting.
        self.started: Optional[float] = None
        self.worker_busy_s: Dict[int, float] = {}
        self.max_reorder_depth = 0
        self.reorder_depth = 0
        # Samples the batch sampler repeated to fill a step; the sampler adds to it.
        self.repeated_samples = 0

    def snapshot(self) -> Dict[str, Any]:
        started = self.started if self.started is not None else time.perf_counter()
        wall = max(time.perf_counter() - started, 1e-9)
        return {
            "batches": self.batches,
            "bytes": self.bytes,
            "wait_s": self.wait_s,
            "wall_s": wall,
            "data_stall": min(1.0, self.wait_s / wall),
            "first_batch_s": self.first_batch_s,
            "worker_busy_s": dict(self.worker_busy_s),
            "reorder_depth": self.reorder_depth,
            "max_reorder_depth": self.max_reorder_depth,
            "repeated_samples": self.repeated_samples,
            "image_path": self.image_path,
        }


def batch_nbytes(batch: Any) -> int:
    """Bytes of every array leaf in a batch (a sparse array counts its stored values)."""
    return sum(_leaf_nbytes(leaf) for leaf in leaves(batch))


def _leaf_nbytes(leaf: Any) -> int:
    if getattr(leaf, "stype", "default") != "default":
        return _leaf_nbytes(leaf.data)
    size = getattr(leaf, "size", None)
    dtype = getattr(leaf, "dtype", None)
    if size is None or dtype is None:
        return 0
    try:
        return int(size) * np.dtype(dtype).itemsize
    except (TypeError, NotImplementedError):
        return 0
