"""The files under a record dataset: its parsed ``.idx`` index, and each process's read-only
descriptor of the ``.rec`` (``_Reader``)."""

from __future__ import annotations

import errno
import os
import stat
import threading
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from .._errors import RecordIOError
from ._format import (
    _INT64_MAX,
)


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


def _parse_index(
    idx_path: str, rec_path: str, lines: Iterable[bytes]
) -> Tuple[np.ndarray, np.ndarray]:
    """Keys and byte offsets from the ``lines`` of an ``.idx`` file, in file order, rejecting
    what MXNet's reader would misread."""
    keys: List[int] = []
    offsets: List[int] = []
    first_line: Dict[int, int] = {}
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
            raise _index_error(idx_path, number, f"key {key} repeats line {first_line[key]}", key)
        first_line[key] = number
        keys.append(key)
        offsets.append(offset)
    return np.array(keys, dtype=np.int64), np.array(offsets, dtype=np.int64)


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
        fd = self.fd
        assert fd is not None, "pread between acquire() and done() only"
        return os.pread(fd, size, offset)

    def release(self) -> None:
        """Close the descriptor once no read uses it; in a forked child, close the inherited
        copy at once (only this process has it, and the parent's lock may be held)."""
        if self.pid != os.getpid():
            fd, self.fd = self.fd, None
            try:
                # Unless something in this process closed it and reused its number.
                if fd is not None:
                    info = os.fstat(fd)
                    if (info.st_dev, info.st_ino) == self._identity:
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
