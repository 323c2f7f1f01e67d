"""Decoding only the crop: libjpeg-turbo's region decode, built from ``_region.c``.

A random crop reads part of an image (W5's ``RandomResizedCrop(224)`` a little under half
of each 320x256 JPEG, on average), yet a full decode computes every pixel. libjpeg-turbo
can skip the rows above a region, decode only the columns that hold it, and stop below it;
no Python package exposes that, so this module compiles ``_region.c`` with the system's C
compiler against the system's libjpeg-turbo (its headers: Debian's ``libjpeg-dev``), once,
into a cache folder, and calls it through ``ctypes`` (which releases the GIL).

It is optional: without a compiler or the headers, or with ``SHARDLOADER_REGION_DECODE=0``,
``available()`` is False, ``why_unavailable()`` says why, and the fused path decodes whole
images as before. The pixels are the same either way: the region is widened by ``MARGIN``
pixels on every side (the chroma upsampling's edge effect reaches one pixel: one is enough
on every kind of JPEG tested, none is not), so that the decoded area's edges, where
fancy upsampling lacks a neighbour, fall outside the crop (docs/vision.md, "Decoding only
the crop", gives the measurements).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from typing import Optional, Tuple

import numpy as np

ENV = "SHARDLOADER_REGION_DECODE"
MARGIN = 2  # pixels around the crop: beyond the reach of the edge of chroma upsampling
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_region.c")
_COMPILE_TIMEOUT_S = 60.0

_lock = threading.Lock()
_function: Optional[ctypes._CFuncPtr] = None  # type: ignore[name-defined]
_reason: Optional[str] = None  # why there is no function (None: not tried yet)


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shardloader")


@functools.lru_cache(maxsize=None)
def _target() -> str:
    """The built library's path: the cache folder, named by the source's hash."""
    with open(_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read() + sys.platform.encode()).hexdigest()[:16]
    return os.path.join(_cache_dir(), f"region-{digest}.so")


def _compile(target: str) -> Optional[str]:
    """Build ``_region.c`` into ``target``; ``None``, or why it could not."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd, temporary = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
    os.close(fd)
    command = [
        os.environ.get("CC", "cc"),
        "-O2",
        "-shared",
        "-fPIC",
        "-o",
        temporary,
        _SOURCE,
        "-ljpeg",
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        os.unlink(temporary)
        return f"the C compiler could not run ({exc})"
    if done.returncode != 0:
        os.unlink(temporary)
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"compiling it failed ({last}); it needs a C compiler and libjpeg-turbo's headers"
    os.replace(temporary, target)  # atomic: another process may be building it too
    return None


def _load(build: bool) -> None:
    global _function, _reason
    if os.environ.get(ENV, "").strip() == "0":
        _reason = f"{ENV}=0"
        return
    try:
        target = _target()
    except OSError as exc:  # an install without the C source
        _reason = f"its source is missing ({exc})"
        return
    if not os.path.exists(target):
        if not build:
            return  # not built yet: asked again later (a loader builds it)
        try:
            failed = _compile(target)
        except OSError as exc:
            failed = f"its cache folder is not writable ({exc})"
        if failed is not None:
            _reason = failed
            return
    # Its libjpeg calls bind to the libjpeg it was linked against, not to another copy of
    # those symbols already in the process (MXNet's own library exports a libjpeg).
    mode = os.RTLD_LOCAL | getattr(os, "RTLD_DEEPBIND", 0)
    try:
        library = ctypes.CDLL(target, mode=mode)
    except OSError as exc:
        _reason = f"loading it failed ({exc})"
        return
    function = library.sl_decode_region
    function.restype = ctypes.c_int
    function.argtypes = [
        ctypes.c_void_p,  # data
        ctypes.c_ulong,  # size
        ctypes.c_int,  # grey
        ctypes.c_int,  # x0
        ctypes.c_int,  # y0
        ctypes.c_int,  # x1
        ctypes.c_int,  # y1
        ctypes.c_void_p,  # out
        ctypes.c_int,  # width
        ctypes.c_int,  # height
        ctypes.c_int,  # channels
        ctypes.c_char_p,  # message
        ctypes.c_int,  # message size
    ]
    _function = function


def available(build: bool = False) -> bool:
    """Whether region decode can run here: found built, or built now if ``build``, and
    loaded. The loader asks with ``build=True`` in its main process, once, before its
    workers start (building takes a fraction of a second); a worker only loads what the
    main process built, so a machine without a compiler pays for one failed build, not one
    per worker. The answer is kept for the process."""
    if _function is None and _reason is None:
        with _lock:
            if _function is None and _reason is None:
                _load(build)
    return _function is not None


def why_unavailable() -> Optional[str]:
    """Why ``available()`` is False: ``None`` when it is True, or when it was only looked
    for, not built (no loader has asked with ``build=True`` in this process)."""
    return _reason


def region_decode() -> str:
    """Whether the fused path decodes only the crop's region here: ``"on"``, or ``"off: "``
    and why (no C compiler, no libjpeg-turbo headers, ``SHARDLOADER_REGION_DECODE=0``).

    Builds it if it is not built yet, as the first fused loader does (docs/vision.md,
    "Decoding only the crop"). The pixels are the same either way; only the CPU time per
    image differs.

    Returns
    -------
    str
        ``"on"`` or ``"off: <reason>"``.
    """
    if available(build=True):
        return "on"
    return f"off: {_reason}"


def decode(
    data: bytes, flag: int, size: Tuple[int, int], box: Tuple[int, int, int, int], out: np.ndarray
) -> None:
    """Decode the part of a JPEG of ``size`` (height, width) that ``box`` (x0, y0, width,
    height) and ``MARGIN`` cover into ``out`` (uint8, full size, HWC, C-contiguous), at its
    place. Raises ``ValueError`` (libjpeg's message) for bytes libjpeg refuses or warns
    about; the caller then decodes the whole image as before."""
    function = _function
    if function is None:
        raise ValueError(f"region decode is unavailable: {_reason or 'not loaded'}")
    height, width = size
    x0, y0, w, h = box
    if out.shape[:2] != (height, width) or not out.flags.c_contiguous:
        raise ValueError(f"region decode needs a full-size buffer, got {out.shape}")
    encoded = np.frombuffer(data, np.uint8)  # no copy, whatever buffer holds the bytes
    message = ctypes.create_string_buffer(200)
    failed = function(
        encoded.ctypes.data,
        encoded.size,
        0 if flag else 1,
        max(0, x0 - MARGIN),
        max(0, y0 - MARGIN),
        min(width, x0 + w + MARGIN),
        min(height, y0 + h + MARGIN),
        out.ctypes.data,
        width,
        height,
        out.shape[2],
        message,
        len(message),
    )
    if failed:
        raise ValueError(message.value.decode(errors="replace") or "region decode failed")
