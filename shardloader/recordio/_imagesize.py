"""An encoded image's declared size, read from its header, and the limit on it.

A decoder allocates what an image's header declares before it reads a single pixel: a few
kilobytes that declare 30000x30000 pixels cost gigabytes and a minute of decoding, and then
fail or not. So shardloader reads the size from the header first (a few microseconds, no
allocation) and refuses an image above ``SHARDLOADER_MAX_IMAGE_PIXELS`` pixels (by default
178,956,970, Pillow's ``DecompressionBombError`` threshold: twice its ``MAX_IMAGE_PIXELS``),
on both image paths (docs/failures.md, "Decompression bombs").

Headers read here: JPEG (the SOF segment), PNG (IHDR), BMP, WebP (VP8, VP8L, VP8X) and
PNM (P1-P6). Other formats (TIFF, JPEG 2000) are left to the decoder and its own limits.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Optional, Tuple

__all__ = [
    "ENV",
    "DEFAULT_MAX_PIXELS",
    "ImageTooLarge",
    "declared_size",
    "max_pixels",
    "refusal",
    "too_large",
]

ENV = "SHARDLOADER_MAX_IMAGE_PIXELS"
DEFAULT_MAX_PIXELS = 178_956_970

# JPEG start-of-frame markers: every SOFn but DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PNG = b"\x89PNG\r\n\x1a\n"


class ImageTooLarge(ValueError):
    """An image refused for the size its header declares (the message says which and why)."""


def max_pixels() -> Optional[int]:
    """The limit in pixels (``height * width``), read from ``SHARDLOADER_MAX_IMAGE_PIXELS``
    at each call (so a worker started later follows the training process's setting); ``0``
    turns the check off (``None``)."""
    text = os.environ.get(ENV)
    if text is None:
        return DEFAULT_MAX_PIXELS
    try:
        limit = int(text.replace("_", "").strip())
    except ValueError:
        limit = -1
    if limit < 0:
        raise ValueError(
            f"the environment variable {ENV} must be a whole number of pixels (0 for no "
            f"limit), got {text!r}"
        )
    return limit or None


def too_large(height: int, width: int) -> Optional[str]:
    """Why an image of ``height`` x ``width`` pixels is refused, or ``None`` if it is not."""
    limit = max_pixels()
    if limit is None or height * width <= limit:
        return None
    return (
        f"declares a {width}x{height} image ({height * width:,} pixels), above the limit of "
        f"{limit:,} pixels: decoding it would take {height * width * 3 / 1e9:.1f} GB as RGB "
        f"(a decompression bomb, or a damaged header). For images you trust, raise the "
        f"limit with the environment variable {ENV} (0 for none)"
    )


def refusal(data: Any) -> Optional[str]:
    """Why the encoded image ``data`` is refused (its header declares too many pixels), or
    ``None``: within the limit, or a header this module does not read."""
    size = declared_size(data)
    return None if size is None else too_large(*size)


def declared_size(data: Any) -> Optional[Tuple[int, int]]:
    """``(height, width)`` as the header of ``data`` (bytes or any buffer) declares them, or
    ``None`` for a format not read here or a header too short to say."""
    try:
        view = memoryview(data).cast("B")
    except (TypeError, ValueError):
        return None
    try:
        head = bytes(view[:12])
        if head[:2] == b"\xff\xd8":
            return _jpeg(view)
        if head[:8] == _PNG:
            width, height = struct.unpack_from(">II", view, 16)
            return height, width
        if head[:2] == b"BM":
            return _bmp(view)
        if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            return _webp(view)
        if head[:1] == b"P" and head[1:2] in b"123456":
            return _pnm(bytes(view[:256]))
    except (struct.error, IndexError, ValueError):
        return None
    return None


def _jpeg(view: memoryview) -> Optional[Tuple[int, int]]:
    """Walk the segments to the first start-of-frame; its height and width."""
    i, n = 2, len(view)
    while i + 4 <= n:
        if view[i] != 0xFF:  # extraneous bytes before a marker: libjpeg skips them too
            i += 1
            continue
        marker = view[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # no length
            i += 2
            continue
        if marker in _SOF:
            height, width = struct.unpack_from(">HH", view, i + 5)
            return (height, width) if height else None  # 0: set later by a DNL marker
        if marker == 0xDA:  # the scan began before any frame header
            return None
        (length,) = struct.unpack_from(">H", view, i + 2)
        i += 2 + length
    return None


def _bmp(view: memoryview) -> Tuple[int, int]:
    (header,) = struct.unpack_from("<I", view, 14)
    if header == 12:  # BITMAPCOREHEADER
        width, height = struct.unpack_from("<HH", view, 18)
    else:
        width, height = struct.unpack_from("<ii", view, 18)
    return abs(height), abs(width)  # a negative height is stored top-down


def _webp(view: memoryview) -> Optional[Tuple[int, int]]:
    chunk = bytes(view[12:16])
    if chunk == b"VP8 ":
        width, height = struct.unpack_from("<HH", view, 26)
        return height & 0x3FFF, width & 0x3FFF
    if chunk == b"VP8L":
        (bits,) = struct.unpack_from("<I", view, 21)
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8X":
        b = bytes(view[24:30])
        return int.from_bytes(b[3:6], "little") + 1, int.from_bytes(b[0:3], "little") + 1
    return None


def _pnm(head: bytes) -> Optional[Tuple[int, int]]:
    """Width and height: the first two numbers after the magic, past comments."""
    numbers = []
    for line in head[2:].split(b"\n"):
        numbers += line.split(b"#", 1)[0].split()
        if len(numbers) >= 2:
            return int(numbers[1]), int(numbers[0])
    return None
