"""The demo's dataset: procedurally drawn shapes, packed into RecordIO and cached.

Nothing is downloaded. ``generate_shapes`` draws the images from a fixed seed, so every
machine gets the same pixels, and ``prepare`` packs them with
``shardloader.recordio.pack_images`` into a cache directory that later runs reuse. A small
``manifest.json``, written last, records what the cache holds; a missing file, a changed size
or a different format version makes ``prepare`` rebuild it. The cache must be a folder of the
user's own that others cannot write to (``demo_state.check_own_folder``), and every file is
written under an unpredictable name, created exclusively, then moved into place.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List, Tuple

import numpy as np

from .demo_state import make_own_folder

__all__ = ["CLASSES", "IMAGE_SIZE", "DATA_SEED", "generate_shapes", "prepare", "DemoData"]

CLASSES = ("circle", "square", "triangle", "cross", "horizontal bar", "vertical bar")
IMAGE_SIZE = 32
# The pixels depend on this seed only, not on the training --seed, so one cache serves all runs.
DATA_SEED = 20240607
# Bump when the drawing or the file layout changes: old caches are then rebuilt.
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
_SPLITS = ("train", "test")


class DemoData(Dict[str, Any]):
    """Where the demo's RecordIO files are: ``data["train"]`` and ``data["test"]`` are
    ``.rec`` paths; ``data.rebuilt`` says whether this call wrote them."""

    rebuilt: bool = False


def _draw(kind: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """A boolean mask of one shape of class ``kind`` at a random position and scale."""
    radius = rng.uniform(5.5, 11.0)
    margin = int(np.ceil(radius)) + 1
    cy, cx = rng.uniform(margin, size - margin, size=2)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    dy, dx = y - cy, x - cx
    thick = max(1.5, radius / 3.5)
    if kind == 0:  # circle
        return dx * dx + dy * dy <= radius * radius
    if kind == 1:  # square
        half = radius * 0.85
        return (np.abs(dx) <= half) & (np.abs(dy) <= half)
    if kind == 2:  # triangle, apex up: the half-width grows from 0 at the top to radius
        rows = (dy + radius) / (2 * radius)
        return (rows >= 0) & (rows <= 1) & (np.abs(dx) <= rows * radius)
    if kind == 3:  # cross
        horizontal = (np.abs(dy) <= thick / 2) & (np.abs(dx) <= radius)
        vertical = (np.abs(dx) <= thick / 2) & (np.abs(dy) <= radius)
        return horizontal | vertical
    if kind == 4:  # horizontal bar
        return (np.abs(dy) <= thick / 2 + 0.5) & (np.abs(dx) <= radius)
    return (np.abs(dx) <= thick / 2 + 0.5) & (np.abs(dy) <= radius)  # vertical bar


def generate_shapes(
    count: int, seed: int = DATA_SEED, size: int = IMAGE_SIZE
) -> Tuple[np.ndarray, np.ndarray]:
    """Draw ``count`` labelled images of coloured shapes on noisy backgrounds.

    Each image shows one shape of ``CLASSES`` with a random position, size and colour,
    over a random dark background with Gaussian pixel noise. Classes are balanced and in
    random order. The result depends only on the arguments.

    Parameters
    ----------
    count : int
        Number of images.
    seed : int, default DATA_SEED
        Seed of the drawing (a ``numpy.random.Generator``; the global RNG is untouched).
    size : int, default 32
        Height and width in pixels.

    Returns
    -------
    images : numpy.ndarray
        ``uint8`` array of shape ``(count, size, size, 3)`` (HWC, RGB).
    labels : numpy.ndarray
        ``int32`` array of shape ``(count,)`` with values in ``range(len(CLASSES))``.

    Examples
    --------
    >>> images, labels = generate_shapes(12, seed=1)
    >>> images.shape, images.dtype, sorted(set(labels.tolist()))
    ((12, 32, 32, 3), dtype('uint8'), [0, 1, 2, 3, 4, 5])
    """
    if count < 0:
        raise ValueError(f"count must be non-negative, got {count}")
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(count) % len(CLASSES)).astype(np.int32)
    images = np.empty((count, size, size, 3), dtype=np.uint8)
    for i, kind in enumerate(labels):
        background = rng.uniform(0, 90, size=3)
        # A bright colour keeps the shape visible on any background: one channel is high.
        colour = rng.uniform(60, 255, size=3)
        colour[rng.integers(3)] = rng.uniform(190, 255)
        pixels = np.empty((size, size, 3), dtype=np.float32)
        pixels[:] = background
        pixels[_draw(int(kind), size, rng)] = colour
        pixels += rng.normal(0.0, 12.0, size=pixels.shape)
        images[i] = np.clip(pixels, 0, 255).astype(np.uint8)
    return images, labels


def image_format() -> str:
    """How the demo encodes its images: JPEG, which the fused image path decodes in the
    workers (``shardloader.vision``), where the ``vision`` extra is installed; else PNG,
    which MXNet decodes without it."""
    from ..vision import available

    return ".jpg" if available() else ".png"


def _expected(train_size: int, test_size: int) -> Dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "image_format": image_format(),
        "data_seed": DATA_SEED,
        "image_size": IMAGE_SIZE,
        "classes": list(CLASSES),
        "sizes": {"train": train_size, "test": test_size},
    }


def _files(cache_dir: str, split: str) -> List[str]:
    return [os.path.join(cache_dir, f"{split}.rec"), os.path.join(cache_dir, f"{split}.idx")]


def _cache_is_valid(cache_dir: str, expected: Dict[str, Any]) -> bool:
    """Whether the manifest matches ``expected`` and every file it lists has its size."""
    try:
        with open(os.path.join(cache_dir, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return False
    if {k: manifest.get(k) for k in expected} != expected:
        return False
    sizes = manifest.get("file_bytes", {})
    paths = [p for split in _SPLITS for p in _files(cache_dir, split)]
    return all(
        os.path.isfile(p) and os.path.getsize(p) == sizes.get(os.path.basename(p)) for p in paths
    )


def prepare(
    cache_dir: str, train_size: int = 4000, test_size: int = 800, progress: bool = True
) -> DemoData:
    """Make sure ``cache_dir`` holds the demo's ``train`` and ``test`` RecordIO files.

    Reuses them when the manifest says they match ``train_size`` and ``test_size`` and the
    current format; otherwise draws the images and packs them again.

    Parameters
    ----------
    cache_dir : str
        Directory of the cache; created if missing.
    train_size, test_size : int
        Number of training and held-out images.
    progress : bool, default True
        Show ``tqdm`` progress bars while packing.

    Returns
    -------
    DemoData
        ``{"train": path, "test": path}`` to the ``.rec`` files, with ``rebuilt`` set.

    Raises
    ------
    demo_state.UnsafeFolder
        When ``cache_dir`` is not the user's own, or others can write to it.
    """
    from ..recordio import pack_images

    make_own_folder(cache_dir, "cache folder")
    expected = _expected(train_size, test_size)
    data = DemoData(train=_files(cache_dir, "train")[0], test=_files(cache_dir, "test")[0])
    if _cache_is_valid(cache_dir, expected):
        return data
    manifest_path = os.path.join(cache_dir, MANIFEST)
    if os.path.exists(manifest_path):
        os.remove(manifest_path)  # stale: it must not vouch for a half-written cache
    file_bytes = {}
    # Distinct seeds per split, so the held-out images are not copies of training ones.
    for offset, split in enumerate(_SPLITS):
        images, labels = generate_shapes(expected["sizes"][split], seed=DATA_SEED + offset)
        rec, idx = pack_images(
            data[split], images, labels, img_fmt=expected["image_format"], progress=progress
        )
        for path in (rec, idx):
            file_bytes[os.path.basename(path)] = os.path.getsize(path)
    # An unpredictable name, created exclusively: a link planted in the folder is not followed.
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", suffix=".tmp", dir=cache_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({**expected, "file_bytes": file_bytes}, f, indent=1)
        os.replace(tmp, manifest_path)
    except BaseException:
        os.unlink(tmp)
        raise
    data.rebuilt = True
    return data
