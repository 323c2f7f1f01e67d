"""What a forked worker inherits from shardloader in the main process, and lets go of.

A forked worker starts with copies of the main process's file descriptors and memory
mappings, among them other loaders' pipes and shared-memory slots. Right after the fork it
lets go of those that belong to shardloader (``forget``): the pipes of every open pool
(``foreign_fds`` lists them in the main process, before the fork) and every slot mapping.
So closing a loader frees its memory whatever other loaders exist (docs/design.md,
invariant 4). A batch that the main process holds is among those mappings: a dataset that
keeps another loader's batches must keep copies of them to use them in forked workers.
Everything else it inherited (the user's open files, MXNet's and Python's own descriptors)
stays: the dataset may need it.
"""

from __future__ import annotations

import mmap
import os
from typing import Iterable, List, Optional, Sequence

from .slots import SLOT_MEMFD_PATH
from .table import libc_mmap

__all__ = ["foreign_fds", "forget"]


def foreign_fds(own_conn, pools: Iterable) -> List[int]:
    """The shardloader descriptors that a worker forked now would inherit: the pipe ends
    and process sentinels of every worker of ``pools`` (open process pools), and the new
    worker's own pipe end ``own_conn``."""
    fds = [own_conn.fileno()]
    for pool in list(pools):
        for conn, process in pool.connections():
            try:
                fds.append(conn.fileno())
                fds.append(process.sentinel)
            except (OSError, ValueError):
                continue  # closed meanwhile
            # Under fork, multiprocessing also keeps the write end of a pipe whose read end
            # tells the worker that its parent is gone; it closes both at the end.
            closer = getattr(getattr(process, "_popen", None), "finalizer", None)
            fds.extend(fd for fd in getattr(closer, "_args", ()) if isinstance(fd, int))
    return fds


def forget(own_fd: int, foreign_fds: Sequence[int]) -> None:
    """Let go of what a forked worker inherited from shardloader in the main process.

    Descriptors: ``foreign_fds``, every other descriptor on the same pipe or socket (the
    other end of a process sentinel's pipe, a duplicate), and any slot memfd (the main
    process holds one for a moment while it maps a new slot). Each is pointed at
    ``/dev/null`` rather than closed, so that its number stays taken: a Python object that
    owned it in the main process (and so also here) may close that number some day, and must
    not close a descriptor of this worker's by then. Mappings: every slot mapping (none is
    this worker's yet) is replaced by an inaccessible reservation, which holds no memory.
    That includes slots whose batches the main process still holds: a dataset that holds
    such a batch cannot read it in a forked worker (it would crash with ``SIGSEGV``); it
    must hold a copy. Start-up costs a few hundred microseconds for this.
    """
    links = set()
    for fd in foreign_fds:
        if fd != own_fd:
            link = _fd_link(fd)
            if link is not None:
                links.add(link)
    doomed = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        names = [str(fd) for fd in foreign_fds]
    for name in names:
        fd = int(name)
        if fd <= 2 or fd == own_fd:
            continue
        link = _fd_link(fd)
        if link is not None and (link in links or link.startswith(SLOT_MEMFD_PATH)):
            doomed.append(fd)
    if doomed:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            for fd in doomed:
                os.dup2(null, fd, inheritable=False)
        finally:
            os.close(null)
    _drop_slot_mappings()


def _fd_link(fd: int) -> Optional[str]:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


# Not in Python's mmap module; the same on every Linux architecture.
_MAP_FIXED = 0x10
_PROT_NONE = 0


def _drop_slot_mappings() -> None:
    """In a freshly forked worker: let go of every slot mapping inherited from the main
    process (other loaders' batches), so that closing those loaders frees their memory.
    Each range is replaced by an inaccessible anonymous one, so nothing else lands there."""
    try:
        with open("/proc/self/maps") as maps:
            lines = [line for line in maps if SLOT_MEMFD_PATH in line]
    except OSError:
        return
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED | getattr(mmap, "MAP_NORESERVE", 0)
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith(SLOT_MEMFD_PATH):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        # Over the same range: the memfd loses this reference, the range stays reserved.
        libc_mmap().mmap(start, end - start, _PROT_NONE, flags, -1, 0)
