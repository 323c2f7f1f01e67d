"""Per-thread uint8 buffers that the fused path reuses from image to image.

Each use has its own name (``"decoded"``: the full-size image a region decode fills;
``"flipped"``, ``"planes"``: OpenCV's way of writing an image into the batch), since one
image may hold two of them at once. A buffer grows to the largest image its thread has seen,
up to ``KEEP_BYTES``: a larger request gets an array of its own, so that one huge image
leaves no such buffer behind in every worker.
"""

from __future__ import annotations

import threading
from typing import Tuple

import numpy as np

KEEP_BYTES = 16 << 20

_local = threading.local()


def buffer(name: str, shape: Tuple[int, ...]) -> np.ndarray:
    """This thread's uint8 buffer ``name``, as a C-contiguous array of ``shape``; its
    contents are whatever the last use left."""
    count = 1
    for size in shape:
        count *= size
    if count > KEEP_BYTES:
        return np.empty(shape, np.uint8)
    kept = getattr(_local, name, None)
    if kept is None or kept.size < count:
        kept = np.empty(count, np.uint8)
        setattr(_local, name, kept)
    return kept[:count].reshape(shape)
