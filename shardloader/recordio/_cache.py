"""The per-machine cache of byte ranges fetched from object storage.

One file per cached range, under ``<root>/objects/<object id>/<start>-<stop>``, where the
object id hashes the object's identity (bucket, key, size, ETag, modification time): a changed
object gets new entries and is never served stale. Each file ends with a BLAKE2b digest of its
data; a damaged entry fails the check, is removed and fetched again. Entries are written to a
temporary file and renamed, so readers see a whole entry or none, and a per-range lock file
makes the processes of one machine fetch each range once: the others wait, then read it from
the cache. When the cache grows past its bound, the least recently used entries are removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import tempfile
import threading
from typing import Callable, Optional

from .._folders import make_own_folder
from ._s3 import ObjectInfo

_DIGEST = 16
_DEFAULT_BYTES = 20 * 1024**3
_WHY = (
    "another user could plant data in it, which the loader would read as your records; the "
    "cache's checksums detect damage, not forgery"
)


def default_root() -> str:
    """``$XDG_CACHE_HOME/shardloader``, or ``~/.cache/shardloader``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shardloader")


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=_DIGEST).digest()


class RangeCache:
    """Cached byte ranges of objects, in the folder ``root`` (created if missing, refused if
    others can write to it), bounded to ``max_bytes``."""

    def __init__(self, root: Optional[str] = None, max_bytes: Optional[int] = None) -> None:
        self.root = os.path.abspath(os.fspath(root) if root is not None else default_root())
        self.max_bytes = _DEFAULT_BYTES if max_bytes is None else int(max_bytes)
        if self.max_bytes <= 0:
            raise ValueError(f"cache_bytes must be a positive int, got {max_bytes!r}")
        make_own_folder(self.root, "cache folder", _WHY, "cache_dir=")
        self._written = 0
        self._scanned = False
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def folder(self, info: ObjectInfo) -> str:
        """The folder of one version of an object."""
        identity = "\0".join(map(str, info))
        name = hashlib.sha256(identity.encode()).hexdigest()[:40]
        return os.path.join(self.root, "objects", name)

    def holds(self, info: ObjectInfo, start: int, stop: int) -> bool:
        """Whether an entry for bytes ``[start, stop)`` of ``info`` exists (unchecked)."""
        return os.path.exists(os.path.join(self.folder(info), f"{start}-{stop}"))

    def get(
        self,
        info: ObjectInfo,
        start: int,
        stop: int,
        fetch: Callable[[int, int], bytes],
        wait: bool = True,
    ) -> Optional[mmap.mmap]:
        """Bytes ``[start, stop)`` of ``info``, mapped from the cache (checked once, here), or
        first fetched by ``fetch(start, stop)``, once per machine, and cached. The map stays
        valid when the entry is evicted; it closes when no one holds it. With ``wait=False``,
        a range another process or thread is fetching now is left to it: ``None``."""
        folder = self.folder(info)
        path = os.path.join(folder, f"{start}-{stop}")
        data = self._load(path, stop - start)
        if data is not None:
            self.hits += 1
            return data
        os.makedirs(folder, mode=0o700, exist_ok=True)
        lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:  # another process may be fetching it now
                fcntl.flock(lock_fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return None
            data = self._load(path, stop - start)
            if data is not None:
                self.hits += 1
                return data
            self.misses += 1
            self._store(folder, path, fetch(start, stop))
            data = self._load(path, stop - start)
        finally:
            os.close(lock_fd)  # releases the lock
        if data is None:  # pragma: no cover - removed between our write and our read
            raise OSError(f"{path}: a cache entry vanished as it was written")
        self._evict_if_full(len(data))
        return data

    def _load(self, path: str, size: int) -> Optional[mmap.mmap]:
        try:
            with open(path, "rb") as f:
                length = os.fstat(f.fileno()).st_size
                blob = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if length else None
        except FileNotFoundError:
            return None
        if blob is not None and length == size + _DIGEST:
            with memoryview(blob) as view:
                good = _digest(view[:size]) == view[size:]
            if good:
                try:
                    os.utime(path)  # recently used
                except OSError:
                    pass
                return blob
        if blob is not None:
            blob.close()
        try:  # damaged: fetch it again
            os.unlink(path)
        except FileNotFoundError:
            pass
        return None

    def _store(self, folder: str, path: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.write(_digest(data))
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def _evict_if_full(self, added: int) -> None:
        with self._lock:
            self._written += added
            if self._scanned and self._written < self.max_bytes // 8:
                return
            self._written, self._scanned = 0, True
        self.evict()

    def evict(self) -> int:
        """Remove the least recently used entries until the cache fits its bound; the bytes
        it holds afterwards."""
        entries = []
        objects = os.path.join(self.root, "objects")
        for dirpath, _, names in os.walk(objects):
            for name in names:
                if name.endswith(".lock") or name.startswith(".tmp-"):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            total -= size
        return total
