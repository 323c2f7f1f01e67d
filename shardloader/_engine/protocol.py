"""Every message of the data path, named: between the epochs and a pool, and on the pipe
between the main process and a worker process.

Between an epoch and its pool (``pools``), in one process: the epoch submits ``Task``s and
polls ``Result``s; a worker that ends while it owes batches comes back as ``WorkerLost``.
``iter_id`` names the epoch iterator a task belongs to (``router.Router`` routes results by
it); ``seq`` is a batch's position in its epoch (``reorder``).

On a worker process's pipe (``worker``, ``pools.process``), each message is one pickle:

* to the worker: a ``Work`` (a task, and the slot ids the main process is done with), a
  ``Release`` (slot ids only, sent at once when a large slot comes free) or ``STOP``;
* from the worker: a ``Failed`` (it could not start: seeding or ``worker_init_fn`` raised;
  the worker exits after sending it), or a ``Reply``: one ``Head`` per finished batch, the
  slots the worker created for them (``(slot_id, capacity)``; each slot's file descriptor
  follows the message on the socket), the slots it unmapped, and ``payloads``, one stream of
  pickles (a batch's skeleton, or a ``RemoteError``), the n-th ending at ``heads[n].end``.

The heads hold builtin types and this module's tuples only, so the main process can always
read them, and so always knows how many descriptors follow. The payloads come from one
pickler, so that they share a memo (a class is named once per message, which keeps a message
of many tiny batches as cheap as one pickle). Only they hold the user's classes: if one does
not unpickle in the main process, that batch alone fails, with a ``WorkerError`` that names
the class (``undecodable``).
"""

from __future__ import annotations

import errno
import functools
import io
import os
import pickle
from multiprocessing import reduction
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .._errors import ReadyError, RemoteError, SharedMemoryError, WorkerError, short_indices
from .ipc.fds import descriptor_limits

__all__ = [
    "Failed",
    "Head",
    "Release",
    "Reply",
    "Result",
    "STOP",
    "Task",
    "Work",
    "WorkerLost",
    "decode",
    "encode",
    "encode_reply",
    "payload_reader",
    "slot_error",
    "undecodable",
]

# ----------------------------------------------------------------- an epoch and its pool


class Task(NamedTuple):
    """A unit of work: one or more consecutive batches of one epoch."""

    iter_id: int
    epoch: int
    batches: List[Tuple[int, Sequence]]  # (seq, indices)


class Result(NamedTuple):
    """One batch, made (``ok``) or failed (``payload`` is then the error)."""

    iter_id: int
    seq: int
    ok: bool
    payload: Any  # the batch, a process pool's (skeleton, slot_id), or a RemoteError
    busy_s: float
    worker_id: int
    worker_key: int  # which incarnation of the worker (a restarted one gets a new key)


class WorkerLost(NamedTuple):
    """A worker that ended while it owed batches: a process that exited or was killed, or
    a thread that stopped on an error outside any batch (``error``, its record). The pools
    know only which batches a worker owes; their indices are in the router's registry."""

    worker_id: int
    pid: Optional[int]
    exitcode: Optional[int]
    batches: List[Tuple[int, int]]  # (iter_id, seq) of every batch it owed
    error: Optional[RemoteError] = None
    where: str = ""  # for a thread: what it was doing when it stopped


class LocalFailure:
    """A failed result's payload whose error is made in the training process (a batch that
    arrived but does not unpickle here, or whose slot could not be taken), waiting for the
    batch's indices: the pool knows only which batches a worker owes, and the router, whose
    registry holds the indices, calls ``resolve`` when the result arrives."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[Optional[Sequence]], BaseException]) -> None:
        self._make = make  # indices -> the error

    def resolve(self, indices: Optional[Sequence]) -> ReadyError:
        """The payload with the error made, naming ``indices``."""
        return ReadyError(self._make(indices))

    def rebuild(self) -> BaseException:
        """The error without its indices (for a result nobody resolved)."""
        return self._make(None)


# ------------------------------------------------------------- main process -> a worker


class Work(NamedTuple):
    task: Task
    released: List[int]  # slot ids the worker may reuse
    # Slots whose descriptor the main process could not take (out of descriptors, or the
    # mapping failed): the worker sends the descriptor again the next time it uses one.
    resend: Sequence[int] = ()


class Release(NamedTuple):
    released: List[int]
    resend: Sequence[int] = ()


STOP = None  # the worker exits


def encode(message: Any) -> memoryview:
    """A message to a worker process, as a buffer for ``Connection.send_bytes``."""
    return reduction.ForkingPickler.dumps(message, pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Any:
    return pickle.loads(data)


# ------------------------------------------------------------- a worker -> main process


class Failed(NamedTuple):
    """A worker process that could not start: ``where`` (``"worker_init_fn"``, say) raised
    ``error``. It is the worker's only message; the pool reports it with the worker's exit."""

    error: RemoteError
    where: str


class Head(NamedTuple):
    iter_id: int
    seq: int
    ok: bool
    busy_s: float
    slot_id: Optional[int]  # the slot holding the batch's arrays (None: no array)
    end: int  # where this result's pickle ends in ``payloads``


class Reply(NamedTuple):
    heads: List[Head]
    new_slots: List[Tuple[int, int]]  # (slot_id, capacity), each followed by its fd
    dropped: List[int]  # slot ids the worker unmapped
    payloads: bytes


def encode_reply(
    results: Sequence[Tuple[Task, int, bool, Any, float]],
    new_slots: List[Tuple[int, int]],
    dropped: List[int],
    worker_id: int,
) -> Tuple[bytes, List[Head], List[int]]:
    """A worker's reply for ``results`` (``(task, seq, ok, payload, busy_s)``, where an ok
    payload is ``(skeleton, slot_id)`` and another a ``RemoteError``): the bytes to send, the
    heads, and the slots whose batch could not be pickled (their result became an error;
    the worker takes the slot back)."""
    buf = io.BytesIO()
    pickler = _BatchPickler(buf, pickle.HIGHEST_PROTOCOL)
    heads, unsent = [], []
    for task, seq, ok, payload, busy in results:
        start = buf.tell()
        slot_id = None
        if ok:
            skeleton, slot_id = payload
            try:
                pickler.dump(skeleton)
            except Exception as exc:  # noqa: BLE001 - reported to the training loop instead
                _rewind(pickler, buf, start)
                if slot_id is not None:
                    unsent.append(slot_id)
                slot_id, ok = None, False
                payload = RemoteError.capture(
                    _unpicklable_batch(exc), worker_id, seq, dict(task.batches).get(seq)
                )
        if not ok:
            _dump_error(pickler, buf, payload)
        heads.append(Head(task.iter_id, seq, ok, busy, slot_id, buf.tell()))
    data = pickle.dumps(Reply(heads, new_slots, dropped, buf.getvalue()), pickle.HIGHEST_PROTOCOL)
    return data, heads, unsent


def _unpicklable_batch(exc: Exception) -> TypeError:
    return TypeError(
        f"batchify_fn returned an object that cannot be sent from a worker process "
        f"({type(exc).__name__}: {exc}). Return arrays, numbers, strings and lists, tuples "
        f"or dicts of them, or use thread_pool=True."
    )


def _dump_error(pickler: pickle.Pickler, buf: io.BytesIO, error: RemoteError) -> None:
    start = buf.tell()
    try:
        pickler.dump(error)
    except Exception:  # noqa: BLE001 - the indices hold something that won't pickle
        _rewind(pickler, buf, start)
        error.indices = _text(error.indices)
        pickler.dump(error)


def payload_reader(reply: Reply) -> Callable[[], Any]:
    """A function that unpickles the reply's payloads one by one, in order."""
    if len(reply.heads) == 1:  # the common case: the cheapest way to one object
        return functools.partial(pickle.loads, reply.payloads)
    return pickle.Unpickler(io.BytesIO(reply.payloads)).load


class _BatchPickler(pickle.Pickler):
    """Pickles a batch's leftovers (what is not a dense array in a slot). Sparse MXNet
    arrays go as their numpy parts: MXNet 2.x refuses to serialise a sparse array under its
    numpy shape semantics, which are on by default there."""

    def reducer_override(self, obj: Any) -> Any:
        stype = getattr(obj, "stype", None)
        if stype in ("csr", "row_sparse") and type(obj).__module__.startswith("mxnet."):
            parts = (
                (obj.data, obj.indices, obj.indptr) if stype == "csr" else (obj.data, obj.indices)
            )
            numpy_parts = tuple(part.asnumpy() for part in parts)
            return _rebuild_sparse, (stype, tuple(obj.shape), np.dtype(obj.dtype).str, numpy_parts)
        return NotImplemented


def _rebuild_sparse(stype: str, shape: tuple, dtype: str, parts: tuple) -> Any:
    """The sparse MXNet array that ``_BatchPickler`` sent, rebuilt from its numpy parts."""
    import mxnet as mx

    build = mx.nd.sparse.csr_matrix if stype == "csr" else mx.nd.sparse.row_sparse_array
    return build(parts, shape=shape, dtype=np.dtype(dtype))


def _rewind(pickler: pickle.Pickler, buf: io.BytesIO, start: int) -> None:
    """Drop a pickle that failed half-way, and the memo entries it may have made."""
    buf.seek(start)
    buf.truncate()
    pickler.clear_memo()


def _text(obj: Any) -> str:
    try:
        return repr(obj)[:1000]
    except Exception:  # noqa: BLE001
        return f"<{type(obj).__name__}>"


# ------------------------------------------------------- a payload that does not unpickle


class _ClassMissing(Exception):
    pass


class _Probe(pickle.Unpickler):
    """Unpickles like ``pickle.loads``, but says which class could not be found."""

    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except Exception as exc:  # noqa: BLE001 - whatever the import raised
            raise _ClassMissing(f"{module}.{name}", exc) from exc


def _missing_class(payloads: bytes, n: int) -> Optional[Tuple[str, BaseException]]:
    """The class whose import fails while unpickling payload ``n``, if that is the cause."""
    probe = _Probe(io.BytesIO(payloads))
    try:
        for _ in range(n + 1):
            probe.load()
    except _ClassMissing as found:
        return found.args
    except Exception:  # noqa: BLE001 - it fails some other way
        pass
    return None


def undecodable(exc: Exception, reply: Reply, n: int, worker_id: int, indices) -> WorkerError:
    """The error for result ``n`` of ``reply``, which arrived but does not unpickle here."""
    missing = _missing_class(reply.payloads, n)
    if missing is not None:
        name, why = missing
        cause = (
            f"it holds an object of class {name}, which cannot be imported here "
            f"({type(why).__name__}: {why})"
        )
    else:
        cause = f"{type(exc).__name__}: {exc}"
    head = reply.heads[n]
    what = "its batch" if head.ok else "its error report"
    error = WorkerError(
        f"worker {worker_id} finished batch {head.seq} (sample indices "
        f"{short_indices(indices)}), but {what} cannot be unpickled in the training process: "
        f"{cause}. Every class whose objects a batch holds, or that a worker raises, must be "
        f"importable here as well, under the same module name: define it in a module that "
        f"both processes import (not one only the workers load, in worker_init_fn say), or "
        f"convert such objects to builtin types or arrays in batchify_fn.",
        worker_id=worker_id,
        seq=head.seq,
        indices=indices,
    )
    error.__cause__ = exc
    return error


def dropped_with(seq: int, failed_seq: int, worker_id: int, indices) -> WorkerError:
    """The error for batch ``seq``, which came after the undecodable batch ``failed_seq`` in
    one message: they share a pickle memo, so it is dropped with it."""
    return WorkerError(
        f"batch {seq} (sample indices {short_indices(indices)}) came from worker {worker_id} "
        f"in one message with batch {failed_seq}, which could not be unpickled here, and was "
        f"dropped with it",
        worker_id=worker_id,
        seq=seq,
        indices=indices,
    )


# ------------------------------------------- a slot the training process could not take


def slot_error(worker_id: int, seq: int, err: int, capacity: int, indices) -> SharedMemoryError:
    """The error for batch ``seq``, whose slot (``capacity`` bytes) came from worker
    ``worker_id`` but could not be taken here: its descriptor was dropped (``EMFILE``), or
    mapping it failed with ``err``. The worker is healthy; only this batch is lost."""
    what = f"batch {seq} (sample indices {short_indices(indices)}) from worker {worker_id}"
    reason = f"[Errno {err}] {os.strerror(err)}" if err else "an unknown error"
    if err in (errno.EMFILE, errno.ENFILE):
        message = (
            f"the training process could not receive the shared memory of {what}: it is out "
            f"of file descriptors ({errno.errorcode[err]}: {os.strerror(err)}; "
            f"{descriptor_limits()}). Close files the program no longer needs, or raise the "
            f"limit (ulimit -n, or resource.setrlimit(resource.RLIMIT_NOFILE, ...)); fewer "
            f"workers or a smaller prefetch also need fewer at once. The worker is fine, and "
            f"the loader works again once descriptors are free."
        )
    else:
        message = (
            f"the training process could not map the {_size(capacity)} shared-memory slot of "
            f"{what}: mmap failed with {reason}. Its address space or memory is limited "
            f"(RLIMIT_AS or ulimit -v, vm.overcommit_memory, a cgroup memory limit): raise "
            f"the limit, or lower batch_size or prefetch. The worker is fine, and the loader "
            f"works again once memory is free."
        )
    return SharedMemoryError(
        err, message, worker_id=worker_id, seq=seq, indices=indices, nbytes=capacity
    )


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB ({nbytes} bytes)"
