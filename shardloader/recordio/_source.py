"""Where a record dataset's bytes come from: a local ``.rec``/``.idx`` pair, or a pair of
objects in S3-compatible storage. ``open_source`` picks by path; the readers see one
interface (``size``, ``index_lines``, ``reader``) and never ask which.

From object storage, the ``.rec`` is read in chunks: runs of neighbouring records, about
``_CHUNK_BYTES`` each and cut at record boundaries, each fetched by one ranged GET into the
per-machine cache (``_cache.RangeCache``). A record never straddles two chunks, so every read
of the frame checks lands in one chunk.

Read-ahead hides the latency of those GETs: when a process's reader misses a chunk, it also
starts fetching, on at most ``_AHEAD`` threads of its own, chunks not yet cached that lie
between the lowest and the highest record this reader has been asked for. That range never
leaves the machine's part when the part is a contiguous run of records (``shuffle=False``, or
``SplitSampler``); a shuffled part cut by ``PartitionSampler`` is spread over the whole file,
and so are its chunks. A read-ahead skips a chunk whose lock another process holds (it is
being fetched), keeps no bytes (they go to the cache), and keeps its error for the record that
needs the chunk.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict, deque
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Set, Tuple

import numpy as np

from .._errors import RecordIOError
from . import _s3
from ._files import _open_file, _Reader

_CHUNK_BYTES = 1 << 20
# Chunks a process keeps mapped from the cache, each checked once when mapped. The maps share
# the page cache with every other process of the machine.
_MEMORY_CHUNKS = 64
# Chunks a reader fetches ahead at once, each on its own thread; the threads end when there is
# nothing left to fetch, and with the reader.
_AHEAD = 4


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


class _ReadAhead:
    """Fetches chunks ahead of the reads on at most ``_AHEAD`` threads, each ending when the
    queue is empty; a failure is kept for ``wait`` on the same chunk."""

    def __init__(self, fetch: Callable[[int, int], None]) -> None:
        self._fetch = fetch
        self._lock = threading.Lock()
        self._queue: Deque[Tuple[int, int]] = deque()
        self._pending: Dict[int, threading.Event] = {}
        self._errors: Dict[int, BaseException] = {}
        self._threads: Set[threading.Thread] = set()
        self._closed = False

    def busy(self) -> int:
        return len(self._pending)

    def knows(self, start: int) -> bool:
        with self._lock:
            return start in self._pending or start in self._errors

    def start(self, start: int, stop: int) -> None:
        with self._lock:
            if self._closed or start in self._pending or start in self._errors:
                return
            self._pending[start] = threading.Event()
            self._queue.append((start, stop))
            if len(self._threads) >= _AHEAD:
                return
            thread = threading.Thread(target=self._run, name="shardloader-s3-read-ahead")
            self._threads.add(thread)
        thread.start()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                if not self._queue or self._closed:
                    self._threads.discard(me)
                    for start, _ in self._queue:  # closed: release whoever waits
                        self._pending.pop(start).set()
                    self._queue.clear()
                    return
                start, stop = self._queue.popleft()
            try:
                self._fetch(start, stop)
            except BaseException as exc:
                with self._lock:
                    self._errors[start] = exc
            with self._lock:
                self._pending.pop(start).set()

    def wait(self, start: int) -> None:
        """Wait for a read-ahead of the chunk at ``start``, if one runs; raise its failure."""
        with self._lock:
            event = self._pending.get(start)
        if event is not None:
            event.wait()
        with self._lock:
            error = self._errors.pop(start, None)
        if error is not None:
            raise error

    def close(self) -> None:
        """Start nothing more; wait for the fetches under way (bounded by the client's
        timeouts and retries)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for thread in threads:
            thread.join()


class _S3Reader:
    """One process's reader of a ``.rec`` object, with ``_Reader``'s interface."""

    def __init__(self, source: _S3Source, offsets: np.ndarray) -> None:
        self.pid = os.getpid()
        self._source = source
        self._starts = np.append(source.chunk_starts(offsets), source.size)
        self._memory: OrderedDict[int, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._asked: Optional[Tuple[int, int]] = None  # lowest and highest chunk asked for
        self._ahead = _ReadAhead(self._fetch_ahead)

    def acquire(self) -> bool:
        return True

    def done(self) -> None:
        pass

    def release(self) -> None:
        self._memory = OrderedDict()
        if self.pid == os.getpid():  # a forked copy has none of the threads, and drops it
            self._ahead.close()

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
                self._ahead.wait(start)
                data = self._source.fetch(start, stop)
            except RecordIOError as exc:
                raise _ChunkError(str(exc)) from exc
            assert data is not None  # fetch waits for the chunk's lock
            self._read_ahead(chunk)
            with self._lock:
                self._memory[start] = data
                while len(self._memory) > _MEMORY_CHUNKS:
                    self._memory.popitem(last=False)
        return data[offset - start : offset - start + size]

    def _read_ahead(self, chunk: int) -> None:
        """Start fetching the chunks after ``chunk`` (then those before it) that lie between
        the lowest and highest chunk asked for and are not cached yet."""
        with self._lock:
            low, high = self._asked or (chunk, chunk)
            low, high = min(low, chunk), max(high, chunk)
            self._asked = (low, high)
            memory = set(self._memory)
        order = list(range(chunk + 1, high + 1)) + list(range(low, chunk))
        looked = 0
        for ahead in order:
            if self._ahead.busy() >= _AHEAD or looked >= 4 * _AHEAD:
                return
            start, stop = int(self._starts[ahead]), int(self._starts[ahead + 1])
            if start in memory or self._ahead.knows(start):
                continue
            looked += 1
            if not self._source.cached(start, stop):
                self._ahead.start(start, stop)

    def _fetch_ahead(self, start: int, stop: int) -> None:
        data = self._source.fetch(start, stop, wait=False)
        if data is not None:
            data.close()


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

    def fetch(self, start: int, stop: int, wait: bool = True) -> Optional[mmap.mmap]:
        """Bytes ``[start, stop)``, from the cache or fetched into it; with ``wait=False``,
        ``None`` when another process or thread is fetching them now."""
        record: Callable[[int, int], None] = lambda a, b: self.requests.append((a, b))  # noqa: E731
        return self.cache.get(
            self.info, start, stop, lambda a, b: _s3.read_range(self.info, a, b, record), wait
        )

    def cached(self, start: int, stop: int) -> bool:
        return self.cache.holds(self.info, start, stop)

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
