"""The life of a process pool's workers: start, hand over the dataset, stop, reap; and what
a bare ``os.fork()`` of the main process must forget. ``process.ProcessPool`` drives them.

Start-up. Under ``fork`` a worker inherits the dataset, the batchify function and the
``worker_init_fn``. Under ``spawn`` and ``forkserver`` they must travel: every worker is
started (``launch``), and only then is each one sent them, pickled, on its pipe
(``hand_over``). Handed to ``Process`` as arguments instead, they would be written by
``Process.start()``, which waits for the new process to read all of them: with more than a
pipe's buffer, the workers would start one after another, each waiting for the last to
import its modules; and since CPython holds the read end of that pipe while it writes, a
worker that died first (a script without ``if __name__ == "__main__":``) left ``start()``
blocked for good. The worker reads the payload first thing (``worker.process_worker_main``);
one that cannot unpickle it says so as a failure to start. One that has not taken it within the
loader's ``timeout`` (it is stuck importing the main module) is killed, with every other worker
of the pool, and the start fails with a ``LoaderTimeoutError`` that says why.

They are pickled as multiprocessing pickles a process's arguments (``pickled``): locks,
queues and shared values pickle as they would for ``Process(args=...)``, and a file
descriptor (a ``Connection``, an MXNet array in shared memory) goes through
multiprocessing's resource sharer, from which the worker fetches it as it unpickles. A
descriptor can be fetched once, so each worker gets a pickling of its own.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import threading
import time
import weakref
from multiprocessing import context, resource_sharer
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..._errors import LoaderTimeoutError
from .. import protocol, timing
from ..ipc.sides import MainSide
from ..protocol import Failed
from ..worker import launching_worker_process
from .base import finalizing

__all__ = [
    "WorkerProcess",
    "launch",
    "pickled",
    "hand_over",
    "shutdown",
    "reap",
    "close_fd",
    "track",
    "untrack",
    "tracked",
]


class WorkerProcess:
    """One worker process, seen from the main process."""

    __slots__ = ("id", "key", "process", "conn", "owes", "failed")

    def __init__(self, worker_id: int, key: int, process, conn) -> None:
        self.id, self.key, self.process, self.conn = worker_id, key, process, conn
        # (iter_id, seq) of each batch sent and not yet answered: what it owes if it dies
        # (the router's registry has the rest: indices, epoch, retries).
        self.owes: Set[Tuple[int, int]] = set()
        self.failed: Optional[Failed] = None  # it could not start, and said why


class _Spawning:
    """Stands for the process being started while its payload is pickled, as
    multiprocessing's reducers expect (``context.get_spawning_popen()``): see the module
    docstring."""

    @staticmethod
    def duplicate_for_child(fd: int) -> int:
        return fd

    @staticmethod
    def DupFd(fd: int) -> Any:  # noqa: N802 - the name multiprocessing calls
        return resource_sharer.DupFd(fd)


def pickled(payload: Any) -> bytes:
    """``payload`` (``worker.Payload``) as one ``spawn`` or ``forkserver`` worker receives
    it on its pipe before anything else. Raises what pickling raises."""
    previous = context.get_spawning_popen()
    # typeshed lists the real Popen classes; what the reducers call is the two methods above.
    context.set_spawning_popen(_Spawning())  # type: ignore[arg-type]
    try:
        return bytes(ForkingPickler.dumps(tuple(payload)))
    finally:
        context.set_spawning_popen(previous)


def launch(
    ctx, worker_id: int, key: int, target, make_setup: Callable[[Any], Any]
) -> WorkerProcess:
    """Start ``target(make_setup(parent_conn), child_conn)`` in a new process of ``ctx``,
    over a fresh pipe (the set-up may name the main process's end: a forked worker lets go
    of it). Raises what ``Process.start()`` raises, with both pipe ends closed."""
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    process = ctx.Process(
        target=target,
        args=(make_setup(parent_conn), child_conn),
        name=f"shardloader-worker-{worker_id}",
        daemon=True,
    )
    try:
        with launching_worker_process():
            process.start()
    except BaseException:
        parent_conn.close()
        child_conn.close()
        raise
    child_conn.close()
    return WorkerProcess(worker_id, key, process, parent_conn)


def hand_over(w: WorkerProcess, payload: bytes, timeout: Optional[float], method: str) -> None:
    """Write ``payload`` to ``w``'s pipe; it returns once the worker has read it. A worker
    that died before reading it is left to the pool's ``poll()``, which reports its death.

    A worker that is alive but has not taken its payload within ``timeout`` seconds (it is
    stuck before reading it: importing the main module, say) is killed, and this raises
    ``LoaderTimeoutError``; the caller then stops the other workers. The write runs on a
    short-lived thread, which the kill ends (its pipe breaks); ``None``: no limit."""
    if timeout is None:
        _send(w.conn, payload)
        return
    sender = threading.Thread(
        target=_send, args=(w.conn, payload), name="shardloader-hand-over", daemon=True
    )
    sender.start()
    killed = False
    try:
        sender.join(timeout)
    finally:
        if sender.is_alive():  # not taken in time, or interrupted (Ctrl-C): end the write
            killed = True
            w.process.kill()
            sender.join()
    if killed:
        raise _not_taken(w, len(payload), timeout, method)


def _send(conn, payload: bytes) -> None:
    try:
        conn.send_bytes(payload)
    except (OSError, ValueError):
        pass  # the worker died (or was killed) before reading it


def _not_taken(w: WorkerProcess, nbytes: int, timeout: float, method: str) -> LoaderTimeoutError:
    return LoaderTimeoutError(
        f"{method} worker {w.id} (pid {w.process.pid}) did not take its start-up payload "
        f"(the dataset, batchify_fn and worker_init_fn, pickled: {nbytes / 1e6:.1f} MB) "
        f"within timeout={timeout}s. A {method} worker reads it right after importing the "
        f"program's main module; likely causes: a main module that blocks or runs for long "
        f"when imported (top-level code outside 'if __name__ == \"__main__\":' that reads a "
        f"stalled mount, waits on a lock or a server, or loads data), or a machine too busy "
        f"to start the workers within timeout (raise timeout=...). The workers were stopped; "
        f"start_method='fork' does not import the main module.",
        elapsed=timeout,
    )


def shutdown(workers: Dict[int, WorkerProcess], table: MainSide, owner: int) -> None:
    """Idempotent teardown shared by close() and the garbage-collection finalizer. A no-op
    in any process but the pool's owner: a child made with ``os.fork()`` runs this at its
    exit, and must not stop (or join, or unmap for) its parent's workers."""
    if os.getpid() != owner:
        return
    procs = list(workers.values())
    workers.clear()
    for w in procs:
        if not _writable(w.conn):
            continue  # its pipe is full (it stopped reading): it is terminated below
        try:
            w.conn.send_bytes(protocol.encode(protocol.STOP))
        except (OSError, ValueError):
            pass
    if not finalizing():
        deadline = time.monotonic() + timing.JOIN_TIMEOUT_S
        for w in procs:
            w.process.join(max(0.0, deadline - time.monotonic()))
    for w in procs:
        if w.process.is_alive():
            w.process.terminate()
    for w in procs:
        if not finalizing():
            w.process.join(timing.TERMINATE_TIMEOUT_S)
        reap(w)
    table.close()


def _writable(conn) -> bool:
    """Whether a short message to ``conn`` can be written now, without blocking."""
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLOUT)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return False


def close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def reap(w: WorkerProcess) -> None:
    """Kill ``w`` if it still runs, wait for it, and close its pipe and process handle."""
    if w.process.is_alive():
        w.process.kill()
        w.process.join(timing.TERMINATE_TIMEOUT_S)
    try:
        w.conn.close()
    except OSError:
        pass
    try:
        w.process.close()
    except ValueError:
        pass


# ------------------------------------------------------------------------ a bare os.fork()
_fork_handler_registered = False
_tracked: weakref.WeakSet[Any] = weakref.WeakSet()


def track(pool) -> None:
    """Count ``pool`` among the open pools until ``untrack``: a child made with
    ``os.fork()`` takes the processes of ``pool.connections()`` out of its table of children
    (see ``_forget_workers_in_child``), and a forked worker lets go of its pipes
    (``ipc.inherit``)."""
    global _fork_handler_registered
    if not _fork_handler_registered:
        os.register_at_fork(after_in_child=_forget_workers_in_child)
        _fork_handler_registered = True
    _tracked.add(pool)


def untrack(pool) -> None:
    _tracked.discard(pool)


def tracked() -> List[Any]:
    """The open process pools of this process."""
    return list(_tracked)


def _forget_workers_in_child() -> None:
    """In a child made with ``os.fork()``: take the parent's worker processes out of
    multiprocessing's table of this process's children. Otherwise multiprocessing's exit
    hook, which runs when the child exits normally, would SIGTERM them (they are daemonic)
    and then fail to join them ("can only join a child process"). A worker started with
    multiprocessing resets that table itself; a bare ``os.fork()`` does not, and the stdlib
    has no public way to say so, hence its private ``_children``."""
    children = getattr(mp.process, "_children", None)
    if children is None:
        return
    for pool in list(_tracked):
        for _, process in pool.connections():
            children.discard(process)
