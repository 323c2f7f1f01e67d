"""Tie a child process's life to its parent's. One helper for the loader's worker processes
and for the launcher's nodes.

Linux offers ``prctl(PR_SET_PDEATHSIG)``: the kernel signals the child when its parent
goes away, even if the parent was killed with ``SIGKILL``. The catch is that "parent" means
the *thread* that forked the child, not the process: when that thread exits, the child is
signalled although the parent process is alive and well. So:

* ``parent_death_signal`` arms the signal. Call it only where the forking thread lives as
  long as the parent process needs the child (the main thread; a forkserver; a launcher
  thread that supervises its children until they end).
* ``start_lifeline`` covers every case, whichever thread forked: a daemon thread in the
  child waits on a pidfd of the parent process (or polls, where pidfds are missing) and
  ``SIGKILL``s the child as soon as the parent has exited. Being a Python thread, it needs
  the interpreter lock to act: a child stuck in native code that holds the lock dies when
  it lets go of it.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from typing import Callable, Optional

from . import timing

_PR_SET_PDEATHSIG = 1


def parent_death_signal(signum: int, parent_pid: Optional[int]) -> Optional[Callable[[], None]]:
    """A function that, run in a child, asks Linux for ``signum`` when the thread that forked
    it exits, and leaves at once (``os._exit(1)``) if ``parent_pid`` is no longer its parent
    (the parent died before the request took effect). ``parent_pid=None`` skips that check
    (a forkserver's child, whose parent the caller does not know).

    Prepared ahead, so that the returned function only calls ``prctl``, ``getppid`` and
    ``_exit``: it is safe as a ``preexec_fn``, between fork and exec. None off Linux.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    signum = int(signum)

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if parent_pid is not None and os.getppid() != parent_pid:
            os._exit(1)

    return arm


def start_lifeline(parent_pid: int, direct: bool) -> threading.Thread:
    """Start a daemon thread that ``SIGKILL``s this process once process ``parent_pid`` has
    exited. ``direct``: ``parent_pid`` forked this process itself (not a forkserver), which
    lets the check below prove that the pidfd names the parent and not a process that reused
    its pid. Call it early in the child."""
    try:
        pidfd: Optional[int] = os.pidfd_open(parent_pid)
    except (AttributeError, OSError):
        pidfd = None  # no pidfd (old kernel), or the parent is gone already
    ppid = os.getppid()
    if (direct and ppid != parent_pid) or (pidfd is None and not _alive(parent_pid)):
        os.kill(os.getpid(), signal.SIGKILL)  # the parent died while this process started
    thread = threading.Thread(
        target=_watch, args=(parent_pid, pidfd, ppid), name="shardloader-lifeline", daemon=True
    )
    thread.start()
    return thread


def _watch(parent_pid: int, pidfd: Optional[int], ppid: int) -> None:
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll():  # readable once the process has exited
            pass
    else:
        # A reparented child has lost its parent, even if the pid is in use again.
        while _alive(parent_pid) and os.getppid() == ppid:
            time.sleep(timing.LIFELINE_POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers signal 0: look at its state too.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")
