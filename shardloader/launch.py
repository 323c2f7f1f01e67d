"""Run a command as the workers of a local ps-lite cluster, for MXNet's ``dist_sync`` kvstore.

``python -m shardloader.launch -n 2 -s 1 python train.py --lr 0.1`` starts, on 127.0.0.1:

- one **scheduler** and ``-s`` **servers** (default: as many as workers). Each runs
  ``python -c "import mxnet"``: with ``DMLC_ROLE`` set to ``scheduler`` or ``server``, importing
  MXNet enters ps-lite's serving loop (``mxnet.kvstore.kvstore_server``) and leaves the process
  once the workers have finalized;
- ``-n`` **workers**, each running the user's command. ``mx.kv.create('dist_sync')`` in a worker
  registers it with the scheduler, which assigns ``kv.rank`` once every node has registered.
  Ranks follow the scheduler's own ordering, not the launch order.

Every process gets the ps-lite variables: ``DMLC_ROLE``, ``DMLC_PS_ROOT_URI`` and
``DMLC_PS_ROOT_PORT`` (the scheduler's address), ``DMLC_NUM_WORKER``, ``DMLC_NUM_SERVER``, and
``DMLC_NODE_HOST`` (the address a node binds and advertises; without it ps-lite picks the first
network interface, which is not always reachable). ``DMLC_RANK`` is removed from the inherited
environment, because a node that already has one never takes the rank the scheduler assigns.
``PS_VERBOSE=1`` (``--verbose``) makes ps-lite log its connections.

Supervision and shutdown, one protocol for every way a run ends:

1. Each child starts in its own session, so its process group holds it and everything it forks
   (a loader's worker processes included), and Ctrl-C at a terminal reaches only the launcher.
   On Linux each child also asks the kernel for ``SIGTERM`` if the launcher dies, so even a
   launcher killed with ``SIGKILL`` leaves no scheduler, server or worker running. (Processes
   that a worker forked then depend on noticing their parent's death; nothing else is left to
   signal them.)
2. The launcher polls its children. The run fails at the first worker that exits non-zero (or
   is killed), at the first scheduler or server that exits non-zero, or when ``timeout``
   passes. It succeeds when every worker has exited 0; the scheduler and the servers are then
   given ``grace_period`` to exit on their own.
3. Teardown, in a ``finally`` and so also after ``KeyboardInterrupt`` or an error: ``SIGTERM``
   to every process group that still has a live member, wait up to ``grace_period``,
   ``SIGKILL`` to the groups still alive, reap. ``SIGINT`` and ``SIGTERM`` are held back while
   it runs, so an impatient second Ctrl-C cannot cut it short. A process that left its group
   (``setsid``) is outside this protocol.

The command line exits with the launcher's ``LaunchResult.returncode``: 0, the first failing
worker's exit code (``128 + signal`` for a worker killed by a signal), a failing scheduler's or
server's, 124 after ``--timeout``, ``128 + signal`` when the launcher is interrupted, 127 when
a command cannot be started.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import (
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from ._engine.lifeline import parent_death_signal
from ._errors import describe_exitcode
from ._validate import check_int

__all__ = ["LaunchResult", "NodeProcess", "launch_local", "main"]

_log = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_POLL_INTERVAL_S = 0.05
_DEFAULT_GRACE_PERIOD_S = 5.0
# How long processes get to die after SIGKILL before the launcher stops waiting for them.
_KILL_WAIT_S = 2.0
EXIT_TIMEOUT = 124
EXIT_CANNOT_START = 127

# Scheduler and server bootstrap. Importing mxnet serves the role and then calls sys.exit();
# reaching the second statement means the role never started, which must not look like success.
_BOOTSTRAP = (
    "import mxnet, os, sys; "
    "sys.exit('shardloader.launch: importing mxnet returned without serving DMLC_ROLE=%s' "
    "% os.environ.get('DMLC_ROLE'))"
)
# Inherited variables that would break the cluster: ps-lite keeps a preset DMLC_RANK instead of
# taking the rank the scheduler assigns.
_DROPPED_VARS = ("DMLC_RANK",)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
    """

    role: str
    index: int
    pid: int
    returncode: Optional[int] = None
    stopped: bool = False

    @property
    def name(self) -> str:
        """``'scheduler'``, ``'server 0'``, ``'worker 1'``…"""
        return self.role if self.role == "scheduler" else f"{self.role} {self.index}"

    def describe(self) -> str:
        """How the process ended, in words: ``'worker 1 (pid 42) exited with code 3'``."""
        return f"{self.name} (pid {self.pid}) {_describe_returncode(self.returncode)}"


@dataclass
class LaunchResult:
    """What ``launch_local`` observed.

    Attributes
    ----------
    returncode : int
        The launcher's exit status (see the module docstring); 0 on success.
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


class _Interrupted(BaseException):
    """Raised by the command line's signal handler, so that teardown runs in ``finally``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def launch_local(
    cmd: Union[str, Sequence[str]],
    num_workers: int,
    num_servers: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    *,
    port: Optional[int] = None,
    grace_period: float = _DEFAULT_GRACE_PERIOD_S,
    verbose: bool = False,
) -> LaunchResult:
    """Run ``cmd`` as the workers of a local ps-lite cluster and wait for it to finish.

    Parameters
    ----------
    cmd : str or sequence of str
        The worker command, such as ``['python', 'train.py']``. A string is split with
        ``shlex.split``; it does not go through a shell.
    num_workers : int
        Number of workers (``DMLC_NUM_WORKER``), at least 1.
    num_servers : int, optional
        Number of servers (``DMLC_NUM_SERVER``), at least 1. Default: ``num_workers``.
    env : mapping, optional
        Variables added to the launcher's environment for every process. The ``DMLC_*``
        variables the cluster needs are set after them.
    timeout : float, optional
        Seconds after which the whole cluster is stopped and the run fails with code 124.
    port : int, optional
        Scheduler port. Default: a free port chosen by the operating system.
    grace_period : float
        Seconds between ``SIGTERM`` and ``SIGKILL`` during teardown, and how long the scheduler
        and servers may take to exit after the workers succeed.
    verbose : bool
        Set ``PS_VERBOSE=1`` so that ps-lite logs its connections.

    Returns
    -------
    LaunchResult
        Exit codes, the failure message if any, and the launcher's own exit code. Failures of
        the cluster are reported here, not raised.

    Raises
    ------
    OSError
        When a process cannot be started (for example, the command does not exist). Whatever
        had started is torn down first.
    KeyboardInterrupt
        Re-raised after teardown.

    Examples
    --------
    >>> result = launch_local(['python', 'train.py'], num_workers=2, num_servers=1,
    ...                       timeout=600)  # doctest: +SKIP
    >>> result.worker_returncodes, result.failure  # doctest: +SKIP
    ([0, 0], None)
    """
    argv = _check_command(cmd)
    num_servers = num_workers if num_servers is None else num_servers
    check_int("num_workers", num_workers, 1)
    check_int("num_servers", num_servers, 1)
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    if not grace_period >= 0:
        raise ValueError(f"grace_period must be a non-negative number, got {grace_period!r}")
    if port is None:
        port = _free_port(_HOST)
    elif not (isinstance(port, int) and 0 < port < 65536):
        raise ValueError(f"port must be an int in 1..65535 or None, got {port!r}")

    node_env = _cluster_env(env, port, num_workers, num_servers, verbose)
    bootstrap = [sys.executable, "-c", _BOOTSTRAP]
    cluster = _Cluster(grace_period)
    try:
        cluster.start("scheduler", 1, bootstrap, node_env)
        cluster.start("server", num_servers, bootstrap, node_env)
        cluster.start("worker", num_workers, argv, node_env)
        returncode, failure, timed_out = cluster.supervise(timeout)
    finally:
        stopped = cluster.teardown()
    if failure is not None:
        if failure.startswith("scheduler"):
            failure += f" (is port {port} free on {_HOST}?)"
        if stopped:
            failure += "; stopped " + ", ".join(p.name for p in stopped)
    elif stopped:
        _log.warning(
            "the workers succeeded; stopped %s, which did not exit on their own",
            ", ".join(p.name for p in stopped),
        )
    return LaunchResult(
        returncode, cluster.processes, port, failure, timed_out, cluster.elapsed_s()
    )


class _Cluster:
    """The started processes, their supervision, and one idempotent teardown."""

    def __init__(self, grace_period: float) -> None:
        self.grace_period = grace_period
        self.processes: List[NodeProcess] = []
        self._popens: Dict[int, subprocess.Popen] = {}
        self._started = time.monotonic()
        self._torn_down = False

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def start(self, role: str, count: int, argv: List[str], env: Dict[str, str]) -> None:
        """Start ``count`` processes of one role, each in its own session."""
        env = dict(env, DMLC_ROLE=role)
        preexec = _die_with_parent(os.getpid())
        for index in range(count):
            popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=preexec,
            )
            self._popens[popen.pid] = popen
            self.processes.append(NodeProcess(role, index, popen.pid))
            _log.debug("started %s %d: pid %d", role, index, popen.pid)

    def supervise(self, timeout: Optional[float]) -> Tuple[int, Optional[str], bool]:
        """Wait for the outcome; return ``(returncode, failure, timed_out)``."""
        deadline = None if timeout is None else self._started + timeout
        failed = self._wait_for_workers(deadline)
        if failed is not None:
            return _exit_status(failed.returncode), failed.describe(), False
        running = self._running_workers()
        if running:
            names = ", ".join(p.name for p in running)
            return EXIT_TIMEOUT, f"timed out after {timeout:g} s with {names} still running", True
        self._wait_for_servers(time.monotonic() + self.grace_period)
        return 0, None, False

    def _poll(self) -> List[NodeProcess]:
        """Record return codes; return the processes that exited since the last call."""
        exited = []
        for proc in self.processes:
            if proc.returncode is None:
                code = self._popens[proc.pid].poll()
                if code is not None:
                    proc.returncode = code
                    exited.append(proc)
        return exited

    def _running_workers(self) -> List[NodeProcess]:
        return [p for p in self.processes if p.role == "worker" and p.returncode is None]

    def _wait_for_workers(self, deadline: Optional[float]) -> Optional[NodeProcess]:
        """Wait until every worker exits 0 (None), one process fails (it), or the deadline."""
        while True:
            for proc in self._poll():
                if proc.returncode != 0:
                    return proc
            if not self._running_workers():
                return None
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(_POLL_INTERVAL_S)

    def _wait_for_servers(self, deadline: float) -> None:
        """Give the scheduler and servers until ``deadline`` to exit on their own."""
        while any(p.returncode is None for p in self.processes) and time.monotonic() < deadline:
            self._poll()
            time.sleep(_POLL_INTERVAL_S)

    def teardown(self) -> List[NodeProcess]:
        """Terminate, then kill, every group that still has a live member; return those stopped.

        Idempotent. ``SIGINT`` and ``SIGTERM`` are blocked while it runs.
        """
        if self._torn_down:
            return []
        self._torn_down = True
        with _signals_blocked():
            self._poll()
            stopped = [p for p in self.processes if p.returncode is None]
            for proc in stopped:
                proc.stopped = True
            groups = self._live_groups()
            for proc in self.processes:
                if proc.pid in groups and not proc.stopped:
                    _log.warning(
                        "%s exited but left processes in its group; stopping them", proc.name
                    )
            if groups:
                _signal_groups(groups, signal.SIGTERM)
                groups = self._wait_groups(groups, time.monotonic() + self.grace_period)
            if groups:
                names = [p.name for p in self.processes if p.pid in groups]
                _log.warning(
                    "killing %s: still alive %g s after SIGTERM",
                    ", ".join(names),
                    self.grace_period,
                )
                _signal_groups(groups, signal.SIGKILL)
                groups = self._wait_groups(groups, time.monotonic() + _KILL_WAIT_S)
            if groups:
                _log.error("process groups %s survived SIGKILL", sorted(groups))
            self._poll()
        return stopped

    def _live_groups(self) -> Set[int]:
        """Groups (one per started process) with a running leader or any live member."""
        self._poll()
        groups = {p.pid for p in self.processes if p.returncode is None}
        members = _live_group_members({p.pid for p in self.processes})
        return groups | {pgid for pgid, pids in members.items() if pids}

    def _wait_groups(self, groups: Set[int], deadline: float) -> Set[int]:
        while True:
            groups &= self._live_groups()
            if not groups or time.monotonic() >= deadline:
                return groups
            time.sleep(_POLL_INTERVAL_S)


def _check_command(cmd: Union[str, Sequence[str]]) -> List[str]:
    argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"cmd must be a non-empty command (str or list of str), got {cmd!r}")
    return argv


def _cluster_env(
    extra: Optional[Mapping[str, str]],
    port: int,
    num_workers: int,
    num_servers: int,
    verbose: bool,
) -> Dict[str, str]:
    """The environment of every node but ``DMLC_ROLE``."""
    env = dict(os.environ)
    env.update(extra or {})
    for name in _DROPPED_VARS:
        env.pop(name, None)
    if verbose:
        env["PS_VERBOSE"] = "1"
    env.update(
        DMLC_PS_ROOT_URI=_HOST,
        DMLC_PS_ROOT_PORT=str(port),
        DMLC_NODE_HOST=_HOST,
        DMLC_NUM_WORKER=str(num_workers),
        DMLC_NUM_SERVER=str(num_servers),
    )
    return env


def _free_port(host: str) -> int:
    """A port that was free a moment ago. ps-lite picks its nodes' ports the same way."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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


def _die_with_parent(parent_pid: int) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that makes the child get SIGTERM when the launcher dies (Linux).

    The signal follows the thread that forks the child, not the process (see
    ``shardloader._lifeline``); that is sound here because the thread that starts the
    children is the one that supervises them and tears them down before it returns."""
    return parent_death_signal(signal.SIGTERM, parent_pid)


def _live_group_members(pgids: Set[int]) -> Dict[int, List[int]]:
    """For each process group in ``pgids``, its live (non-zombie) members, read from /proc.

    Returns an empty mapping where /proc is unavailable; the launcher then relies on the
    leaders' return codes alone.
    """
    members: Dict[int, List[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # Fields after the command name, which may itself contain spaces or parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp in pgids and state not in (b"Z", b"X"):
            members.setdefault(pgrp, []).append(int(entry))
    return members


def _signal_groups(groups: Set[int], signum: int) -> None:
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold back SIGINT and SIGTERM in this thread; they are delivered on exit."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m shardloader.launch",
        usage="%(prog)s [-h] -n NUM_WORKERS [-s NUM_SERVERS] [options] COMMAND [ARG ...]",
        description=(
            "Run COMMAND as the workers of a local ps-lite cluster for MXNet's dist_sync "
            "kvstore: one scheduler, NUM_SERVERS servers and NUM_WORKERS workers on "
            f"{_HOST}. Each worker's mx.kv.create('dist_sync') joins the cluster; kv.rank "
            "and kv.num_workers give its part of the data. If a worker fails or the timeout "
            "passes, every process is stopped, and the launcher exits with that worker's code "
            "(124 on timeout)."
        ),
        epilog=(
            "example: python -m shardloader.launch -n 2 -s 1 --timeout 600 "
            "python train.py --epochs 2"
        ),
    )
    parser.add_argument(
        "-n",
        "--num-workers",
        type=int,
        required=True,
        help="number of workers, each running COMMAND",
    )
    parser.add_argument(
        "-s",
        "--num-servers",
        type=int,
        default=None,
        help="number of servers (default: NUM_WORKERS)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="scheduler port, DMLC_PS_ROOT_PORT (default: a free port)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop everything and exit 124 after this many seconds",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=_DEFAULT_GRACE_PERIOD_S,
        metavar="SECONDS",
        help="wait between SIGTERM and SIGKILL when stopping (default: %(default)s)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set an environment variable in every process (repeatable)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="set PS_VERBOSE=1 so that ps-lite logs its connections",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="the worker command and its arguments; a '--' before it is optional",
    )
    return parser


def _parse_env(pairs: Sequence[str], parser: argparse.ArgumentParser) -> Dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            parser.error(f"--env expects NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted(signum)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the worker COMMAND is missing")
    env = _parse_env(args.env, parser)
    logging.basicConfig(format="shardloader.launch: %(message)s", level=logging.INFO)
    prog = parser.prog
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, _raise_interrupted)
    try:
        result = launch_local(
            command,
            args.num_workers,
            args.num_servers,
            env=env,
            timeout=args.timeout,
            port=args.port,
            grace_period=args.grace_period,
            verbose=args.verbose,
        )
    except ValueError as exc:
        parser.error(str(exc))
    except OSError as exc:
        print(f"{prog}: error: cannot start {shlex.join(command)}: {exc}", file=sys.stderr)
        return EXIT_CANNOT_START
    except _Interrupted as exc:
        name = signal.Signals(exc.signum).name
        print(f"{prog}: interrupted by {name}; stopped all processes", file=sys.stderr)
        return 128 + exc.signum
    if result.failure is not None:
        print(f"{prog}: error: {result.failure}", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
