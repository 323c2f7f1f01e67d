"""Where a record dataset's bytes come from: a local ``.rec``/``.idx`` pair, or a pair of
objects in S3-compatible storage. ``open_source`` picks by path; the readers see one
interface (``size``, ``index_lines``, ``reader``) and never ask which.

From object storage, the ``.rec`` is read in chunks: runs of neighbouring records, about
``_CHUNK_BYTES`` each and cut at record boundaries, each fetched by one ranged GET into the
per-machine cache (``_cache.RangeCache``). A record never straddles two chunks, so every read
of the frame checks lands in one chunk.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterable, List, Optional

import numpy as np

from .._errors import RecordIOError
from . import _s3
from ._files import _open_file, _Reader

_CHUNK_BYTES = 1 << 20
# Chunks a process keeps mapped from the cache, each checked once when mapped. The maps share
# the page cache with every other process of the machine.
_MEMORY_CHUNKS = 64


class _LocalSource:
    def __init__(self, rec_path: str, idx_path: str) -> None:
        self.rec_path, self.idx_path = rec_path, idx_path
        fd = _open_file(rec_path, "RecordIO file")  # readable, and a regular file
        try:
            self.size = os.fstat(fd).st_size
        finally:
            os.close(fd)

    def index_lines(self) -> Iterable[bytes]:
        with os.fdopen(_open_file(self.idx_path, "RecordIO index file"), "rb") as lines:
            yield from lines

    def reader(self, offsets: np.ndarray) -> _Reader:
        return _Reader(self.rec_path)


class _ChunkError(OSError):
    """A chunk could not be fetched; its message names the URL and the bytes."""


class _S3Reader:
    """One process's reader of a ``.rec`` object, with ``_Reader``'s interface."""

    def __init__(self, source: _S3Source, offsets: np.ndarray) -> None:
        self.pid = os.getpid()
        self._source = source
        self._starts = np.append(source.chunk_starts(offsets), source.size)
        self._memory: OrderedDict[int, Any] = OrderedDict()
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        return True

    def done(self) -> None:
        pass

    def release(self) -> None:
        self._memory = OrderedDict()

    def pread(self, size: int, offset: int) -> bytes:
        chunk = int(np.searchsorted(self._starts, offset, side="right")) - 1
        if chunk < 0 or chunk >= len(self._starts) - 1:
            return b""
        start = int(self._starts[chunk])
        with self._lock:
            data = self._memory.get(start)
            if data is not None:
                self._memory.move_to_end(start)
        if data is None:
            stop = int(self._starts[chunk + 1])
            try:
                data = self._source.fetch(start, stop)
            except RecordIOError as exc:
                raise _ChunkError(str(exc)) from exc
            with self._lock:
                self._memory[start] = data
                while len(self._memory) > _MEMORY_CHUNKS:
                    self._memory.popitem(last=False)
        return data[offset - start : offset - start + size]


class _S3Source:
    def __init__(
        self, rec_url: str, idx_url: str, cache_dir: Optional[str], cache_bytes: Optional[int]
    ) -> None:
        from ._cache import RangeCache

        self.rec_path, self.idx_path = rec_url, idx_url
        self.info = _s3.stat_object(rec_url)
        self.size = self.info.size
        self.cache = RangeCache(cache_dir, cache_bytes)
        # Every ranged GET this process made: (start, stop). For tests and benchmarks.
        self.requests: List[Any] = []

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["requests"] = []
        return state

    def index_lines(self) -> Iterable[bytes]:
        return _s3.read_object(self.idx_path).splitlines(keepends=True)

    def chunk_starts(self, offsets: np.ndarray) -> np.ndarray:
        """Where each chunk starts: at a record, once the chunk before holds about
        ``_CHUNK_BYTES``."""
        starts = np.unique(offsets[(offsets >= 0) & (offsets < self.size)])
        if not starts.size or starts[0] != 0:
            starts = np.insert(starts, 0, 0)
        cuts, last = [0], 0
        for start in starts[1:].tolist():
            if start - last >= _CHUNK_BYTES:
                cuts.append(start)
                last = start
        return np.array(cuts, dtype=np.int64)

    def fetch(self, start: int, stop: int) -> mmap.mmap:
        record: Callable[[int, int], None] = lambda a, b: self.requests.append((a, b))  # noqa: E731
        return self.cache.get(
            self.info, start, stop, lambda a, b: _s3.read_range(self.info, a, b, record)
        )

    def reader(self, offsets: np.ndarray) -> _S3Reader:
        return _S3Reader(self, offsets)


def open_source(
    rec_path: str,
    idx_path: str,
    cache_dir: Optional[str] = None,
    cache_bytes: Optional[int] = None,
) -> Any:
    """The source of ``rec_path``/``idx_path``: local files, or ``s3://`` objects read
    through the per-machine cache in ``cache_dir`` bounded to ``cache_bytes``."""
    if _s3.is_s3(rec_path):
        if not _s3.is_s3(idx_path):
            raise ValueError(
                f"idx_path must be an s3:// URL too when rec_path is one, got {idx_path!r}"
            )
        return _S3Source(rec_path, idx_path, cache_dir, cache_bytes)
    return _LocalSource(rec_path, idx_path)
