"""A tiny dataset factory for ``shardloader bench --dataset tests/bench_factory.py:make``."""

from __future__ import annotations

import numpy as np
from mxnet.gluon.data import ArrayDataset


def make(size: int = 160) -> ArrayDataset:
    """``size`` samples of 16 float32 features with a label in ``range(4)``."""
    rng = np.random.default_rng(0)
    features = rng.standard_normal((size, 16)).astype(np.float32)
    return ArrayDataset(features, (np.arange(size) % 4).astype(np.int32))
