"""What a launch reports: the exit codes, each process of the cluster, and the result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .._errors import describe_exitcode

EXIT_TIMEOUT = 124
EXIT_CANNOT_START = 127


@dataclass
class NodeProcess:
    """One process of the cluster.

    Attributes
    ----------
    role : str
        ``'scheduler'``, ``'server'`` or ``'worker'``.
    index : int
        Launch order within the role. A worker's ``kv.rank`` is assigned by the scheduler and
        need not equal its index.
    pid : int
        Process id, which is also the id of the process group the launcher kills.
    returncode : int or None
        As ``subprocess.Popen.returncode``: negative for a signal; None while running.
    stopped : bool
        True when the launcher terminated the process during teardown.
    host : str or None
        With ``launch_hosts``: the name of the host it runs on; ``pid`` is then the local
        process of the remote command (``ssh``...) and ``remote_pid`` the process on the host.
    remote_pid : int or None
        With ``launch_hosts``: the pid of the command on its host, once it has started.
    """

    role: str
    index: int
    pid: int
    returncode: Optional[int] = None
    stopped: bool = False
    host: Optional[str] = None
    remote_pid: Optional[int] = None

    @property
    def name(self) -> str:
        """``'scheduler'``, ``'server 0'``, ``'worker 1'``, ``'worker 1 on h3'``…"""
        name = self.role if self.role == "scheduler" else f"{self.role} {self.index}"
        return name if self.host is None else f"{name} on {self.host}"

    def describe(self) -> str:
        """How the process ended, in words: ``'worker 1 (pid 42) exited with code 3'``."""
        if self.host is None:
            pid = f"pid {self.pid}"
        elif self.remote_pid is None:
            pid = f"not started on {self.host}; local pid {self.pid}"
        else:
            pid = f"pid {self.remote_pid}"
        return f"{self.name} ({pid}) {_describe_returncode(self.returncode)}"


@dataclass
class LaunchResult:
    """What ``launch_local`` observed.

    Attributes
    ----------
    returncode : int
        The launcher's exit status (see ``shardloader.launch``); 0 on success.
    processes : list of NodeProcess
        The scheduler, the servers, then the workers, in launch order.
    port : int
        The scheduler's port (``DMLC_PS_ROOT_PORT``).
    failure : str or None
        Why the run failed, naming the process and how it ended; None on success.
    timed_out : bool
        True when ``timeout`` passed before the workers finished.
    elapsed_s : float
        Wall time from the first start to the end of teardown.
    """

    returncode: int
    processes: List[NodeProcess]
    port: int
    failure: Optional[str] = None
    timed_out: bool = False
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every worker exited 0 and nothing else failed."""
        return self.returncode == 0

    @property
    def workers(self) -> List[NodeProcess]:
        """The worker processes, in launch order."""
        return [p for p in self.processes if p.role == "worker"]

    @property
    def worker_returncodes(self) -> List[Optional[int]]:
        """Each worker's return code, in launch order (negative: killed by that signal)."""
        return [p.returncode for p in self.workers]


def _describe_returncode(code: Optional[int]) -> str:
    """``describe_exitcode`` as a predicate: "is still running", "was killed by SIGTERM"."""
    how = describe_exitcode(code)
    if code is None:
        return f"is {how}"
    return f"was {how}" if code < 0 else how


def _exit_status(code: Optional[int]) -> int:
    """A shell-style exit status for a return code: negative signals become 128 + signal."""
    if code is None:
        return 1
    return 128 - code if code < 0 else code
