"""The started processes of a local cluster: starting them, supervising them, and one
teardown of their process groups (``SIGTERM``, a grace period, ``SIGKILL``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

from .._engine.lifeline import parent_death_signal
from ._nodes import EXIT_TIMEOUT, NodeProcess, _exit_status

_log = logging.getLogger("shardloader.launch")

_POLL_INTERVAL_S = 0.05
# How long processes get to die after SIGKILL before the launcher stops waiting for them.
_KILL_WAIT_S = 2.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# What supervise() found: (returncode, failure, timed_out).
_Outcome = Tuple[int, Optional[str], bool]


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

    def run(
        self,
        roles: Sequence[Tuple[str, int, List[str]]],
        env: Dict[str, str],
        timeout: Optional[float],
    ) -> Tuple[_Outcome, List[NodeProcess]]:
        """Start each ``(role, count, argv)`` in order, supervise, and tear down in any case.

        Returns what ``supervise`` found and the processes the teardown stopped. An error
        while starting (``OSError``) or an interrupt propagates after the teardown."""
        try:
            for role, count, argv in roles:
                self.start(role, count, argv, env)
            outcome = self.supervise(timeout)
        finally:
            stopped = self.teardown()
        return outcome, stopped

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

    def supervise(self, timeout: Optional[float]) -> _Outcome:
        """Wait for the outcome; return ``(returncode, failure, timed_out)``."""
        deadline = None if timeout is None else self._started + timeout
        failed = self._wait_for_workers(deadline)
        if isinstance(failed, str):
            return 1, failed, False
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

    def _watch(self) -> Optional[str]:
        """Called at every poll: a failure that ends the run, or None. (None here.)"""
        return None

    def _wait_for_workers(self, deadline: Optional[float]) -> Union[None, NodeProcess, str]:
        """Wait until every worker exits 0 (None), one process fails (it), ``_watch`` finds a
        failure (its message), or the deadline."""
        while True:
            for proc in self._poll():
                if proc.returncode != 0:
                    return proc
            if not self._running_workers():
                return None
            failure = self._watch()
            if failure is not None:
                return failure
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(_POLL_INTERVAL_S)

    def _wait_for_servers(self, deadline: float) -> None:
        """Give the scheduler and servers until ``deadline`` to exit on their own."""
        while any(p.returncode is None for p in self.processes) and time.monotonic() < deadline:
            self._poll()
            time.sleep(_POLL_INTERVAL_S)

    def teardown(self) -> List[NodeProcess]:
        """Stop every process still running (``_stop_all``); return those it stopped.

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
            self._stop_all()
        return stopped

    def _stop_all(self) -> None:
        """Terminate, then kill, every group that still has a live member."""
        groups = self._live_groups()
        for proc in self.processes:
            if proc.pid in groups and not proc.stopped:
                _log.warning("%s exited but left processes in its group; stopping them", proc.name)
        self._stop_groups(groups)
        self._poll()

    def _stop_groups(self, groups: Set[int]) -> None:
        """``SIGTERM`` the groups, wait ``grace_period``, ``SIGKILL`` the survivors, wait."""
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


def _die_with_parent(parent_pid: int) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that makes the child get SIGTERM when the launcher dies (Linux).

    The signal follows the thread that forks the child, not the process (see
    ``shardloader._engine.lifeline``); that is sound here because the thread that starts the
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
