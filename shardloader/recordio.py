"""RecordIO datasets that are safe to read from forked, spawned and threaded workers.

``RecordDataset`` returns raw records and ``ImageRecordDataset`` decodes image
records in whichever process reads them. ``pack_images`` and ``pack_records`` write
``.rec``/``.idx`` pairs, and ``thread_safe`` makes Gluon's own record datasets safe to
share between threads.

Reading
    The dataset holds the record positions it parsed from the ``.idx`` file at construction,
    never an open file. Each process opens its own read-only descriptor of the ``.rec`` on its
    first read and remembers its pid; a forked child sees a foreign pid and opens its own. The
    descriptor is not pickled, so the dataset also travels to ``spawn`` workers. Records are
    read with ``os.pread``, which takes the position with every call, so threads share the
    descriptor without a lock and without a seek that another thread could move.

Checks
    RecordIO frames each record as chunks of ``<magic><flag and length><data><zero padding>``.
    MXNet's own reader checks only the magic number and that the bytes can be read, and names
    neither the file nor the record. Here every read checks the whole frame: the magic number,
    the continuation flags (a record starts with flag 0 or 1, continues with 2 and ends with 3),
    that the padding bytes are zero, and that the record ends exactly where the next indexed
    record starts or the file ends, or else where another record starts. The ``.idx`` positions
    are checked against the ``.rec`` size at construction. Errors about file contents are
    ``RecordIOError`` (a ``ValueError``) naming the file, the record index, its key and its byte
    offset. A missing file is ``FileNotFoundError``.

    RecordIO stores no checksum. A damaged byte inside a payload cannot be detected, and neither
    can a length field that changed only within the record's last 4-byte word when the bytes it
    gained or lost are zeros. An image that no longer decodes (PNG checks a CRC per chunk) is
    reported.
"""

from __future__ import annotations

import errno
import itertools
import operator
import os
import stat
import struct
import tempfile
import threading
import warnings
import zlib
from typing import Any, Callable, Dict, Iterable, Optional, Tuple, Union

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError
from mxnet.gluon.data import Dataset
from mxnet.gluon.data import dataset as _gluon_dataset
from tqdm import tqdm

from ._errors import ShardLoaderError

__all__ = [
    "RecordIOError",
    "RecordDataset",
    "ImageRecordDataset",
    "pack_records",
    "pack_images",
    "thread_safe",
]

PathLike = Union[str, "os.PathLike[str]"]

# dmlc-core's RecordIO framing: each chunk is <magic:u32><cflag:3 bits|length:29 bits><data>,
# with zero bytes that pad the data to a multiple of 4. The writer splits a record at every
# 4-aligned copy of the magic in it: the copy is dropped, the first chunk gets flag 1, the
# middle ones 2 and the last one 3. A record of one chunk has flag 0.
_MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", _MAGIC)
_HEADER = struct.Struct("<II")
_HEADER_BYTES = _HEADER.size
_LENGTH_MASK = (1 << 29) - 1
_FIRST_FLAGS = (0, 1)
_NEXT_FLAGS = (2, 3)
_LAST_FLAGS = (0, 3)
# .idx numbers must fit the int64 arrays they are kept in.
_INT64_MAX = (1 << 63) - 1


class RecordIOError(ShardLoaderError, ValueError):
    """A ``.rec`` or ``.idx`` file is corrupt, truncated, inconsistent or cannot be read, or a
    record does not hold what the dataset expects (an ``IRHeader`` and a decodable image).

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


def _kind_of(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _open_file(path: str, what: str) -> int:
    """A read-only descriptor of the regular file ``path``; ``FileNotFoundError`` when it is
    missing, ``RecordIOError`` naming it and the problem for anything else."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer. It changes nothing for files.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"{what} not found", path) from None
    except OSError as exc:
        raise RecordIOError(
            f"{path}: cannot open the {what}: {exc.strerror or exc}", path=path
        ) from exc
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:  # pragma: no cover - fstat of an open descriptor does not fail
        os.close(fd)
        raise RecordIOError(f"{path}: cannot stat the {what}: {exc.strerror}", path=path) from exc
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _kind_of(mode)
        raise RecordIOError(f"{path}: the {what} is {kind}, not a regular file", path=path)
    return fd


def _index_error(
    idx_path: str, number: int, problem: str, key: Optional[int] = None
) -> RecordIOError:
    return RecordIOError(f"{idx_path}, line {number}: {problem}", path=idx_path, key=key)


def _parse_index(idx_path: str, rec_path: str) -> Tuple[np.ndarray, np.ndarray]:
    """Keys and byte offsets from an ``.idx`` file, in file order, rejecting what MXNet's
    reader would misread."""
    keys, offsets, first_line = [], [], {}
    with os.fdopen(_open_file(idx_path, "RecordIO index file"), "rb") as lines:
        for number, line in enumerate(lines, 1):
            fields = line.strip().split(b"\t")
            try:
                key, offset = int(fields[0]), int(fields[1])
            except (IndexError, ValueError):
                text = line.rstrip(b"\r\n").decode("utf-8", "backslashreplace")
                try:
                    line.decode("utf-8")
                    hint = ""
                except UnicodeDecodeError:
                    hint = "; the line is not UTF-8 text, so this is not an .idx file"
                raise _index_error(
                    idx_path,
                    number,
                    f"expected '<integer key>\\t<byte offset>', got {text!r}{hint}",
                ) from None
            if not -_INT64_MAX - 1 <= key <= _INT64_MAX:
                raise _index_error(idx_path, number, f"key {key} is out of the 64-bit range")
            if offset < 0:
                raise _index_error(
                    idx_path, number, f"negative byte offset {offset} for key {key}", key
                )
            if offset > _INT64_MAX:
                raise _index_error(
                    idx_path,
                    number,
                    f"byte offset {offset} for key {key} is past the end of any file, "
                    f"{rec_path} included",
                    key,
                )
            if key in first_line:
                raise _index_error(
                    idx_path, number, f"key {key} repeats line {first_line[key]}", key
                )
            first_line[key] = number
            keys.append(key)
            offsets.append(offset)
    return np.array(keys, dtype=np.int64), np.array(offsets, dtype=np.int64)


# One lock for creating readers, so that two threads opening a dataset's first reader at
# once do not both open the file. A forked child gets a fresh one: a thread of the parent may
# have held it at the fork.
_OPEN_LOCK = threading.Lock()


def _fresh_open_lock() -> None:
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_open_lock)


def _aligned_magic(data: bytes, length: int) -> int:
    """Where the first 4-aligned copy of the magic number is in ``data[:length]``, or -1."""
    found = data.find(_MAGIC_BYTES, 0, length)
    while found >= 0 and found % 4:
        found = data.find(_MAGIC_BYTES, found + 1, length)
    return found


def _starts_record(header: Any) -> bool:
    """Whether ``header`` (8 bytes) is the first chunk header of a record."""
    if len(header) < _HEADER_BYTES:
        return False
    magic, word = _HEADER.unpack(header[:_HEADER_BYTES])
    return magic == _MAGIC and (word >> 29) in _FIRST_FLAGS


class _Reader:
    """One process's read-only descriptor of a ``.rec`` file.

    Threads read it at once with ``os.pread``. ``release`` closes it only once the last
    read that is under way has finished, so a close never pulls the descriptor from under a
    read (whose number the next ``open`` could otherwise reuse for another file).
    """

    def __init__(self, rec_path: str) -> None:
        self.pid = os.getpid()
        self.fd: Optional[int] = _open_file(rec_path, "RecordIO file")
        info = os.fstat(self.fd)
        self._identity = (info.st_dev, info.st_ino)
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False

    def acquire(self) -> bool:
        with self._lock:
            if self._closing:
                return False
            self._users += 1
            return True

    def done(self) -> None:
        with self._lock:
            self._users -= 1
            fd = self._take_fd_if_idle()
        if fd is not None:
            os.close(fd)

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def release(self) -> None:
        """Close the descriptor once no read uses it; in a forked child, close the inherited
        copy at once (only this process has it, and the parent's lock may be held)."""
        if self.pid != os.getpid():
            fd, self.fd = self.fd, None
            try:
                # Unless something in this process closed it and reused its number.
                info = os.fstat(fd) if fd is not None else None
                if info is not None and (info.st_dev, info.st_ino) == self._identity:
                    os.close(fd)
            except OSError:
                pass
            return
        with self._lock:
            self._closing = True
            fd = self._take_fd_if_idle()
        if fd is not None:
            os.close(fd)

    def _take_fd_if_idle(self) -> Optional[int]:
        if self._closing and self._users == 0 and self.fd is not None:
            fd, self.fd = self.fd, None
            return fd
        return None

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)
        if fd is not None and getattr(self, "pid", None) == os.getpid():
            self.fd = None
            try:
                os.close(fd)
            except OSError:
                pass


class RecordDataset(Dataset):
    """Raw records of an indexed RecordIO file, as ``bytes``, in ``.idx`` order.

    A Gluon ``Dataset`` (``transform``, ``transform_first``, ``shard`` and the rest work) that
    any number of worker processes and threads can read at once: every process opens its own
    descriptor of the ``.rec`` file on first use and reads it with ``os.pread``, and the
    dataset pickles without it. Every read checks the record's RecordIO frame.

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
        If either file cannot be read or is not a regular file, if the ``.idx`` file is
        malformed, or if it points past the end of the ``.rec`` file. Reading a record raises
        it too, naming the record, when the record is damaged.

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
        self._rec_path = rec_path
        self._idx_path = idx_path
        fd = _open_file(rec_path, "RecordIO file")  # readable, and a regular file
        try:
            self._rec_size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        self._keys, self._offsets = _parse_index(idx_path, rec_path)
        self._limits = self._check_offsets(self._rec_size)
        self._reader: Optional[_Reader] = None

    def _check_offsets(self, rec_size: int) -> np.ndarray:
        """Refuse positions past the end of the ``.rec``; return where each record must end."""
        past_end = np.flatnonzero(self._offsets > rec_size - _HEADER_BYTES)
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
        """Release this process's file descriptor. Reading again reopens it."""
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
        """This process's reader, acquired for one read: call ``done()`` after it."""
        while True:
            reader = self._reader
            if reader is None or reader.pid != os.getpid():
                with _OPEN_LOCK:
                    reader = self._reader
                    if reader is None or reader.pid != os.getpid():
                        if reader is not None:
                            reader.release()  # inherited through fork: close our copy
                        reader = self._reader = _Reader(self._rec_path)
            if reader.acquire():
                return reader
            # Another thread released it between our look and our acquire; open a new one.
            with _OPEN_LOCK:
                if self._reader is reader:
                    self._reader = None

    def _error(self, position: int, reason: str) -> RecordIOError:
        key, offset = int(self._keys[position]), int(self._offsets[position])
        return RecordIOError(
            f"{self._rec_path}: record {position} (key {key}, byte offset {offset}): {reason}",
            path=self._rec_path,
            index=position,
            key=key,
            offset=offset,
        )

    def _read(self, position: int) -> bytes:
        """The verified bytes of the record at ``position``."""
        try:
            reader = self._open_reader()
        except RecordIOError as exc:  # the file became unreadable, or was replaced
            reason = str(exc).replace(f"{self._rec_path}: ", "", 1)
            raise self._error(position, reason) from exc
        try:
            return self._read_frame(reader, position)
        except OSError as exc:
            raise self._error(position, f"cannot read the file: {exc.strerror or exc}") from exc
        finally:
            reader.done()

    def _read_frame(self, reader: _Reader, position: int) -> bytes:
        offset = int(self._offsets[position])
        limit = int(self._limits[position])
        where = "the next indexed record starts" if limit < self._rec_size else "the file ends"
        if offset % 4:
            raise self._error(
                position,
                "the .idx offset is not a multiple of 4, so no record can start there; the .idx "
                "is corrupt or belongs to another .rec",
            )
        header = reader.pread(_HEADER_BYTES, offset)
        if not header:
            raise self._error(position, "the file ends before this record; it was truncated")
        chunks = []
        start, flags = offset, _FIRST_FLAGS
        while True:
            if len(header) < _HEADER_BYTES:
                raise self._error(
                    position,
                    f"the file ends inside the chunk header at byte {start}; it was truncated",
                )
            magic, word = _HEADER.unpack(header)
            if magic != _MAGIC:
                what = "no record starts here" if start == offset else "a chunk header is corrupt"
                raise self._error(
                    position,
                    f"{what}: expected RecordIO's magic number at byte {start}, found "
                    f"0x{magic:08x}; the file is corrupt, or the .idx offset is wrong",
                )
            flag, length = word >> 29, word & _LENGTH_MASK
            if flag not in flags:
                raise self._error(
                    position,
                    f"the chunk header at byte {start} has continuation flag {flag}, expected "
                    f"{' or '.join(map(str, flags))}; the header is corrupt",
                )
            padded = (length + 3) & ~3
            end = start + _HEADER_BYTES + padded
            if end > limit:
                raise self._error(
                    position,
                    f"the length field at byte {start + 4} says {length} bytes, so the record "
                    f"would end at byte {end}, past byte {limit} where {where}; the file is "
                    f"corrupt or truncated",
                )
            if flag not in _LAST_FLAGS and length % 4:
                raise self._error(
                    position,
                    f"the chunk at byte {start} is continued but its length {length} is not a "
                    f"multiple of 4; the header is corrupt",
                )
            # The data, its padding and, when something follows, the next header.
            following = min(padded + _HEADER_BYTES, limit - start - _HEADER_BYTES)
            blob = reader.pread(following, start + _HEADER_BYTES)
            if len(blob) < padded:
                raise self._error(
                    position,
                    f"the file ends at byte {start + 8 + len(blob)}, inside this record; the "
                    f"file is corrupt or truncated",
                )
            view = memoryview(blob)
            if view[length:padded] != bytes(padded - length):
                raise self._error(
                    position,
                    f"the padding bytes at {start + _HEADER_BYTES + length}-"
                    f"{start + _HEADER_BYTES + padded - 1} are not zero; the length field at "
                    f"byte {start + 4} ({length}) is corrupt",
                )
            inside = _aligned_magic(blob, length)
            if inside >= 0:
                # The writer splits a record at every 4-aligned magic number, so a chunk that
                # holds one has swallowed a header: its length field is too large.
                raise self._error(
                    position,
                    f"its chunk at byte {start} runs over a record header at byte "
                    f"{start + _HEADER_BYTES + inside}; the length field ({length}) is corrupt",
                )
            chunks.append(view[:length])
            header = view[padded:]
            start = end
            if flag in _LAST_FLAGS:
                break
            flags = _NEXT_FLAGS
        if start < limit and not _starts_record(header):
            # A sparse .idx lists only some records: the next one must start right here.
            raise self._error(
                position,
                f"it ends at byte {start}, but no record header follows there and {where} "
                f"at byte {limit}; its length field, or the header after it, is corrupt",
            )
        if len(chunks) == 1:
            return bytes(chunks[0])
        return _MAGIC_BYTES.join(chunks)


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
# Gluon's record datasets under thread workers


class _ThreadRecordIO(mx.recordio.MXIndexedRecordIO):
    """A read-only ``MXIndexedRecordIO`` that shares an already parsed index instead of
    reading the ``.idx`` file again."""

    def __init__(
        self, idx_path: str, uri: str, idx: Dict[Any, int], keys: list, key_type: type
    ) -> None:
        self.idx_path = idx_path
        self.key_type = key_type
        self.fidx = None
        self._shared = (idx, keys)
        mx.recordio.MXRecordIO.__init__(self, uri, "r")  # opens, through open() below

    def open(self) -> None:
        mx.recordio.MXRecordIO.open(self)
        self.idx, self.keys = self._shared

    def close(self) -> None:
        mx.recordio.MXRecordIO.close(self)


class _PerThreadRecordIO:
    """Stands in for the ``MXIndexedRecordIO`` of a Gluon record dataset: each thread reads
    through its own handle, so one thread's seek cannot move another thread's read.

    The index (``keys`` and ``idx``) is the original handle's, shared read-only. Any other
    attribute is the calling thread's handle's.
    """

    def __init__(self, record: mx.recordio.MXIndexedRecordIO) -> None:
        uri = record.uri.value if hasattr(record.uri, "value") else record.uri
        self.uri = uri.decode("utf-8") if isinstance(uri, bytes) else str(uri)
        self.idx_path = record.idx_path
        self.idx = record.idx
        self.keys = record.keys
        self.key_type = record.key_type
        self._local = threading.local()

    def _handle(self) -> _ThreadRecordIO:
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self._local.handle = _ThreadRecordIO(
                self.idx_path, self.uri, self.idx, self.keys, self.key_type
            )
        return handle

    def read_idx(self, key: Any) -> Optional[bytes]:
        return self._handle().read_idx(key)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_local":
            raise AttributeError(name)
        return getattr(self._handle(), name)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_local"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()


# Gluon's vision.ImageRecordDataset is a RecordFileDataset.
_GLUON_RECORD_TYPES = (_gluon_dataset.RecordFileDataset,)


def _refuse(dataset: Any, where: str, why: str) -> TypeError:
    return TypeError(
        f"{where} is a {type(dataset).__name__}, a Gluon record dataset whose one file handle "
        f"threads would share, and shardloader cannot give it one handle per thread: {why}. "
        f"Use shardloader.recordio.RecordDataset or shardloader.recordio.ImageRecordDataset, "
        f"which any number of threads can read, or worker processes (thread_pool=False)"
    )


def _per_thread_copy(dataset: Any, where: str) -> Any:
    """A shallow copy of a Gluon record dataset whose record handle is per thread."""
    record = getattr(dataset, "_record", None)
    if not isinstance(record, mx.recordio.MXIndexedRecordIO):
        raise _refuse(
            dataset, where, f"its _record is a {type(record).__name__}, not an MXIndexedRecordIO"
        )
    if record.flag != "r":
        raise _refuse(dataset, where, f"its record file is open with flag {record.flag!r}")
    if not hasattr(dataset, "__dict__") or hasattr(type(dataset), "__slots__"):
        raise _refuse(dataset, where, "it cannot be copied attribute by attribute")
    copy = object.__new__(type(dataset))
    copy.__dict__.update(dataset.__dict__)
    copy._record = _PerThreadRecordIO(record)
    return copy


# Gluon's dataset wrappers and the attribute that holds what they wrap.
_WRAPPERS = (
    (_gluon_dataset._LazyTransformDataset, "_data"),  # transform, transform_first
    (_gluon_dataset._SampledDataset, "_dataset"),  # shard, take, sample
    (_gluon_dataset._FilteredDataset, "_dataset"),  # filter
    (_gluon_dataset.SimpleDataset, "_data"),
)


def _with(wrapper: Any, attribute: str, value: Any) -> Any:
    copy = object.__new__(type(wrapper))
    copy.__dict__.update(wrapper.__dict__)
    setattr(copy, attribute, value)
    return copy


def _safe(dataset: Any, where: str, done: Dict[int, Any]) -> Any:
    """``dataset``, or a copy with each Gluon record dataset in it given per-thread handles."""
    if id(dataset) in done:
        return done[id(dataset)]
    result = dataset
    if isinstance(dataset, RecordDataset):
        pass  # ours: threads read it with pread
    elif isinstance(dataset, _GLUON_RECORD_TYPES):
        result = _per_thread_copy(dataset, where)
    elif type(dataset) is _gluon_dataset.ArrayDataset:
        parts = [_safe(part, f"{where}._data[{i}]", done) for i, part in enumerate(dataset._data)]
        if any(new is not old for new, old in zip(parts, dataset._data)):
            result = _with(dataset, "_data", parts)
    else:
        for wrapper_type, attribute in _WRAPPERS:
            if type(dataset) is wrapper_type:
                inner = getattr(dataset, attribute)
                safe_inner = _safe(inner, f"{where}.{attribute}", done)
                if safe_inner is not inner:
                    result = _with(dataset, attribute, safe_inner)
                break
        else:
            _refuse_hidden(dataset, where)
    done[id(dataset)] = result
    return result


def _refuse_hidden(dataset: Any, where: str) -> None:
    """Refuse a dataset of another kind that holds a Gluon record dataset in an attribute."""
    attributes = getattr(dataset, "__dict__", None)
    if not isinstance(attributes, dict):
        return
    for name, value in attributes.items():
        # A short list or tuple may hold datasets; a long one holds samples.
        values = value if isinstance(value, (list, tuple)) and len(value) <= 64 else (value,)
        for item in values:
            if isinstance(item, _GLUON_RECORD_TYPES):
                raise _refuse(
                    item,
                    f"{where}.{name}",
                    f"it sits inside a {type(dataset).__name__}, which shardloader does not know "
                    f"how to copy",
                )


def thread_safe(dataset: Any) -> Any:
    """``dataset``, made safe to read from many threads at once if it holds Gluon's own record
    datasets.

    Gluon's ``RecordFileDataset`` and ``vision.ImageRecordDataset`` read through one
    ``MXIndexedRecordIO`` handle, a seek followed by a read on one stream, so threads that
    share it now and then get each other's records, without any error. This function finds
    such datasets, also inside ``transform``, ``transform_first``, ``shard``, ``take``,
    ``sample``, ``filter``, ``SimpleDataset`` and ``ArrayDataset``, and returns a shallow
    copy of the whole chain in which each of them reads through one handle per thread. Their
    samples are unchanged: Gluon's own ``__getitem__`` runs, on the same bytes.
    ``ShardedDataLoader`` applies it by itself when ``thread_pool=True`` and
    ``num_workers > 0``.

    Anything else, this package's ``RecordDataset`` and ``ImageRecordDataset`` included,
    comes back as the very same object.

    Raises
    ------
    TypeError
        For a Gluon record dataset this function cannot give per-thread handles, such as one
        held by a dataset class it does not know. The message names where it is.
    """
    return _safe(dataset, "dataset", {})


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
    """Write ``records`` under temporary names, then rename the pair into place."""
    temporaries = []
    writer = None
    done = False
    try:
        for path in (rec_path, idx_path):
            temporaries.append(_temporary_next_to(path))
        (rec_fd, tmp_rec), (idx_fd, tmp_idx) = temporaries
        # MXNet's writer opens both files by name and truncates them: they are ours, created
        # with O_EXCL, under names nobody could predict.
        writer = mx.recordio.MXIndexedRecordIO(tmp_idx, tmp_rec, "w")
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
        mode = 0o666 & ~_umask()  # mkstemp makes 0600 files; give them what open() would
        for fd, _ in temporaries:
            os.fchmod(fd, mode)
        os.replace(tmp_rec, rec_path)
        os.replace(tmp_idx, idx_path)
        done = True
    finally:
        if writer is not None:
            writer.close()
        for fd, path in temporaries:
            os.close(fd)
            if not done:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass


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
