"""Exceptions raised by shardloader, and the record that carries a worker's error home.

Errors cross process boundaries as data (``RemoteError``), never as live exception
objects: a worker's exception may hold unpicklable state, and its traceback object cannot
be pickled at all. The main process rebuilds the original exception type when it can, so
``except KeyError`` in a training loop keeps working, and falls back to ``WorkerError``
when it cannot.
"""

from __future__ import annotations

import os
import signal
import traceback
import types
from typing import Optional, Sequence, Type

__all__ = [
    "ShardLoaderError",
    "WorkerError",
    "WorkerDiedError",
    "LoaderTimeoutError",
    "ClosedIteratorError",
    "RecordIOError",
    "RemoteError",
    "SharedMemoryError",
    "hide_internal_frames",
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


class SharedMemoryError(ShardLoaderError, OSError):
    """The training process could not take a batch's shared memory from a worker: it was out
    of file descriptors (``EMFILE``), or could not map the memory (``ENOMEM``: an address-space
    limit, overcommit, a cgroup limit). The worker is healthy and keeps running; the loader
    works again once the resource is free.

    Attributes
    ----------
    errno, strerror : int, str
        The operating system's error, as for any ``OSError``.
    worker_id : int or None
        The worker that sent the batch.
    seq : int or None
        The batch's sequence number within its epoch.
    indices : list or None
        The sample indices of that batch.
    nbytes : int or None
        The size of the shared memory that could not be taken.
    """

    def __init__(
        self,
        errno: int,
        message: str,
        *,
        worker_id: Optional[int] = None,
        seq: Optional[int] = None,
        indices: Optional[Sequence] = None,
        nbytes: Optional[int] = None,
    ) -> None:
        super().__init__(errno, message)
        self.worker_id = worker_id
        self.seq = seq
        self.indices = indices
        self.nbytes = nbytes

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class ClosedIteratorError(ShardLoaderError, ValueError):
    """The iterator or loader was used after ``close()``."""


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
    """A bounded textual form of a batch's sample indices for error messages. Never raises:
    a sampler may have yielded something that is not a list at all."""
    if indices is None:
        return "?"
    try:
        flat = list(indices)
    except Exception:  # noqa: BLE001 - a bare int, or anything else a sampler yielded
        return _safe_repr(indices)
    if len(flat) <= limit:
        return _safe_repr(flat)
    return f"{_safe_repr(flat[:limit])}... ({len(flat)} in all)"


def _safe_repr(obj) -> str:
    try:
        return repr(obj)
    except Exception as err:  # noqa: BLE001 - only for an error message
        return f"<{type(obj).__name__} object (repr() raised {type(err).__name__})>"


def _safe_str(exc: BaseException) -> str:
    """``str(exc)``, or a note saying that it raised: an exception whose ``__str__`` fails
    must still reach the training loop."""
    try:
        return str(exc)
    except BaseException as err:  # noqa: BLE001 - __str__ may raise anything
        return f"<str() of the {type(exc).__name__} raised {type(err).__name__}>"


# Frames in here are the worker loop's (worker.py, batch.py), before the user's own code.
_ENGINE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_engine") + os.sep


def _drop_engine_frames(summary: traceback.TracebackException) -> None:
    """Drop the worker loop's frames before the first frame of other code (the dataset's,
    ``batchify_fn``'s), in ``summary`` and the exceptions chained to it: the user's own
    frames come first. An error raised in the loop itself keeps every frame."""
    seen = set()
    current: Optional[traceback.TracebackException] = summary
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = list(current.stack)
        first = next((n for n, f in enumerate(frames) if not f.filename.startswith(_ENGINE_DIR)), 0)
        if first:
            current.stack = traceback.StackSummary.from_list(frames[first:])
        current = current.__cause__ or current.__context__


def _format_traceback(exc: BaseException) -> str:
    try:
        summary = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        _drop_engine_frames(summary)
        return "".join(summary.format())
    except BaseException as err:  # noqa: BLE001 - formatting must not lose the error
        return (
            f"{type(exc).__name__}: {_safe_str(exc)}\n"
            f"(its traceback could not be formatted: {type(err).__name__})\n"
        )


# Every frame in here is shardloader's own: the ones a user's traceback can do without.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Set (to anything but "" or "0") to keep shardloader's frames in tracebacks.
FULL_TRACEBACK_VARIABLE = "SHARDLOADER_FULL_TRACEBACK"


def hide_internal_frames(exc: BaseException) -> BaseException:
    """``exc`` with shardloader's own frames taken out of its traceback, to be raised from
    the frame the user called (an iterator's ``__next__``): the traceback then shows the
    user's line, that one frame, the user's own frames (a dataset's ``__getitem__``, a
    ``batchify_fn``) and the message, not the stages in between. The whole traceback stays
    on ``exc.shardloader_traceback``; ``SHARDLOADER_FULL_TRACEBACK=1`` keeps it in place."""
    if os.environ.get(FULL_TRACEBACK_VARIABLE, "") not in ("", "0"):
        return exc
    full = exc.__traceback__
    kept = []
    tb = full
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            kept.append(tb)
        tb = tb.tb_next
    trimmed = None
    for tb in reversed(kept):
        trimmed = types.TracebackType(trimmed, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    try:
        exc.shardloader_traceback = full  # type: ignore[attr-defined]
    except AttributeError:  # a class with __slots__: keep what can be kept
        return exc
    return exc.with_traceback(trimmed)


def _as_index_list(indices):
    """A batch's indices as a list when they are iterable; otherwise as given."""
    if indices is None:
        return None
    try:
        return list(indices)
    except Exception:  # noqa: BLE001 - a bare int from a bad batch sampler
        return indices


# Exceptions that must never be raised from an iterator's __next__ on a worker's behalf:
# the for loop would take them for the end of the epoch.
_ENDS_ITERATION = (StopIteration, StopAsyncIteration)


def resolve_class(module: str, qualname: str):
    """Import ``module`` and look up ``qualname`` in it, as unpickling does; raises what the
    import or lookup raises."""
    import importlib

    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class RemoteError:
    """A picklable record of an exception raised in a worker.

    Built in the worker with ``capture``, sent home, and turned back into an exception
    with ``rebuild`` in the process that consumes the batch. The exception's class crosses
    as its module and qualified name, not as a pickled class, so a class that only the
    worker can import does not make the record itself impossible to unpickle: ``rebuild``
    then raises a ``WorkerError`` that names the class.
    """

    __slots__ = (
        "exc_type",
        "type_module",
        "type_qualname",
        "type_name",
        "message",
        "traceback_text",
        "worker_id",
        "seq",
        "indices",
    )
    # What crosses a process boundary: the class object itself stays behind.
    _STATE = __slots__[1:]

    def __init__(
        self,
        exc_type,
        type_name,
        message,
        traceback_text,
        worker_id,
        seq,
        indices,
        type_module=None,
        type_qualname=None,
    ):
        self.exc_type = exc_type
        if exc_type is not None and type_module is None:
            type_module, type_qualname = exc_type.__module__, exc_type.__qualname__
        self.type_module = type_module
        self.type_qualname = type_qualname
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text
        self.worker_id = worker_id
        self.seq = seq
        self.indices = indices

    def __getstate__(self):
        return tuple(getattr(self, k) for k in self._STATE)

    def __setstate__(self, state):
        self.exc_type = None  # looked up by name when rebuilt
        for key, value in zip(self._STATE, state):
            setattr(self, key, value)

    @classmethod
    def capture(
        cls,
        exc: BaseException,
        worker_id: Optional[int],
        seq: Optional[int],
        indices: Optional[Sequence],
    ) -> RemoteError:
        """Record ``exc``. Never raises, whatever ``exc`` does in ``__str__`` and whatever
        the batch sampler yielded as ``indices``."""
        exc_type: Optional[Type[BaseException]] = type(exc)
        name = getattr(exc_type, "__name__", "exception")
        module = getattr(exc_type, "__module__", None)
        qualname = getattr(exc_type, "__qualname__", name)
        # Only name the class if the other side can import it by that name.
        if qualname != name or module in (None, "__main__"):
            exc_type, module, qualname = None, None, None
        return cls(
            exc_type,
            name,
            _safe_str(exc),
            _format_traceback(exc),
            worker_id,
            seq,
            _as_index_list(indices),
            module,
            qualname,
        )

    def describe(self, typed: bool = True) -> str:
        """The message of the error rebuilt in the training process: the original message
        first (what went wrong, often what to do), after its type's name when ``typed`` (for
        a ``WorkerError`` standing in for it; an error of the original type shows its name
        itself), then where it happened and the worker's traceback."""
        where = f"worker {self.worker_id}" if self.worker_id is not None else "the loader"
        message = (self.message or "").strip()
        head = ""
        if message:
            head = f"{self.type_name}: {message}\n" if typed else f"{message}\n"
        return (
            f"{head}Caught {self.type_name} in {where} while loading batch {self.seq} "
            f"(sample indices {short_indices(self.indices)}).\n"
            f"Original traceback (most recent call last, in the worker):\n"
            f"{self.traceback_text.rstrip()}"
        )

    def _class(self):
        """``(class, None)``, or ``(None, why it cannot be used)``."""
        if self.exc_type is not None:
            return self.exc_type, None
        if self.type_module is None:
            return None, None
        try:
            cls = resolve_class(self.type_module, self.type_qualname)
        except Exception as err:  # noqa: BLE001 - any failure to import means "cannot"
            return None, (
                f"its class {self.type_module}.{self.type_qualname} cannot be imported in "
                f"this process ({type(err).__name__}: {_safe_str(err)})"
            )
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            return None, f"{self.type_module}.{self.type_qualname} is not an exception class"
        return cls, None

    def rebuild(self) -> BaseException:
        """The exception to raise in the consumer: the original type if possible, else a
        ``WorkerError`` with the same message."""
        cls, why = self._class()
        error = None
        if cls is not None:
            if issubclass(cls, _ENDS_ITERATION):
                why = f"a {cls.__name__} raised in the training loop would end the epoch early"
            else:
                error, why = _instantiate(cls, self.describe(typed=False))
        if error is None:
            message = self.describe()
            if why:
                message = f"{message}\n(Raised as WorkerError: {why}.)"
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


class _Verbatim(str):
    """A message whose ``repr()`` is itself: ``KeyError.__str__`` shows its argument's
    ``repr()``, which would print a multi-line message as one line of ``\\n`` escapes."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str.__str__(self)

    def __reduce__(self):
        return str, (str(self),)  # anywhere else, a plain string


def _instantiate(cls, message: str):
    """``(cls(message), None)`` if that builds an instance whose ``str()`` works, else
    ``(None, why not)``. A constructor that needs other arguments is not worth a note: the
    message says which class was caught."""
    if issubclass(cls, KeyError):
        message = _Verbatim(message)
    try:
        error = cls(message)
    except Exception:  # noqa: BLE001 - a constructor that needs other arguments
        return None, None
    if not isinstance(error, cls):
        return None, None
    try:
        str(error)
    except Exception as err:  # noqa: BLE001 - its __str__ is broken: WorkerError says it
        return None, f"str() of a {cls.__name__} raises {type(err).__name__}"
    return error, None


class ReadyError:
    """A result payload that carries an exception made in the consuming process itself
    (a batch that arrived but could not be unpickled there); ``rebuild`` returns it."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def rebuild(self) -> BaseException:
        return self.error


# The public errors are shardloader's, whatever file defines them: tracebacks and the API
# reference name them ``shardloader.WorkerDiedError``, not by this private module, and pickle
# finds them there too (the package exports each one).
PUBLIC_ERRORS = (
    ShardLoaderError,
    WorkerError,
    WorkerDiedError,
    LoaderTimeoutError,
    ClosedIteratorError,
    RecordIOError,
    SharedMemoryError,
)
for _error in PUBLIC_ERRORS:
    _error.__module__ = "shardloader"
del _error
