"""The fused path's output stage: a rendered image, with its flips, into its place in the
batch.

``ImagePipeline.render`` leaves the flips to this write (steps that ``fold_into_write``):
flipping while writing costs nothing extra, where flipping first copies the image once more.

- ``hwc``: uint8 HWC, as decoded (``output="hwc"``): OpenCV flips while it copies.
- ``planes``: CHW planes, uint8 or through the pipeline's ToTensor and Normalize table
  (``lut[c, v]``). ``_write.c`` does it in one pass (flip, split, lookup) where it is built
  (``_native``); otherwise OpenCV flips into a per-thread buffer, splits it into planes and
  maps each plane through its table, with the same results.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import numpy as np

from . import _codecs, _scratch
from ._native import Library

#: Which flips the write makes: (left-right, top-bottom).
Flips = Tuple[bool, bool]

LIBRARY = Library(
    "_write",
    "write",
    "SHARDLOADER_NATIVE_WRITE",
    [],
    [
        (
            "sl_planes",
            ctypes.c_int,
            [
                ctypes.c_void_p,  # src
                ctypes.c_int,  # height
                ctypes.c_int,  # width
                ctypes.c_int,  # channels
                ctypes.c_long,  # row stride, bytes
                ctypes.c_int,  # flip_x
                ctypes.c_int,  # flip_y
                ctypes.c_void_p,  # table, or NULL for uint8 output
                ctypes.c_void_p,  # out
            ],
        )
    ],
    "a C compiler",
)


def hwc(pixels: np.ndarray, flips: Flips, out: np.ndarray) -> None:
    """``pixels`` (uint8 HWC, ``out``'s shape) into ``out``, flipped as ``flips`` say."""
    flip_x, flip_y = flips
    if flip_x or flip_y:
        cv2 = _codecs.loaded()[1]
        code = -1 if flip_x and flip_y else (1 if flip_x else 0)
        one = pixels.shape[2] == 1
        cv2.flip(pixels[:, :, 0] if one else pixels, code, dst=out[:, :, 0] if one else out)
    else:
        np.copyto(out, pixels)


def planes(pixels: np.ndarray, flips: Flips, out: np.ndarray, lut: Optional[np.ndarray]) -> None:
    """``pixels`` (uint8 HWC) into ``out`` (C-contiguous CHW of the same height and width),
    flipped as ``flips`` say, through ``lut[c]`` per channel if given (``out`` uint8
    otherwise)."""
    if _native_planes(pixels, flips, out, lut):
        return
    if flips[0] or flips[1]:
        flipped = _scratch.buffer("flipped", pixels.shape)
        hwc(pixels, flips, flipped)
        pixels = flipped
    _split(pixels, out, lut)


def _native_planes(
    pixels: np.ndarray, flips: Flips, out: np.ndarray, lut: Optional[np.ndarray]
) -> bool:
    """``planes`` by ``_write.c``; False, having written nothing, where it does not apply
    (not built, another dtype, pixels not contiguous within a row)."""
    if not LIBRARY.available():
        return False
    height, width, channels = pixels.shape
    if pixels.strides[1:] != (channels, 1) or not out.flags.c_contiguous:
        return False
    if lut is None:
        if out.dtype != np.uint8:
            return False
        table = None
    else:
        fits = out.dtype == np.float32 and lut.dtype == np.float32 and lut.flags.c_contiguous
        if not fits or lut.shape != (channels, 256):
            return False
        table = lut.ctypes.data
    function = LIBRARY.function("sl_planes")
    flip_x, flip_y = flips
    args = (pixels.ctypes.data, height, width, channels, pixels.strides[0], flip_x, flip_y)
    return function(*args, table, out.ctypes.data) == 0


def _split(pixels: np.ndarray, out: np.ndarray, lut: Optional[np.ndarray]) -> None:
    """OpenCV's way: split the image into contiguous planes in one pass and map each through
    its table (measured fastest of numpy's take, arithmetic and per-pixel tables:
    docs/design.md, "Image decoding")."""
    cv2 = _codecs.loaded()[1]
    channels = pixels.shape[2]
    if lut is None:
        if channels == 1:
            out[0] = pixels[:, :, 0]
        else:
            cv2.split(pixels, list(out))
        return
    if channels == 1:
        split = [pixels[:, :, 0]]
    else:
        planes = _scratch.buffer("planes", (channels,) + pixels.shape[:2])
        split = cv2.split(pixels, list(planes))
    for c, plane in enumerate(split):
        table = lut[c].reshape(1, 256)
        if out.dtype == np.float32:
            cv2.LUT(plane, table, dst=out[c])
        else:
            np.copyto(out[c], cv2.LUT(plane, table), casting="unsafe")
