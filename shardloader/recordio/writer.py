"""Writing ``.rec``/``.idx`` pairs: ``pack_records`` and ``pack_images``."""

from __future__ import annotations

import errno
import itertools
import os
import struct
import tempfile
import warnings
import zlib
from typing import Any, Callable, Iterable, Optional, Tuple, Union

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

from .._errors import RecordIOError
from .._extras import install_hint
from ._format import (
    PathLike,
    _default_idx_path,
    _last_line,
)


def _png(image: np.ndarray, level: int) -> bytes:
    """A lossless 8-bit PNG of an HxWxC image (C = 1, 3 or 4), channels stored as given."""
    height, width, channels = image.shape
    color_type = {1: 0, 3: 2, 4: 6}[channels]  # grey, RGB, RGBA
    rows = np.zeros((height, 1 + width * channels), dtype=np.uint8)  # filter byte 0 per row
    rows[:, 1:] = image.reshape(height, width * channels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return b"".join(
        [
            b"\x89PNG\r\n\x1a\n",
            chunk(b"IHDR", header),
            chunk(b"IDAT", zlib.compress(rows.tobytes(), level)),
            chunk(b"IEND", b""),
        ]
    )


def _pack(header: Any, payload: bytes) -> bytes:
    with warnings.catch_warnings():
        # mx.recordio.pack serialises vector labels with ndarray.tostring().
        warnings.filterwarnings("ignore", "tostring", DeprecationWarning)
        return mx.recordio.pack(header, payload)


def _image_encoder(img_fmt: str, quality: int) -> Callable[[Any, np.ndarray], bytes]:
    """``encode(header, rgb_image) -> record`` for ``img_fmt``, checked before any writing."""
    if not isinstance(img_fmt, str) or not img_fmt.startswith("."):
        raise ValueError(f"img_fmt must be a file extension such as '.png', got {img_fmt!r}")
    if img_fmt.lower() == ".png":
        # OpenCV's PNG writer also clamps its compression level to zlib's 0-9.
        level = min(max(int(quality), 0), 9)
        return lambda header, image: _pack(header, _png(image, level))
    if mx.recordio.cv2 is None:
        raise ImportError(
            f"img_fmt={img_fmt!r} needs the OpenCV Python package, in the 'vision' extra "
            f"({install_hint('vision')}): mx.recordio.pack_img encodes with cv2, and MXNet's "
            "built-in OpenCV can only decode. img_fmt='.png' needs nothing extra."
        )

    def encode(header: Any, image: np.ndarray) -> bytes:
        if image.shape[2] >= 3:  # cv2 expects BGR(A); imdecode turns it back into RGB.
            image = image[:, :, [2, 1, 0] + list(range(3, image.shape[2]))]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "tostring", DeprecationWarning)
            return mx.recordio.pack_img(header, image, quality, img_fmt)

    return encode


def _checked_image(image: Any, index: int) -> np.ndarray:
    if isinstance(image, mx.nd.NDArray):
        image = image.asnumpy()
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[:, :, None]
    if (
        image.dtype != np.uint8
        or image.ndim != 3
        or image.shape[2] not in (1, 3, 4)
        or 0 in image.shape
    ):
        raise ValueError(
            f"images[{index}] must be a non-empty uint8 array of shape (H, W), (H, W, 1), "
            f"(H, W, 3) or (H, W, 4), got dtype {image.dtype} and shape {image.shape}"
        )
    return np.ascontiguousarray(image)


def _checked_label(label: Any, index: int) -> Union[float, np.ndarray]:
    value = np.asarray(label, dtype=np.float32)
    if value.ndim == 0:
        return float(value)
    if value.ndim != 1 or value.size == 0:
        raise ValueError(
            f"labels[{index}] must be a number or a non-empty 1-D sequence of numbers, "
            f"got shape {value.shape}"
        )
    return value


def _resolve_paths(rec_path: PathLike, idx_path: Optional[PathLike]) -> Tuple[str, str]:
    rec_path = os.fspath(rec_path)
    idx_path = _default_idx_path(rec_path) if idx_path is None else os.fspath(idx_path)
    if os.path.abspath(rec_path) == os.path.abspath(idx_path):
        raise ValueError(f"rec_path and idx_path must differ, both are {rec_path!r}")
    return rec_path, idx_path


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _temporary_next_to(path: str) -> Tuple[int, str]:
    """A new, empty file in ``path``'s directory, created exclusively under an unpredictable
    name, so that nothing planted there (a symlink, another file) can be written through."""
    directory, name = os.path.split(os.path.abspath(path))
    return tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)


def _write_records(
    rec_path: str, idx_path: str, records: Iterable[bytes], total: Optional[int], progress: bool
) -> None:
    """Write ``records`` under temporary names, then rename the pair into place. On any
    error (a full disk included) both temporary files are closed and removed, whatever
    closing MXNet's writer raises, and one ``RecordIOError`` says what failed."""
    temporaries = []
    writer = None
    done = False
    key = -1
    try:
        for path in (rec_path, idx_path):
            temporaries.append(_temporary_next_to(path))
        (rec_fd, tmp_rec), (idx_fd, tmp_idx) = temporaries
        # MXNet's writer opens both files by name and truncates them: they are ours, created
        # with O_EXCL, under names nobody could predict.
        writer = mx.recordio.MXIndexedRecordIO(tmp_idx, tmp_rec, "w")
        from tqdm import tqdm  # here: importing shardloader (and `shardloader --help`) stays light

        bar = tqdm(
            records, total=total, disable=not progress, unit="rec", desc=os.path.basename(rec_path)
        )
        for key, record in enumerate(bar):
            if not isinstance(record, (bytes, bytearray, memoryview)):
                raise TypeError(f"records[{key}] must be bytes, got {type(record).__name__}")
            record = bytes(record)
            try:
                writer.write_idx(key, record)
            except (MXNetError, OSError) as exc:
                raise _write_error(
                    rec_path, key, f"cannot write record {key}", exc, len(record)
                ) from exc
        size = writer.tell()
        closing: Optional[BaseException] = None
        try:
            writer.close()  # the last of the .rec, and the .idx, reach the disk here
        except (MXNetError, OSError) as exc:
            closing = exc
        # MXNet's writer ignores an error of its last flush: a .rec cut short says so here.
        written = os.fstat(rec_fd).st_size
        if written != size:
            what = (
                f"cannot finish it after record {key}: {written} of its {size} bytes were written"
            )
            raise _write_error(rec_path, None, what, closing, size - written) from closing
        if closing is not None:
            what = f"cannot finish it after record {key}"
            raise _write_error(idx_path, None, what, closing, 0) from closing
        mode = 0o666 & ~_umask()  # mkstemp makes 0600 files; give them what open() would
        for fd, _ in temporaries:
            os.fchmod(fd, mode)
        os.replace(tmp_rec, rec_path)
        os.replace(tmp_idx, idx_path)
        done = True
    finally:
        if writer is not None and not done:
            _abandon(writer)
        for fd, path in temporaries:
            os.close(fd)
            if not done:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass


def _abandon(writer: Any) -> None:
    """Close MXNet's writer after an error, ignoring what closing raises (a full disk fails
    the flushes again): the error the caller sees is the first one."""
    try:
        writer.close()
    except (MXNetError, OSError):
        pass
    index_file = getattr(writer, "fidx", None)  # left open when the .rec side raised first
    if index_file is not None:
        try:
            index_file.close()
        except OSError:
            pass


def _write_error(
    path: str, key: Optional[int], what: str, exc: Optional[BaseException], needed: int
) -> RecordIOError:
    """The error for a write to ``path`` that failed: ``what`` failed (writing record
    ``key``, or finishing the file: ``None``), because of ``exc`` (``None``: a short file)
    with ``needed`` bytes still to write. A full disk is named as such: MXNet's writer reports
    it only as an incomplete write, so the free space of the directory decides."""
    directory = os.path.dirname(os.path.abspath(path))
    code = getattr(exc, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT) or (code is None and _full(directory, needed)):
        cause = (
            "no space left on the device"
            if code != errno.EDQUOT
            else "disk quota exceeded (no space left for this user)"
        )
        advice = f"; free space in {directory!r} or write elsewhere"
    elif exc is None:
        cause, advice = "the file was cut short", ""
    else:
        cause, advice = _last_line(exc) if isinstance(exc, MXNetError) else str(exc), ""
    return RecordIOError(
        f"{path}: {what}: {cause}{advice}. The partial .rec and .idx are removed.",
        path=path,
        index=key,
        key=key,
    )


def _full(directory: str, needed: int) -> bool:
    """Whether ``directory``'s file system lacks room for ``needed`` more bytes (and a
    block's slack) for this user."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < needed + max(stat.f_frsize, 4096)


def _length(items: Any) -> Optional[int]:
    return len(items) if hasattr(items, "__len__") else None


def pack_records(
    rec_path: PathLike,
    records: Iterable[bytes],
    idx_path: Optional[PathLike] = None,
    progress: bool = False,
) -> Tuple[str, str]:
    """Write ``records`` (``bytes`` each) to an indexed RecordIO pair, keyed 0, 1, 2, ...

    The files are written under temporary names and renamed into place at the end, so an
    error never leaves a half-written pair behind.

    Parameters
    ----------
    rec_path : str or os.PathLike
        The ``.rec`` file to write.
    records : iterable of bytes
        The records, in order.
    idx_path : str or os.PathLike, optional
        The ``.idx`` file to write; by default ``rec_path`` with the extension ``.idx``.
    progress : bool, default False
        Show a ``tqdm`` progress bar.

    Returns
    -------
    (str, str)
        ``rec_path`` and ``idx_path``.
    """
    rec_path, idx_path = _resolve_paths(rec_path, idx_path)
    _write_records(rec_path, idx_path, records, _length(records), progress)
    return rec_path, idx_path


def pack_images(
    rec_path: PathLike,
    images: Iterable[Any],
    labels: Iterable[Any],
    idx_path: Optional[PathLike] = None,
    quality: int = 95,
    img_fmt: str = ".png",
    progress: bool = False,
) -> Tuple[str, str]:
    """Encode images with their labels into an indexed RecordIO pair that
    ``ImageRecordDataset`` (and Gluon's, and ``ImageRecordIter``) reads.

    Record ``i`` holds ``IRHeader(flag, labels[i], id=i, id2=0)`` followed by the encoded
    image, the layout of ``mx.recordio.pack_img``. Like ``pack_records``, it never leaves
    a half-written pair behind.

    Parameters
    ----------
    rec_path : str or os.PathLike
        The ``.rec`` file to write.
    images : iterable of numpy.ndarray
        ``uint8`` images of shape ``(H, W)`` or ``(H, W, C)`` with C = 1, 3 (RGB) or 4 (RGBA);
        a 4-D array of shape ``(N, H, W, C)`` works too.
    labels : iterable
        One label per image: a number, or a 1-D sequence of numbers (stored as float32).
    idx_path : str or os.PathLike, optional
        The ``.idx`` file to write; by default next to ``rec_path``.
    quality : int, default 95
        JPEG quality (1-100), or for PNG the zlib compression level (clamped to 0-9).
    img_fmt : str, default '.png'
        ``'.png'`` is lossless and built in, so decoded pixels equal the input. Any other
        format (``'.jpg'``) goes through ``mx.recordio.pack_img`` and needs ``opencv-python``.
    progress : bool, default False
        Show a ``tqdm`` progress bar.

    Returns
    -------
    (str, str)
        ``rec_path`` and ``idx_path``.

    Raises
    ------
    ValueError
        For an image or label of the wrong type or shape, naming its index, or when
        ``images`` and ``labels`` differ in length.
    ImportError
        For a format other than PNG without ``cv2``.
    """
    rec_path, idx_path = _resolve_paths(rec_path, idx_path)
    encode = _image_encoder(img_fmt, quality)
    missing = object()

    def records() -> Iterable[bytes]:
        pairs = itertools.zip_longest(images, labels, fillvalue=missing)
        for index, (image, label) in enumerate(pairs):
            if image is missing or label is missing:
                raise ValueError(f"images and labels differ in length: one ends at index {index}")
            header = mx.recordio.IRHeader(0, _checked_label(label, index), index, 0)
            yield encode(header, _checked_image(image, index))

    _write_records(rec_path, idx_path, records(), _length(images), progress)
    return rec_path, idx_path
