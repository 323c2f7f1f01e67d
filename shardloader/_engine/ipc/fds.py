"""A slot's file descriptor, received from a worker (``SCM_RIGHTS``) without ever putting
the pipe out of step, and what to say when the process is out of descriptors.

``multiprocessing.reduction.recv_handle`` duplicates the pipe's descriptor before it reads
the message that carries the slot's: at the descriptor limit (``EMFILE``) the duplicate
fails before anything is read, the message stays in the pipe, and the next read takes its
byte for the start of a reply (a hang, or a healthy worker taken for dead). Here the message
is always read, from the pipe's own descriptor: if the kernel cannot install the descriptor
it carries, it drops it and says so (``MSG_CTRUNC``), and the pipe stays in step.
"""

from __future__ import annotations

import array
import os
import resource
import socket
from typing import Optional

_INT_SIZE = array.array("i").itemsize


def receive_fd(conn) -> Optional[int]:
    """The descriptor that the next message on ``conn`` (a ``multiprocessing`` connection
    over a Unix socket) carries, or ``None`` if the kernel could not install it here (out of
    descriptors). Raises ``EOFError`` when the pipe is closed."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=conn.fileno())
    try:
        sock.setblocking(True)  # as the connection itself: a default timeout would undo it
        data, ancdata, flags, _ = sock.recvmsg(1, socket.CMSG_SPACE(_INT_SIZE))
    finally:
        sock.detach()  # the descriptor stays the connection's
    if not data and not ancdata:
        raise EOFError("the worker's pipe is closed")
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % _INT_SIZE])
    for extra in fds[1:]:  # never sent, but never kept either
        os.close(extra)
    return fds[0] if fds else None


def descriptor_limits() -> str:
    """This process's descriptor limit (and how many are open, when that can be counted)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        open_now = f"{len(os.listdir('/proc/self/fd')) - 1} open, "
    except OSError:  # listing needs a descriptor too
        open_now = ""
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return f"{open_now}limit {soft} (RLIMIT_NOFILE; hard limit {hard_text})"
