"""The codecs of the fused path: libjpeg-turbo through ``simplejpeg``, OpenCV for pixels.

Both are optional (the ``vision`` extra; ``INSTALL_HINT`` says how to install it); this is the
one module that imports them, lazily, so ``import shardloader.vision`` works without them and
``available()`` says whether the fused path can run.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional, Tuple

import numpy as np

from .._engine.worker import in_worker_process, launching_worker
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
_launching = threading.local()  # per thread: did _before_fork set the pool


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

    Only a pool that has never run in this process is reconfigured here (a spawned worker,
    a forkserver's, or one forked before OpenCV was imported). A forked worker must never
    touch a pool it inherited: the pool's threads were not forked, and ``cv2.setNumThreads``
    or a parallel call there can wait for them forever. Such a worker got its one thread
    from ``_before_fork`` instead, in the parent, just before the fork."""
    global _threads_settled
    if _threads_settled or not in_worker_process():
        return
    threads = worker_threads()  # a bad SHARDLOADER_CV2_THREADS is raised here, at each batch
    if threads is not None and not _pool_inherited:
        loaded()[1].setNumThreads(threads)
    _threads_settled = True


# Under fork, the parent sets its own pool to one thread just before it forks a loader's
# worker, and back just after: the worker then inherits a pool with no threads, and never
# reconfigures it. Several threads may start workers at once (a train and a val loader, each
# from its prefetching thread): the first to fork saves the parent's count and the last one
# out restores it. In a forked process, whether its pool came from a parent that had
# imported OpenCV.
_fork_lock = threading.Lock()
_forks_in_flight = 0
_count_before_fork: Optional[int] = None
_pool_inherited = False


def _before_fork() -> None:
    global _count_before_fork, _forks_in_flight
    cv2 = sys.modules.get("cv2")
    if cv2 is None or not launching_worker():
        return  # without OpenCV here yet the worker's pool is new: settle_threads sets it
    try:
        threads = worker_threads()
    except ValueError:
        return  # raised in the worker, by settle_threads, where it reaches the user
    # A count above one cannot be inherited safely (a pool of threads that are not forked).
    if threads is None or threads > 1:
        return
    with _fork_lock:
        if _forks_in_flight == 0:
            _count_before_fork = cv2.getNumThreads()
        _forks_in_flight += 1
        cv2.setNumThreads(threads)
    _launching.pool_set = True


def _after_fork_in_parent() -> None:
    global _count_before_fork, _forks_in_flight
    if not getattr(_launching, "pool_set", False):
        return
    _launching.pool_set = False
    with _fork_lock:
        _forks_in_flight -= 1
        if _forks_in_flight == 0 and _count_before_fork is not None:
            sys.modules["cv2"].setNumThreads(_count_before_fork)
            _count_before_fork = None


def _after_fork_in_child() -> None:
    global _count_before_fork, _fork_lock, _forks_in_flight, _pool_inherited, _threads_settled
    # A pool inherited from a process that had imported OpenCV is never touched again: set
    # by _before_fork, or of unknown state. Without OpenCV, the first one here is new. The
    # lock may have been held by another of the parent's threads: this process gets its own.
    _pool_inherited = "cv2" in sys.modules
    _threads_settled = False
    _fork_lock, _forks_in_flight, _count_before_fork = threading.Lock(), 0, None
    _launching.pool_set = False


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)


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
