"""``launch_local``: start a local ps-lite cluster on 127.0.0.1, supervise it, tear it down."""

from __future__ import annotations

import logging
import os
import shlex
import socket
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .._validate import check_int
from ._cluster import _Cluster, _Outcome
from ._nodes import LaunchResult, NodeProcess

_log = logging.getLogger("shardloader.launch")

_HOST = "127.0.0.1"
_DEFAULT_GRACE_PERIOD_S = 5.0

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
# The variables the launcher sets itself; an ``env`` that sets one is refused rather than
# silently overwritten (a DMLC_NODE_HOST given there would not be the address used).
_LAUNCHER_VARS = (
    "DMLC_ROLE",
    "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT",
    "DMLC_NODE_HOST",
    "DMLC_NUM_WORKER",
    "DMLC_NUM_SERVER",
)


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
        Variables added to the launcher's environment for every process. It may not set the
        ``DMLC_*`` variables the launcher sets (``ValueError``).
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
    With a ``train.py`` that trains with a ``dist_sync`` kvstore:

    ```python
    result = launch_local(['python', 'train.py'], num_workers=2, num_servers=1, timeout=600)
    result.worker_returncodes, result.failure  # ([0, 0], None) when both workers succeeded
    ```
    """
    argv = _check_command(cmd)
    num_servers = num_workers if num_servers is None else num_servers
    _check_env(env)
    port = _check_options(num_workers, num_servers, timeout, grace_period, port)
    node_env = _cluster_env(env, port, num_workers, num_servers, verbose)
    cluster = _Cluster(grace_period)
    outcome, stopped = cluster.run(_roles(argv, num_workers, num_servers), node_env, timeout)
    failure = outcome[1]
    hint = None
    if failure is not None and failure.startswith("scheduler"):
        hint = f" (is port {port} free on {_HOST}?)"
    return _result(cluster, outcome, stopped, port, hint)


def _check_command(cmd: Union[str, Sequence[str]]) -> List[str]:
    argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"cmd must be a non-empty command (str or list of str), got {cmd!r}")
    return argv


def _check_env(env: Optional[Mapping[str, str]]) -> None:
    set_here = sorted(set(env or {}) & set(_LAUNCHER_VARS))
    if set_here:
        raise ValueError(
            f"env sets {', '.join(set_here)}, which the launcher sets itself (DMLC_NODE_HOST "
            f"is {_HOST} here, or each host's address from hosts NAME=ADDRESS); remove it"
        )


def _check_options(
    num_workers: int,
    num_servers: int,
    timeout: Optional[float],
    grace_period: float,
    port: Optional[int],
) -> int:
    """Check ``launch_local``'s numbers; return the scheduler port (a free one if None)."""
    _check_numbers(num_workers, num_servers, timeout, grace_period)
    if port is None:
        return _free_port(_HOST)
    _check_port(port)
    return port


def _check_numbers(
    num_workers: int, num_servers: int, timeout: Optional[float], grace_period: float
) -> None:
    check_int("num_workers", num_workers, 1)
    check_int("num_servers", num_servers, 1)
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    if not grace_period >= 0:
        raise ValueError(f"grace_period must be a non-negative number, got {grace_period!r}")


def _check_port(port: object) -> None:
    if not (isinstance(port, int) and 0 < port < 65536):
        raise ValueError(f"port must be an int in 1..65535 or None, got {port!r}")


def _roles(argv: List[str], num_workers: int, num_servers: int) -> List[Tuple[str, int, List[str]]]:
    """What to start, in order: the scheduler, the servers, then the workers."""
    bootstrap = [sys.executable, "-c", _BOOTSTRAP]
    return [
        ("scheduler", 1, bootstrap),
        ("server", num_servers, bootstrap),
        ("worker", num_workers, argv),
    ]


def _result(
    cluster: _Cluster,
    outcome: _Outcome,
    stopped: List[NodeProcess],
    port: int,
    hint: Optional[str] = None,
) -> LaunchResult:
    """The ``LaunchResult``. A failure message gets ``hint`` and names what the teardown
    stopped; after a success, a warning names the processes it stopped."""
    returncode, failure, timed_out = outcome
    if failure is not None:
        failure += hint or ""
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
