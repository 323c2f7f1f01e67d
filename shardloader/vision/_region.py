"""Decoding only the crop: libjpeg-turbo's region decode, built from ``_region.c``.

A random crop reads part of an image (W5's ``RandomResizedCrop(224)`` a little under half
of each 320x256 JPEG, on average), yet a full decode computes every pixel. libjpeg-turbo
can skip the rows above a region, decode only the columns that hold it, and stop below it;
no Python package exposes that, so ``_region.c`` does, built by ``_native`` with the
system's C compiler against the system's libjpeg-turbo (its headers: Debian's
``libjpeg-dev``), once, into a cache folder, and called through ``ctypes``.

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
from typing import Optional, Tuple

import numpy as np

from ._native import Library

ENV = "SHARDLOADER_REGION_DECODE"
MARGIN = 2  # pixels around the crop: beyond the reach of the edge of chroma upsampling

LIBRARY = Library(
    "_region",
    "region_decode",
    ENV,
    ["jpeg"],
    [
        (
            "sl_decode_region",
            ctypes.c_int,
            [
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
            ],
        )
    ],
    "a C compiler and libjpeg-turbo's headers",
)


def available(build: bool = False) -> bool:
    """Whether region decode can run here (``_native.Library.available``)."""
    return LIBRARY.available(build)


def why_unavailable() -> Optional[str]:
    """Why ``available()`` is False (``_native.Library.why_unavailable``)."""
    return LIBRARY.why_unavailable()


def region_decode() -> str:
    """Whether the fused path decodes only the crop's region here: ``"on"``, or ``"off: "``
    and why (no C compiler, no libjpeg-turbo headers, ``SHARDLOADER_REGION_DECODE=0``).

    Builds it if it is not built yet, as making a fused pipeline does (docs/vision.md,
    "Decoding only the crop"). The pixels are the same either way; only the CPU time per
    image differs.

    Returns
    -------
    str
        ``"on"`` or ``"off: <reason>"``.
    """
    return LIBRARY.status()


def decode(
    data: bytes, flag: int, size: Tuple[int, int], box: Tuple[int, int, int, int], out: np.ndarray
) -> None:
    """Decode the part of a JPEG of ``size`` (height, width) that ``box`` (x0, y0, width,
    height) and ``MARGIN`` cover into ``out`` (uint8, full size, HWC, C-contiguous), at its
    place. Raises ``ValueError`` (libjpeg's message) for bytes libjpeg refuses or warns
    about; the caller then decodes the whole image as before."""
    function = LIBRARY.function("sl_decode_region")
    if function is None:
        raise ValueError(f"region decode is unavailable: {why_unavailable() or 'not loaded'}")
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
