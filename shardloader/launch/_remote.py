"""``launch_hosts``: a ps-lite cluster spread over several hosts, each process started through a
remote command template (ssh by default), supervised and torn down from the launching machine.

Each node runs under ``_wrapper`` on its host. The launcher keeps a pipe to the wrapper's
stdin: closing it (teardown), the launcher dying, or the ssh connection ending makes the
wrapper stop the node's process group there. The wrapper's first line of stdout carries the
node's pid on its host; the rest of its stdout is copied to the launcher's. The scheduler runs
with ``PS_VERBOSE=1`` and its stderr goes through the launcher, which watches for ps-lite's
"the scheduler is connected to N workers and M servers": the cluster has formed. Without that
line within ``connect_timeout`` the run fails, naming the hosts that cannot reach the
scheduler.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import IO, BinaryIO, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._cluster import _KILL_WAIT_S, _POLL_INTERVAL_S, _Cluster, _die_with_parent
from ._hosts import (
    DEFAULT_REMOTE,
    Host,
    check_hosts,
    check_template,
    default_python,
    describe_placement,
    parse_hosts,
    place,
    probe_scheduler,
    remote_argv,
    wrapper_argv,
)
from ._local import (
    _BOOTSTRAP,
    _DEFAULT_GRACE_PERIOD_S,
    _DROPPED_VARS,
    _check_command,
    _check_env,
    _check_numbers,
    _check_port,
    _result,
)
from ._nodes import LaunchResult, NodeProcess
from ._wrapper import MARKER

_log = logging.getLogger("shardloader.launch")

_DEFAULT_CONNECT_TIMEOUT_S = 120.0
# Beyond grace + SIGKILL, how long a remote command may take to report that it stopped.
_REMOTE_MARGIN_S = 5.0
_PROBE_TIMEOUT_S = 5.0
# The scheduler (python -c "import mxnet") must listen within this, or connect_timeout if
# longer: importing MXNet alone can take several seconds on a loaded machine.
_SCHEDULER_START_S = 60.0
_FORMED = b"the scheduler is connected to"
_LISTENING = b"Bind to role=scheduler"
# ps-lite's PS_VERBOSE=1 lines, hidden unless the user asked for them (verbose=True).
_PS_VERBOSE_LINE = re.compile(rb"^\[[\d:]+\] \S*(van\.cc|zmq_van\.h):\d+: ")
# Exit code 255 is also ssh's own: a lost connection.
_SSH_EXIT = 255


class _Pump(threading.Thread):
    """Copies a remote node's stdout (or the scheduler's stderr) to the launcher's, reading
    the wrapper's pid line first; calls ``on_line`` with each line when given one."""

    def __init__(
        self,
        source: IO[bytes],
        target: BinaryIO,
        proc: Optional[NodeProcess] = None,
        on_line=None,
    ) -> None:
        super().__init__(daemon=True, name="shardloader.launch pump")
        self.source, self.target, self.proc, self.on_line = source, target, proc, on_line

    def run(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in iter(self.source.readline, b""):
                if self.proc is not None and line.startswith(MARKER.encode()):
                    self.proc.remote_pid = int(line[len(MARKER) :])
                    self.proc = None
                    continue
                if self.on_line is not None and not self.on_line(line):
                    continue
                self.target.write(line)
                self.target.flush()


class _RemoteCluster(_Cluster):
    """The nodes of ``launch_hosts``: started through the template, stopped through their
    wrappers."""

    def __init__(
        self,
        template: str,
        hosts: Sequence[Host],
        python: str,
        grace_period: float,
        connect_timeout: float,
        verbose: bool,
    ) -> None:
        super().__init__(grace_period)
        self.template, self.hosts, self.python = template, hosts, python
        self.connect_timeout, self.verbose = connect_timeout, verbose
        self.formed = threading.Event()
        self.listening_since: Optional[float] = None
        self.scheduler_at: Tuple[str, int] = ("", 0)
        self._pumps: List[_Pump] = []

    def start_node(
        self, role: str, index: int, host: Host, argv: List[str], env: Dict[str, str], cwd: str
    ) -> None:
        env = dict(env, DMLC_ROLE=role, DMLC_NODE_HOST=host.address)
        scheduler = role == "scheduler"
        if scheduler and not self.verbose:
            env["PS_VERBOSE"] = "1"  # its "connected" line tells that the cluster formed
        wrapped = wrapper_argv(self.python, cwd, env, _DROPPED_VARS, argv, self.grace_period)
        popen = subprocess.Popen(
            remote_argv(self.template, host, wrapped),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if scheduler else None,
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
        proc = NodeProcess(role, index, popen.pid, host=host.name)
        self._popens[popen.pid] = popen
        self.processes.append(proc)
        stdout = sys.stdout.buffer
        assert popen.stdout is not None  # stdout=PIPE above
        self._pumps.append(_Pump(popen.stdout, stdout, proc))
        if scheduler:
            assert popen.stderr is not None  # stderr=PIPE for the scheduler
            self._pumps.append(_Pump(popen.stderr, sys.stderr.buffer, on_line=self._scheduler_line))
        for pump in self._pumps[-1 - scheduler :]:
            pump.start()

    def _scheduler_line(self, line: bytes) -> bool:
        """Note the cluster forming; True to show the line."""
        if _FORMED in line:
            self.formed.set()
        elif _LISTENING in line and self.listening_since is None:
            self.listening_since = time.monotonic()
        return self.verbose or not (_PS_VERBOSE_LINE.match(line) and b"Check failed" not in line)

    def _watch(self) -> Optional[str]:
        """The cluster must form within ``connect_timeout`` of the scheduler listening (and
        the scheduler listen within ``_SCHEDULER_START_S``, or ``connect_timeout`` if longer,
        of the start)."""
        since = self.listening_since
        if since is None:
            waited, limit = self.elapsed_s(), max(self.connect_timeout, _SCHEDULER_START_S)
        else:
            waited, limit = time.monotonic() - since, self.connect_timeout
        if self.formed.is_set() or waited < limit:
            return None
        self.formed.set()  # report once
        address, port = self.scheduler_at
        if since is None:
            return (
                f"the scheduler on {self.hosts[0].name} did not start listening at "
                f"{address}:{port} within {limit:g} s"
            )
        failure = (
            f"the cluster did not form within {self.connect_timeout:g} s (connect_timeout) of "
            "the scheduler listening: "
            f"not every node reached the scheduler on {self.hosts[0].name} at {address}:{port}, "
            "where every node was told to connect (DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT)"
        )
        problems = probe_scheduler(
            self.template, self.hosts, self.python, address, port, _PROBE_TIMEOUT_S
        )
        if problems:
            failure += "; " + "; ".join(problems)
        else:
            failure += (
                "; every host can open a connection to it, so check that each host's nodes "
                "are reachable at its address (a firewall, a blocked port range) or raise "
                "connect_timeout"
            )
        return failure

    def _stop_all(self) -> None:
        """Close every wrapper's stdin (it stops its node's group: ``SIGTERM``, the grace
        period, ``SIGKILL``), wait for the remote commands to exit, and kill, naming them, the
        ones that do not."""
        for popen in self._popens.values():
            if popen.stdin is not None:
                with contextlib.suppress(OSError):
                    popen.stdin.close()
        wait_s = self.grace_period + _KILL_WAIT_S + _REMOTE_MARGIN_S
        self._wait_all(wait_s)
        for proc in self.processes:
            if proc.returncode is None:
                _log.error(
                    "could not confirm that %s stopped: its remote command did not exit "
                    "%g s after the launcher asked; processes may be left on %s",
                    proc.name,
                    wait_s,
                    proc.host,
                )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        self._wait_all(_KILL_WAIT_S)
        for pump in self._pumps:
            pump.join(_KILL_WAIT_S)

    def _wait_all(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while any(p.returncode is None for p in self.processes) and time.monotonic() < deadline:
            self._poll()
            time.sleep(_POLL_INTERVAL_S)


def launch_hosts(
    cmd: Union[str, Sequence[str]],
    hosts: Union[str, Sequence[str]],
    num_workers: int,
    num_servers: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    *,
    remote: str = DEFAULT_REMOTE,
    port: Optional[int] = None,
    grace_period: float = _DEFAULT_GRACE_PERIOD_S,
    connect_timeout: float = _DEFAULT_CONNECT_TIMEOUT_S,
    workdir: Optional[str] = None,
    verbose: bool = False,
) -> LaunchResult:
    """Run ``cmd`` as the workers of a ps-lite cluster spread over ``hosts``; wait for it.

    The scheduler runs on the first host; the servers, then the workers, round-robin over the
    hosts in order, the workers continuing where the servers stopped. Each process gets
    ``env``, the ``DMLC_*`` variables and its own host's address as ``DMLC_NODE_HOST``
    through the remote command; over ssh nothing else of the launcher's environment reaches
    it. Failures, the timeout and interrupts stop every process on every host, as with
    ``launch_local``.

    Parameters
    ----------
    cmd : str or sequence of str
        The worker command, as for ``launch_local``.
    hosts : str or sequence of str
        ``'h1,h2=10.0.0.2'``, ``'@FILE'`` (one entry a line), or a list of entries. An entry
        is ``NAME`` (the address is NAME resolved here) or ``NAME=ADDRESS``. ``NAME`` is what
        the template gets as ``{host}``; ``ADDRESS`` is the host's ``DMLC_NODE_HOST``.
    num_workers, num_servers, env, timeout, grace_period, verbose
        As for ``launch_local``.
    remote : str
        The command that runs a command on a host; ``{host}`` is replaced by its name, and
        ``{command}``, where present, by the command as one shell-quoted word (ssh hands it
        to a shell); without ``{command}`` the command's words are appended (``ip netns exec
        {host}``). Default: ssh in batch mode with keep-alives.
    port : int, optional
        The scheduler's port on the first host. Default: one free there a moment before.
    connect_timeout : float
        Seconds for every host to answer the check before start, and for the cluster to
        form once the scheduler listens (every worker must have called
        ``mx.kv.create`` by then). Past either, the run fails with code 1, naming the hosts
        at fault.
    workdir : str, optional
        The working directory of every process, on every host. Default: the current one.

    Returns
    -------
    LaunchResult
        As ``launch_local``'s; each ``NodeProcess`` also has ``host`` and ``remote_pid``.
        Hosts that fail the check before start give ``returncode`` 1, no processes, and the
        reasons in ``failure``.

    Raises
    ------
    ValueError
        Invalid arguments: a loopback address among several hosts, a template without
        ``{host}``, an ssh template without ``{command}``, ``env`` setting a ``DMLC_*``
        variable the launcher sets.
    """
    argv = _check_command(cmd)
    num_servers = num_workers if num_servers is None else num_servers
    _check_env(env)
    _check_numbers(num_workers, num_servers, timeout, grace_period)
    if port is not None:
        _check_port(port)
    if not connect_timeout > 0:
        raise ValueError(f"connect_timeout must be a positive number, got {connect_timeout!r}")
    check_template(remote)
    host_list = parse_hosts(hosts)
    workdir = os.getcwd() if workdir is None else workdir
    python = default_python()
    nodes = place(host_list, num_servers, num_workers)
    _log.info("placement: %s", describe_placement(nodes))

    cluster = _RemoteCluster(remote, host_list, python, grace_period, connect_timeout, verbose)
    problems, free_port = check_hosts(remote, host_list, python, workdir, connect_timeout)
    chosen = free_port if port is None else port
    if problems or chosen is None:
        failure = "; ".join(problems) or f"no free port on {host_list[0].name}"
        return LaunchResult(1, [], port or 0, "hosts not ready: " + failure, False, 0.0)
    port = chosen
    cluster.scheduler_at = (host_list[0].address, port)
    _log.info("scheduler at %s:%d on %s", host_list[0].address, port, host_list[0].name)

    node_env = dict(env or {})
    if verbose:
        node_env["PS_VERBOSE"] = "1"
    node_env.update(
        DMLC_PS_ROOT_URI=host_list[0].address,
        DMLC_PS_ROOT_PORT=str(port),
        DMLC_NUM_WORKER=str(num_workers),
        DMLC_NUM_SERVER=str(num_servers),
    )
    bootstrap = [python, "-c", _BOOTSTRAP]
    try:
        for role, index, host in nodes:
            command = argv if role == "worker" else bootstrap
            cluster.start_node(role, index, host, command, node_env, workdir)
        outcome = cluster.supervise(timeout)
    finally:
        stopped = cluster.teardown()
    failed = [p for p in cluster.processes if p.returncode not in (None, 0) and not p.stopped]
    hint = None
    if failed and failed[0].returncode == _SSH_EXIT:
        hint = f" (255 is also ssh's code for a lost connection to {failed[0].host})"
    return _result(cluster, outcome, stopped, port, hint)
