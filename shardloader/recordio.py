"""RecordIO datasets that are safe to read from forked, spawned and threaded workers.

``RecordDataset`` returns raw records and ``ImageRecordDataset`` decodes image
records in whichever process reads them. ``pack_images`` and ``pack_records`` write
``.rec``/``.idx`` pairs.

Per-process handles
    The dataset holds the record positions it parsed from the ``.idx`` file at construction,
    never an open file. Each process opens its own ``MXIndexedRecordIO`` handle on its first
    read and remembers its pid; a forked child sees a foreign pid and opens a fresh handle.
    The handle is not pickled, so the dataset also travels to ``spawn`` workers. Within a
    process, threads share the handle under a lock, because MXNet's seek and read are two
    calls on one stream.

What MXNet does not check, and this module does
    MXNet's reader verifies the magic number of a record header and that a record's bytes can
    be read in full, but it names neither the file nor the record, and:

    - a position at or past the end of the file makes it return ``None`` instead of raising,
      and every later read on that handle returns ``None`` as well (the end-of-stream flag
      sticks across seeks);
    - a length field that was damaged into a smaller value yields a silently shortened record,
      and a damaged continuation flag glues the next record onto this one.

    So the ``.idx`` positions are checked against the ``.rec`` size at construction, a handle
    that failed is discarded, and every record is checked to end exactly where the next
    indexed record starts (or the file ends), or else to be followed by another record header.
    Errors about file contents are ``RecordIOError`` (a ``ValueError``) naming the file,
    the record index, its key and its byte offset. A missing file is ``FileNotFoundError``.
    RecordIO stores no checksum: a damaged byte inside a raw payload cannot be detected, but an
    image that no longer decodes (PNG checks a CRC per chunk) is reported.
"""

from __future__ import annotations

import errno
import itertools
import operator
import os
import struct
import threading
import warnings
import zlib
from typing import Any, Callable, Iterable, Optional, Tuple, Union

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError
from mxnet.gluon.data import Dataset
from tqdm import tqdm

from ._errors import ShardLoaderError

__all__ = [
    "RecordIOError",
    "RecordDataset",
    "ImageRecordDataset",
    "pack_records",
    "pack_images",
]

PathLike = Union[str, "os.PathLike[str]"]

# dmlc-core's RecordIO framing: each chunk is <magic:u32><cflag:3 bits|length:29 bits><data>,
# padded to 4 bytes. The writer splits a record at every 4-aligned copy of the magic in it.
_MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", _MAGIC)
_HEADER_BYTES = 8


class RecordIOError(ShardLoaderError, ValueError):
    """A ``.rec`` or ``.idx`` file is corrupt, truncated or inconsistent, or a record does not
    hold what the dataset expects (an ``IRHeader`` and a decodable image).

    Attributes
    ----------
    path : str or None
        The file at fault.
    index : int or None
        The dataset index of the record (its line in the ``.idx`` file, from 0).
    key : int or None
        The record's key in the ``.idx`` file.
    offset : int or None
        The byte offset of the record in the ``.rec`` file.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Optional[str] = None,
        index: Optional[int] = None,
        key: Optional[int] = None,
        offset: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.index = index
        self.key = key
        self.offset = offset


def _last_line(exc: BaseException) -> str:
    """MXNet errors carry a C++ traceback; the last line says what failed."""
    lines = str(exc).strip().splitlines()
    return lines[-1].strip() if lines else type(exc).__name__


def _default_idx_path(rec_path: str) -> str:
    return os.path.splitext(rec_path)[0] + ".idx"


def _existing_file(path: str, what: str) -> str:
    if not os.path.isfile(path):
        raise FileNotFoundError(errno.ENOENT, f"{what} not found", path)
    return path


def _stored_size(payload: bytes) -> int:
    """The bytes MXNet's writer spent on disk for ``payload``: headers, data and padding."""
    size = len(payload)
    splits = 0
    if _MAGIC_BYTES in payload:
        words = np.frombuffer(payload, dtype="<u4", count=size // 4)
        splits = int(np.count_nonzero(words == _MAGIC))
    return ((size + 3) & ~3) + _HEADER_BYTES * (splits + 1) - 4 * splits


def _parse_index(idx_path: str) -> Tuple[np.ndarray, np.ndarray]:
    """Keys and byte offsets from an ``.idx`` file, in file order, rejecting what MXNet's
    reader would misread."""
    keys, offsets, first_line = [], [], {}
    with open(idx_path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            fields = line.strip().split("\t")
            try:
                key, offset = int(fields[0]), int(fields[1])
            except (IndexError, ValueError):
                raise RecordIOError(
                    f"{idx_path}, line {number}: expected '<integer key>\\t<byte offset>', "
                    f"got {line.rstrip()!r}",
                    path=idx_path,
                ) from None
            if offset < 0:
                raise RecordIOError(
                    f"{idx_path}, line {number}: negative byte offset {offset} for key {key}",
                    path=idx_path,
                    key=key,
                )
            if key in first_line:
                raise RecordIOError(
                    f"{idx_path}, line {number}: key {key} repeats line {first_line[key]}",
                    path=idx_path,
                    key=key,
                )
            first_line[key] = number
            keys.append(key)
            offsets.append(offset)
    return np.array(keys, dtype=np.int64), np.array(offsets, dtype=np.int64)


class _IndexedReader(mx.recordio.MXIndexedRecordIO):
    """MXNet's indexed reader, except that it never closes a stream inherited through fork."""

    def close(self) -> None:
        if self.is_open and self.pid != os.getpid():
            # The child shares the parent's open file description, and closing the inherited
            # C stream could move the parent's file offset: forget it, leave it open.
            self.is_open = False
            return
        super().close()


class _Reader:
    """One process's open ``MXIndexedRecordIO`` and the lock its threads share it under."""

    def __init__(self, rec_path: str, idx_path: str) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.rec_path = rec_path
        self.record = _IndexedReader(
            _existing_file(idx_path, "RecordIO index file"),
            _existing_file(rec_path, "RecordIO file"),
            "r",
        )
        self._raw = None

    def read(self, key: int) -> Optional[bytes]:
        with self.lock:
            if not self.record.is_open:  # another thread released it after we picked it up
                self.record.open()
            return self.record.read_idx(key)

    def is_header_at(self, offset: int) -> bool:
        with self.lock:
            if self._raw is None:
                self._raw = open(self.rec_path, "rb", buffering=0)  # noqa: SIM115
            return os.pread(self._raw.fileno(), 4, offset) == _MAGIC_BYTES

    def release(self) -> None:
        """Close the handle; in a forked child, only forget the parent's."""
        if self.pid != os.getpid():
            self.record.close()  # the lock may have been held when the parent forked
            return
        with self.lock:
            self.record.close()
            raw, self._raw = self._raw, None
        if raw is not None:
            raw.close()


class RecordDataset(Dataset):
    """Raw records of an indexed RecordIO file, as ``bytes``, in ``.idx`` order.

    A Gluon ``Dataset`` (``transform``, ``transform_first``, ``shard`` and the rest work) that
    any number of worker processes and threads can read at once: every process opens its own
    ``MXIndexedRecordIO`` handle on first use, and the dataset pickles without it.

    Parameters
    ----------
    rec_path : str or os.PathLike
        The ``.rec`` file.
    idx_path : str or os.PathLike, optional
        The ``.idx`` file; by default ``rec_path`` with its extension replaced by ``.idx``.

    Raises
    ------
    FileNotFoundError
        If either file is missing.
    RecordIOError
        If the ``.idx`` file is malformed or points past the end of the ``.rec`` file.
        Reading a record raises it too, naming the record, when the record is damaged.

    Examples
    --------
    >>> import os, tempfile
    >>> from shardloader.recordio import RecordDataset, pack_records
    >>> path = os.path.join(tempfile.mkdtemp(), "raw.rec")
    >>> _ = pack_records(path, [b"alpha", b"beta"])
    >>> dataset = RecordDataset(path)
    >>> len(dataset), dataset[1]
    (2, b'beta')
    """

    def __init__(self, rec_path: PathLike, idx_path: Optional[PathLike] = None) -> None:
        rec_path = os.fspath(rec_path)
        idx_path = _default_idx_path(rec_path) if idx_path is None else os.fspath(idx_path)
        self._rec_path = _existing_file(rec_path, "RecordIO file")
        self._idx_path = _existing_file(idx_path, "RecordIO index file")
        self._keys, self._offsets = _parse_index(idx_path)
        self._limits = self._check_offsets(os.path.getsize(rec_path))
        self._reader: Optional[_Reader] = None

    def _check_offsets(self, rec_size: int) -> np.ndarray:
        """Refuse positions past the end of the ``.rec``; return where each record must end."""
        past_end = np.flatnonzero(self._offsets + _HEADER_BYTES > rec_size)
        if past_end.size:
            first = int(past_end[0])
            raise RecordIOError(
                f"{self._idx_path}: {past_end.size} of {len(self)} entries point past the end "
                f"of {self._rec_path} ({rec_size} bytes), first record {first} (key "
                f"{int(self._keys[first])}, line {first + 1}) at byte offset "
                f"{int(self._offsets[first])}; the .rec file is truncated or belongs to "
                f"another .idx",
                path=self._idx_path,
                index=first,
                key=int(self._keys[first]),
                offset=int(self._offsets[first]),
            )
        # A record ends at the next indexed record or at the end of the file, never beyond.
        starts = np.unique(self._offsets)
        following = np.searchsorted(starts, self._offsets, side="right")
        return np.append(starts, rec_size)[following]

    @property
    def rec_path(self) -> str:
        """The ``.rec`` file."""
        return self._rec_path

    @property
    def idx_path(self) -> str:
        """The ``.idx`` file."""
        return self._idx_path

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, idx: int) -> Any:
        return self._read(self._position(idx))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._rec_path!r}, {len(self)} records)"

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_reader"] = None
        return state

    def close(self) -> None:
        """Release this process's file handle. Reading again reopens it."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.release()

    def _position(self, idx: int) -> int:
        try:
            position = operator.index(idx)
        except TypeError:
            raise TypeError(
                f"{type(self).__name__} indices must be integers, got {type(idx).__name__}"
            ) from None
        length = len(self)
        if position < 0:
            position += length
        if not 0 <= position < length:
            raise IndexError(
                f"index {idx} is out of range for {type(self).__name__} of length {length} "
                f"({self._rec_path})"
            )
        return position

    def _open_reader(self) -> _Reader:
        reader = self._reader
        if reader is not None and reader.pid == os.getpid():
            return reader
        if reader is not None:
            reader.release()
        # Threads racing here each get a working handle; the last one assigned is kept.
        reader = _Reader(self._rec_path, self._idx_path)
        if len(reader.record.keys) != len(self):
            reader.release()
            raise RecordIOError(
                f"{self._idx_path} changed after the dataset was built: it now lists "
                f"{len(reader.record.keys)} records, not {len(self)}",
                path=self._idx_path,
            )
        self._reader = reader
        return reader

    def _error(self, position: int, reason: str) -> RecordIOError:
        key, offset = int(self._keys[position]), int(self._offsets[position])
        return RecordIOError(
            f"{self._rec_path}: record {position} (key {key}, byte offset {offset}): {reason}",
            path=self._rec_path,
            index=position,
            key=key,
            offset=offset,
        )

    def _discard(self, reader: _Reader) -> None:
        """Drop a handle that failed: MXNet's reader may be stuck at end of stream."""
        if self._reader is reader:
            self._reader = None
        reader.release()

    def _read(self, position: int) -> bytes:
        """The verified bytes of the record at ``position``."""
        key = int(self._keys[position])
        reader = self._open_reader()
        try:
            payload = reader.read(key)
        except MXNetError as exc:
            self._discard(reader)
            reason = f"the file is corrupt or truncated here ({_last_line(exc)})"
            raise self._error(position, reason) from exc
        if payload is None:
            self._discard(reader)
            raise self._error(position, "the file ends before this record; it was truncated")
        end = int(self._offsets[position]) + _stored_size(payload)
        limit = int(self._limits[position])
        if end > limit or (end < limit and not reader.is_header_at(end)):
            raise self._error(
                position,
                f"its length field says it ends at byte {end}, but the next record or the end "
                f"of the file is at byte {limit}; the RecordIO header is corrupt",
            )
        return payload


def _header_label(header: Any) -> Union[np.float32, np.ndarray]:
    if header.flag > 0:
        return np.array(header.label, dtype=np.float32)
    return np.float32(header.label)


class ImageRecordDataset(RecordDataset):
    """Images and labels from an indexed RecordIO file written by ``pack_images``,
    ``im2rec`` or ``mx.recordio.pack_img``, decoded in the process that reads them.

    Each sample is ``(image, label)``:

    - ``image`` is an ``mx.nd.NDArray`` of shape ``(height, width, channels)`` and dtype
      ``uint8``, in RGB order, as Gluon's ``ImageRecordDataset`` returns it, so Gluon's vision
      transforms apply directly. MXNet decodes into an NDArray, so numpy would cost one more
      copy per image; to get numpy, pass a ``transform`` that calls ``asnumpy()``.
    - ``label`` comes from the record's ``IRHeader``: a ``numpy.float32`` scalar, or a
      ``float32`` vector for a multi-value label. (Gluon returns a Python float, which batches
      as float64.)

    Parameters
    ----------
    rec_path : str or os.PathLike
        The ``.rec`` file.
    idx_path : str or os.PathLike, optional
        The ``.idx`` file; by default next to ``rec_path``.
    flag : int, default 1
        1 decodes to 3 colour channels, 0 to 1 grey channel.
    transform : callable, optional
        ``transform(image, label)`` applied after decoding; its result is the sample.

    Raises
    ------
    RecordIOError
        When a record is damaged, has no valid ``IRHeader``, or is not a decodable image.
        See ``RecordDataset`` for the file checks.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from shardloader.recordio import ImageRecordDataset, pack_images
    >>> path = os.path.join(tempfile.mkdtemp(), "images.rec")
    >>> images = np.zeros((2, 4, 4, 3), dtype=np.uint8)
    >>> _ = pack_images(path, images, labels=[3, 5])
    >>> image, label = ImageRecordDataset(path)[1]
    >>> image.shape, float(label)
    ((4, 4, 3), 5.0)
    """

    def __init__(
        self,
        rec_path: PathLike,
        idx_path: Optional[PathLike] = None,
        flag: int = 1,
        transform: Optional[Callable[[Any, Any], Any]] = None,
    ) -> None:
        if flag not in (0, 1):
            raise ValueError(f"flag must be 1 (colour) or 0 (grey), got {flag!r}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None, got {type(transform).__name__}")
        super().__init__(rec_path, idx_path)
        self._flag = flag
        self._transform = transform

    def __getitem__(self, idx: int) -> Any:
        position = self._position(idx)
        record = self._read(position)
        try:
            header, payload = mx.recordio.unpack(record)
            label = _header_label(header)
        except (struct.error, ValueError) as exc:
            raise self._error(position, f"no valid IRHeader ({exc})") from exc
        try:
            image = mx.image.imdecode(payload, self._flag)
            # Decoding errors surface only when the result is awaited; raise them here.
            image.wait_to_read()
        except MXNetError as exc:
            raise self._error(position, f"not a decodable image ({_last_line(exc)})") from exc
        if self._transform is not None:
            return self._transform(image, label)
        return image, label


# ---------------------------------------------------------------------------------------------
# Writing


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
            f"img_fmt={img_fmt!r} needs the OpenCV Python package (pip install "
            "opencv-python): mx.recordio.pack_img encodes with cv2, and MXNet's built-in "
            "OpenCV can only decode. img_fmt='.png' needs nothing extra."
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


def _write_records(
    rec_path: str, idx_path: str, records: Iterable[bytes], total: Optional[int], progress: bool
) -> None:
    """Write ``records`` under temporary names, then rename the pair into place."""
    tmp_rec, tmp_idx = f"{rec_path}.{os.getpid()}.tmp", f"{idx_path}.{os.getpid()}.tmp"
    writer = mx.recordio.MXIndexedRecordIO(tmp_idx, tmp_rec, "w")
    done = False
    try:
        bar = tqdm(
            records, total=total, disable=not progress, unit="rec", desc=os.path.basename(rec_path)
        )
        for key, record in enumerate(bar):
            if not isinstance(record, (bytes, bytearray, memoryview)):
                raise TypeError(f"records[{key}] must be bytes, got {type(record).__name__}")
            try:
                writer.write_idx(key, bytes(record))
            except MXNetError as exc:
                raise RecordIOError(
                    f"{rec_path}: cannot write record {key} ({_last_line(exc)})",
                    path=rec_path,
                    index=key,
                    key=key,
                ) from exc
        writer.close()
        os.replace(tmp_rec, rec_path)
        os.replace(tmp_idx, idx_path)
        done = True
    finally:
        if not done:
            writer.close()
            for path in (tmp_rec, tmp_idx):
                if os.path.exists(path):
                    os.remove(path)


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
