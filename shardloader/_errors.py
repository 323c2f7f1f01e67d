"""Exceptions raised by shardloader, and the record that carries a worker's error home.

Errors cross process boundaries as data (``RemoteError``), never as live exception
objects: a worker's exception may hold unpicklable state, and its traceback object cannot
be pickled at all. The main process rebuilds the original exception type when it can, so
``except KeyError`` in a training loop keeps working, and falls back to ``WorkerError``
when it cannot.
"""

from __future__ import annotations

import signal
import traceback
from typing import Optional, Sequence

__all__ = [
    "ShardLoaderError",
    "WorkerError",
    "WorkerDiedError",
    "LoaderTimeoutError",
    "ClosedIteratorError",
    "RemoteError",
]


class ShardLoaderError(Exception):
    """Base class of every error shardloader raises on its own account."""


class WorkerError(ShardLoaderError, RuntimeError):
    """A worker failed while producing a batch.

    Attributes
    ----------
    worker_id : int or None
        The worker that failed.
    seq : int or None
        The batch's sequence number within its epoch (0 for the first batch).
    indices : list or None
        The sample indices of that batch.
    remote_traceback : str
        The traceback text from the worker, or an empty string.
    """

    def __init__(
        self,
        message: str,
        *,
        worker_id: Optional[int] = None,
        seq: Optional[int] = None,
        indices: Optional[Sequence] = None,
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.seq = seq
        self.indices = indices
        self.remote_traceback = remote_traceback


class WorkerDiedError(WorkerError):
    """A worker process exited or was killed while it owed the loader a batch."""

    def __init__(
        self, message: str, *, pid: Optional[int] = None, exitcode: Optional[int] = None, **kwargs
    ) -> None:
        super().__init__(message, **kwargs)
        self.pid = pid
        self.exitcode = exitcode


class LoaderTimeoutError(ShardLoaderError, TimeoutError):
    """A batch took longer than the loader's ``timeout``."""

    def __init__(
        self,
        message: str,
        *,
        seq: Optional[int] = None,
        indices: Optional[Sequence] = None,
        elapsed: float = 0.0,
    ) -> None:
        super().__init__(message)
        self.seq = seq
        self.indices = indices
        self.elapsed = elapsed


class ClosedIteratorError(ShardLoaderError, ValueError):
    """The iterator or loader was used after ``close()``."""


def describe_exitcode(exitcode: Optional[int]) -> str:
    """Say how a process ended, naming the signal for a negative exit code."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name}"
    return f"exited with code {exitcode}"


def short_indices(indices: Optional[Sequence], limit: int = 16) -> str:
    """A bounded textual form of a batch's sample indices for error messages."""
    if indices is None:
        return "?"
    flat = list(indices)
    if len(flat) <= limit:
        return str(flat)
    return f"{flat[:limit]}... ({len(flat)} in all)"


class RemoteError:
    """A picklable record of an exception raised in a worker.

    Built in the worker with ``capture``, sent home, and turned back into an exception
    with ``rebuild`` in the process that consumes the batch.
    """

    __slots__ = (
        "exc_type",
        "type_name",
        "message",
        "traceback_text",
        "worker_id",
        "seq",
        "indices",
    )

    def __init__(self, exc_type, type_name, message, traceback_text, worker_id, seq, indices):
        self.exc_type = exc_type
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text
        self.worker_id = worker_id
        self.seq = seq
        self.indices = indices

    def __getstate__(self):
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state):
        for key, value in zip(self.__slots__, state):
            setattr(self, key, value)

    @classmethod
    def capture(
        cls,
        exc: BaseException,
        worker_id: Optional[int],
        seq: Optional[int],
        indices: Optional[Sequence],
    ) -> RemoteError:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        exc_type = type(exc)
        # Only send the class if the other side can import it by name.
        if exc_type.__qualname__ != exc_type.__name__ or exc_type.__module__ == "__main__":
            exc_type = None
        return cls(
            exc_type,
            type(exc).__name__,
            str(exc),
            text,
            worker_id,
            seq,
            list(indices) if indices is not None else None,
        )

    def describe(self) -> str:
        where = f"worker {self.worker_id}" if self.worker_id is not None else "the loader"
        return (
            f"Caught {self.type_name} in {where} while loading batch {self.seq} "
            f"(sample indices {short_indices(self.indices)}).\n"
            f"Original traceback (most recent call last, in the worker):\n"
            f"{self.traceback_text.rstrip()}"
        )

    def rebuild(self) -> BaseException:
        """The exception to raise in the consumer: the original type if possible."""
        message = self.describe()
        error = None
        if self.exc_type is not None and issubclass(self.exc_type, Exception):
            try:
                error = self.exc_type(message)
            except Exception:
                error = None
            if error is not None and not isinstance(error, self.exc_type):
                error = None
        if error is None:
            error = WorkerError(
                message,
                worker_id=self.worker_id,
                seq=self.seq,
                indices=self.indices,
                remote_traceback=self.traceback_text,
            )
        for key in ("worker_id", "seq", "indices"):
            try:
                setattr(error, key, getattr(self, key))
            except AttributeError:
                pass
        try:
            error.remote_traceback = self.traceback_text
        except AttributeError:
            pass
        return error
