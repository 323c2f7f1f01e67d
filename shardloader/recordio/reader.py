"""Reading: ``RecordDataset`` and ``ImageRecordDataset`` (see the package docstring for the
reading and checking protocol)."""

from __future__ import annotations

import operator
import os
import struct
import threading
from typing import Any, Callable, Optional, Union

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError
from mxnet.gluon.data import Dataset

from .._errors import RecordIOError
from . import _imagesize
from ._files import _parse_index, _Reader
from ._format import (
    _FIRST_FLAGS,
    _HEADER,
    _HEADER_BYTES,
    _LAST_FLAGS,
    _LENGTH_MASK,
    _MAGIC,
    _MAGIC_BYTES,
    _NEXT_FLAGS,
    PathLike,
    _aligned_magic,
    _default_idx_path,
    _last_line,
    _starts_record,
)
from ._source import open_source

# One lock for creating readers, so that two threads opening a dataset's first reader at
# once do not both open the file. A forked child gets a fresh one: a thread of the parent may
# have held it at the fork.
_OPEN_LOCK = threading.Lock()


def _fresh_open_lock() -> None:
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_open_lock)


class RecordDataset(Dataset):
    """Raw records of an indexed RecordIO file, as ``bytes``, in ``.idx`` order.

    A Gluon ``Dataset`` (``transform``, ``transform_first``, ``shard`` and the rest work) that
    any number of worker processes and threads can read at once: every process opens its own
    descriptor of the ``.rec`` file on first use and reads it with ``os.pread``, and the
    dataset pickles without it. Every read checks the record's RecordIO frame.

    Parameters
    ----------
    rec_path : str or os.PathLike
        The ``.rec`` file, or an object in S3-compatible storage, ``s3://bucket/key.rec``
        (needs the optional ``s3`` extra; see "Data in object storage" in
        docs/distributed.md).
    idx_path : str or os.PathLike, optional
        The ``.idx`` file; by default ``rec_path`` with its extension replaced by ``.idx``
        (for an ``s3://`` path, the same key with ``.idx``).
    cache_dir : str or os.PathLike, optional
        For ``s3://`` paths: the per-machine cache of fetched records, by default
        ``$XDG_CACHE_HOME/shardloader`` (``~/.cache/shardloader``). Refused if others can
        write to it.
    cache_bytes : int, optional
        For ``s3://`` paths: the cache's bound (default 20 GiB); the least recently used
        entries go first.

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

    def __init__(
        self,
        rec_path: PathLike,
        idx_path: Optional[PathLike] = None,
        *,
        cache_dir: Optional[PathLike] = None,
        cache_bytes: Optional[int] = None,
    ) -> None:
        rec_path = os.fspath(rec_path)
        idx_path = _default_idx_path(rec_path) if idx_path is None else os.fspath(idx_path)
        self._rec_path = rec_path
        self._idx_path = idx_path
        cache = None if cache_dir is None else os.fspath(cache_dir)
        self._source = open_source(rec_path, idx_path, cache, cache_bytes)
        self._rec_size = self._source.size
        self._keys, self._offsets = _parse_index(idx_path, rec_path, self._source.index_lines())
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
                        reader = self._reader = self._source.reader(self._offsets)
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
        header: Union[bytes, memoryview] = reader.pread(_HEADER_BYTES, offset)
        if not header:
            raise self._error(position, "the file ends before this record; it was truncated")
        chunks = []
        start, flags = offset, _FIRST_FLAGS
        while True:
            flag, length, padded, end = self._chunk_header(
                position, header, start, offset, flags, limit, where
            )
            # The data, its padding and, when something follows, the next header.
            following = min(padded + _HEADER_BYTES, limit - start - _HEADER_BYTES)
            blob = reader.pread(following, start + _HEADER_BYTES)
            view = self._chunk_data(position, blob, start, length, padded)
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

    def _chunk_header(self, position, header, start, offset, flags, limit, where):
        """Check the chunk header at byte ``start``; its ``(flag, length, padded, end)``."""
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
        return flag, length, padded, end

    def _chunk_data(self, position, blob, start, length, padded) -> memoryview:
        """Check a chunk's data, read from just after its header: present, zero-padded,
        and with no record header inside it."""
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
        return view


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
        The ``.rec`` file, or ``s3://bucket/key.rec`` (see ``RecordDataset``).
    idx_path : str or os.PathLike, optional
        The ``.idx`` file; by default next to ``rec_path``.
    flag : int, default 1
        1 decodes to 3 colour channels, 0 to 1 grey channel.
    transform : callable, optional
        ``transform(image, label)`` applied after decoding; its result is the sample.
    cache_dir, cache_bytes : optional
        For ``s3://`` paths, as in ``RecordDataset``.

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
        *,
        cache_dir: Optional[PathLike] = None,
        cache_bytes: Optional[int] = None,
    ) -> None:
        if flag not in (0, 1):
            raise ValueError(f"flag must be 1 (colour) or 0 (grey), got {flag!r}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None, got {type(transform).__name__}")
        super().__init__(rec_path, idx_path, cache_dir=cache_dir, cache_bytes=cache_bytes)
        self._flag = flag
        self._transform = transform

    @property
    def flag(self) -> int:
        """How images are decoded: 1 to 3 colour channels, 0 to 1 grey channel."""
        return self._flag

    @property
    def transform_fn(self) -> Optional[Callable[[Any, Any], Any]]:
        """The ``transform=`` given: ``transform(image, label)``, applied after decoding, or
        ``None``. (``transform`` itself is Gluon's ``Dataset.transform`` method.)"""
        return self._transform

    def __getitem__(self, idx: int) -> Any:
        position = self._position(idx)
        record = self._read(position)
        try:
            header, payload = mx.recordio.unpack(record)
            label = _header_label(header)
        except (struct.error, ValueError) as exc:
            raise self._error(position, f"no valid IRHeader ({exc})") from exc
        why = _imagesize.refusal(payload)  # a decompression bomb: refused before decoding
        if why is not None:
            raise self._error(position, why)
        try:
            image = mx.image.imdecode(payload, self._flag)
            # Decoding errors surface only when the result is awaited; raise them here.
            image.wait_to_read()
        except MXNetError as exc:
            raise self._error(position, f"not a decodable image ({_last_line(exc)})") from exc
        if self._transform is not None:
            return self._transform(image, label)
        return image, label
