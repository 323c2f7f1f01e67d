"""The codecs of the fused path: libjpeg-turbo through ``simplejpeg``, OpenCV for pixels.

Both are optional (the ``vision`` extra; ``INSTALL_HINT`` says how to install it); this is the
one module that imports them, lazily, so ``import shardloader.vision`` works without them and
``available()`` says whether the fused path can run.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

import numpy as np

from .._engine.worker import in_worker_process
from .._extras import install_hint, missing_extra
from ..recordio import _imagesize

INSTALL_HINT = install_hint("vision")

# libjpeg-turbo cannot turn these into RGB; MXNet's decoder (OpenCV) can.
_UNFUSED_COLORSPACES = ("CMYK", "YCCK")

_modules: Optional[Tuple[Any, Any]] = None

# OpenCV's threads in each worker process (docs/vision.md, "Threads in the workers").
THREADS_ENV = "SHARDLOADER_CV2_THREADS"
_WORKER_THREADS = 1
_threads_settled = False


def modules() -> Optional[Tuple[Any, Any]]:
    """``(simplejpeg, cv2)``, or ``None`` if either is missing."""
    global _modules
    if _modules is None:
        try:
            import cv2
            import simplejpeg
        except ImportError:
            return None
        _modules = (simplejpeg, cv2)
    return _modules


def loaded() -> Tuple[Any, Any]:
    """``(simplejpeg, cv2)``; an ``ImportError`` that says how to install them if missing."""
    found = modules()
    if found is None:
        raise missing_extra("vision", "the fused image path (simplejpeg and OpenCV)")
    return found


def available() -> bool:
    """Whether the fused image path can run: ``simplejpeg`` and ``cv2`` both import.

    Returns
    -------
    bool
        ``False`` when the ``vision`` extra is missing (``INSTALL_HINT`` says how to install it);
        every loader then takes the exact path, as it would without this package.
    """
    return modules() is not None


def worker_threads() -> Optional[int]:
    """The ``cv2.setNumThreads`` value for worker processes: ``SHARDLOADER_CV2_THREADS`` if
    set (``keep``: OpenCV's own choice, ``None``), else 1. A ``ValueError`` names the
    variable and what it accepts."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return _WORKER_THREADS
    if value.lower() == "keep":
        return None
    try:
        threads = int(value)
    except ValueError:
        threads = -1
    if threads < 0:
        raise ValueError(
            f"{THREADS_ENV} must be a whole number of OpenCV threads per worker process "
            f"(0 or 1: none besides the worker's own) or 'keep' (OpenCV's own pool); "
            f"got {value!r}"
        )
    return threads


def settle_threads() -> None:
    """In a loader's worker process, once: limit OpenCV's thread pool to ``worker_threads()``
    (1 unless ``SHARDLOADER_CV2_THREADS`` says otherwise). Each worker already keeps a core
    busy; OpenCV's own pool (one thread per core) in every worker oversubscribes the cores
    as soon as anything else runs. Thread workers and the training process are left as they
    are: ``cv2.setNumThreads`` is process-wide, and that process is the user's.

    A worker forked from a process whose pool had run already must not touch it: the pool's
    threads were not forked, and ``cv2.setNumThreads`` would wait for them forever. OpenCV
    then runs that worker's calls on the calling thread. So a first parallel call shows
    which case this is: set the count only if that call started threads of this process."""
    global _threads_settled
    if _threads_settled or not in_worker_process():
        return
    threads = worker_threads()
    if threads is not None and _starts_own_pool(loaded()[1]):
        loaded()[1].setNumThreads(threads)
    _threads_settled = True


def _thread_count() -> Optional[int]:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: no way to tell, so OpenCV's pool is left as it is
        return None


def _starts_own_pool(cv2: Any) -> bool:
    """Whether a parallel OpenCV call (a resize large enough to split over the pool) started
    threads in this process: then the pool is this process's own, safe to reconfigure."""
    before = _thread_count()
    if before is None or cv2.getNumThreads() <= 1:
        return False
    cv2.resize(np.zeros((2000, 2000), np.uint8), (1000, 1000))
    after = _thread_count()
    return after is not None and after > before


def jpeg_size(data: Any) -> Optional[Tuple[int, int]]:
    """``(height, width)`` of a JPEG libjpeg-turbo can decode to RGB or grey, from its header
    alone; ``None`` for anything else (PNG, CMYK, bytes that are not a JPEG). The caller
    checks it against the size limit (``recordio._imagesize.too_large``) before decoding."""
    simplejpeg = loaded()[0]
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except (ValueError, TypeError):
        return None
    if colorspace in _UNFUSED_COLORSPACES or height <= 0 or width <= 0:
        return None
    return int(height), int(width)


def decode_jpeg(data: Any, flag: int, min_size: Optional[Tuple[int, int]] = None) -> np.ndarray:
    """Decode a JPEG to uint8 HWC (3 channels RGB for ``flag=1``, 1 grey for ``flag=0``).

    The accurate IDCT and upsampling give the very pixels MXNet's decoder gives (measured:
    docs/design.md, "Image decoding"). ``min_size=(height, width)`` lets libjpeg-turbo decode
    at a reduced scale (1/2, 1/4, 1/8, ...) no smaller than that. Raises ``ValueError`` for
    bytes it cannot decode.
    """
    simplejpeg = loaded()[0]
    min_height, min_width = min_size if min_size is not None else (0, 0)
    pixels = simplejpeg.decode_jpeg(
        data,
        colorspace="RGB" if flag else "GRAY",
        fastdct=False,
        fastupsample=False,
        min_height=int(min_height),
        min_width=int(min_width),
    )
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return pixels


def decode_exact(data: Any, flag: int, where: str = "the image") -> np.ndarray:
    """Decode with MXNet's own decoder (``mx.image.imdecode``) to uint8 HWC numpy: PNG,
    CMYK and whatever libjpeg-turbo refused. Raises ``MXNetError`` as Gluon would, and
    ``ImageTooLarge`` (naming ``where``) before decoding an image whose header declares more
    pixels than the limit (``recordio._imagesize``)."""
    import mxnet as mx

    why = _imagesize.refusal(data)
    if why is not None:
        raise _imagesize.ImageTooLarge(f"{where} {why}")

    image = mx.image.imdecode(data, flag)
    image.wait_to_read()  # decoding errors surface only when the result is awaited
    return image.asnumpy()
