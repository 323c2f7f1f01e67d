"""Shared fixtures: the leak check that wraps every multiprocess test; markers for tests
that only one MXNet version can run."""

from __future__ import annotations

import gc
import os
import re
import signal
import threading
import time
from contextlib import contextmanager
from multiprocessing import forkserver, resource_tracker

import mxnet as mx
import psutil
import pytest

# The scenario wall-time table, printed with the summary: a pytest hook of this conftest.
from _scenario_times import SCENARIO_TIMES, pytest_terminal_summary  # noqa: F401

from shardloader._engine.ipc import lease
from shardloader._engine.ipc.slots import SLOT_MEMFD_PATH

# The suite runs under MXNet 1.9.1 (`make test`, the default) and 2.0.0b1 (`make test-mx2`).
MX_VERSION = tuple(int(n) for n in re.findall(r"\d+", mx.__version__)[:2])
MX2 = MX_VERSION >= (2, 0)
# The array type of batches by default (2.x turns numpy semantics on at import), and the
# module that makes arrays of that type, for samples that Gluon's own batchify accepts.
ARRAY_TYPE = mx.np.ndarray if MX2 else mx.nd.NDArray
ARRAYS = mx.np if MX2 else mx.nd
# Gluon's Python pipeline under either version: with workers and try_nopython=None, Gluon 2.x
# silently switches qualifying loaders to its C++ pipeline (tuples, float32 values).
GLUON_PYTHON = {"try_nopython": False} if MX2 else {}


# MXNet 2.0 logs which storage manager it picked, to stderr, in every process that uses it.
_MXNET_STARTUP_LINE = re.compile(
    r"^\[[\d:]+\] \S*storage\.cc:\d+: Using Pooled .*StorageManager.*$"
)


def without_mxnet_banner(stderr: str) -> str:
    """``stderr`` without MXNet 2.0's start-up line ("storage.cc:202: Using Pooled (Naive)
    StorageManager for CPU"), which tells nothing about the program."""
    return "\n".join(line for line in stderr.splitlines() if not _MXNET_STARTUP_LINE.match(line))


def where(array):
    """The device (context, in 1.x) an MXNet array lives on, without 2.x's deprecation."""
    return array.device if MX2 else array.context


def requires_mx1(why: str):
    """Mark a test that only MXNet 1.x can run; ``why`` names what of 1.x it needs, e.g.
    ``@requires_mx1("mx.mod.Module, which 2.x removed")``. Skipped under 2.x, with the
    reason in pytest's summary."""
    return pytest.mark.skipif(MX2, reason=f"MXNet 1.x only: {why} (mxnet {mx.__version__})")


def requires_mx2(why: str):
    """Mark a test that only MXNet 2.x can run, e.g.
    ``@requires_mx2("try_nopython=True, 2.x's C++ pipeline")``."""
    return pytest.mark.skipif(not MX2, reason=f"MXNet 2.x only: {why} (mxnet {mx.__version__})")


def pytest_configure(config):
    # The subset that CI runs under MXNet 2.0 (`make test-mx2-smoke`): loader, workers,
    # sharding, devices, resume, try_nopython, 2.x's names, the fork-after-training
    # scenario. Kept to a couple of minutes on 2 cores.
    config.addinivalue_line(
        "markers", "mx2_smoke: part of the MXNet 2.0 smoke run in CI (make test-mx2-smoke)"
    )


def pytest_report_header(config):
    mode = "numpy semantics (mx.np) by default" if MX2 else "legacy mx.nd by default"
    return f"mxnet {mx.__version__}: {mode}"


@contextmanager
def sigint_ignored():
    """Start processes in the ``with`` block with SIGINT ignored, as a shell starts a
    background job (``cmd &``): a program that relies on Ctrl-C must set its own handler."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# How long the leak check waits for children, threads and memory to go away.
_SETTLE_TIMEOUT_S = 10.0
# Shared memory of the test's own processes that is not shardloader's (MXNet's, Gluon's
# loader's, Python's) may grow this much (in kB); shardloader's slots may not grow at all.
_SHMEM_TOLERANCE_KB = 4096
# What /proc names shared memory as: memfds (shardloader's slots among them), POSIX shared
# memory, System V segments and anonymous shared mappings.
_SHARED_MEMORY_PATHS = ("/memfd:", "/dev/shm/", "/SYSV", "/dev/zero")


class SharedObject:
    """One shared-memory object that a test's process maps or holds a descriptor of."""

    __slots__ = ("name", "kb", "holders")

    def __init__(self, name: str, kb: int) -> None:
        self.name, self.kb, self.holders = name, kb, set()

    @property
    def ours(self) -> bool:
        """Whether it is one of shardloader's slots."""
        return self.name.startswith(SLOT_MEMFD_PATH)

    def __repr__(self) -> str:
        pids = ", ".join(map(str, sorted(self.holders)))
        return f"{self.name} ({self.kb} kB, held by pid {pids})"


def _shared_name(path: str) -> str:
    return path[: -len(" (deleted)")] if path.endswith(" (deleted)") else path


def _held_shared_memory(pid: int, found: dict) -> None:
    """Add to ``found`` the shared memory that process ``pid`` has a descriptor of, keyed by
    (device, inode): two processes holding one memfd hold its memory once."""
    base = f"/proc/{pid}/fd"
    for name in os.listdir(base):
        try:
            link = os.readlink(f"{base}/{name}")
            if not link.startswith(_SHARED_MEMORY_PATHS):
                continue
            st = os.stat(f"{base}/{name}")
        except OSError:
            continue  # closed meanwhile
        obj = found.setdefault((st.st_dev, st.st_ino), SharedObject(_shared_name(link), 0))
        obj.kb = max(obj.kb, st.st_blocks // 2)  # pages it holds, not its nominal size
        obj.holders.add(pid)


# Where a line of /proc/PID/maps may map shared memory: a path that starts with one of
# _SHARED_MEMORY_PATHS (each such line is checked field by field below). A process with
# MXNet loaded maps a thousand lines, nearly all of them libraries: one search of the whole
# text instead of a split of each line keeps the leak check, run around every test, quick.
_MAYBE_SHARED = re.compile(" (?:" + "|".join(re.escape(p) for p in _SHARED_MEMORY_PATHS) + ")")


def _maybe_shared_lines(text: str):
    """The lines of ``text`` (a maps file) in which ``_MAYBE_SHARED`` occurs, each once."""
    lines, last = [], -1
    for match in _MAYBE_SHARED.finditer(text):
        start = text.rfind("\n", 0, match.start()) + 1
        if start == last:
            continue
        end = text.find("\n", match.end())
        lines.append(text[start : len(text) if end < 0 else end + 1])
        last = start
    return lines


def _mapped_shared_memory(pid: int, found: dict) -> None:
    """Add to ``found`` the shared memory that process ``pid`` maps."""
    with open(f"/proc/{pid}/maps") as maps:
        lines = [line.split(None, 5) for line in _maybe_shared_lines(maps.read())]
    sizes: dict = {}
    for fields in lines:
        if len(fields) < 6 or not fields[5].startswith(_SHARED_MEMORY_PATHS):
            continue
        if fields[5].startswith("/dev/zero") and fields[1][3] != "s":
            continue  # a private mapping of /dev/zero is ordinary memory
        major, minor = (int(x, 16) for x in fields[3].split(":"))
        key = (os.makedev(major, minor), int(fields[4]))
        start, end = (int(x, 16) for x in fields[0].split("-"))
        try:  # the pages the object holds (root, or a kernel that lets owners read it)
            kb = os.stat(f"/proc/{pid}/map_files/{fields[0]}").st_blocks // 2
        except OSError:
            kb = sizes.get(key, 0) + (end - start) // 1024  # else what this process maps
        sizes[key] = kb
        obj = found.setdefault(key, SharedObject(_shared_name(fields[5].rstrip("\n")), 0))
        obj.kb = max(obj.kb, kb)
        obj.holders.add(pid)


def shared_memory(pids=None) -> dict:
    """The shared memory that processes ``pids`` (by default this one and its children) map
    or hold a descriptor of: ``{(device, inode): SharedObject}``.

    Unlike ``Shmem`` in ``/proc/meminfo``, which counts the whole machine's, it sees only
    what the test made, so other programs' shared memory cannot fail a test.
    """
    if pids is None:
        pids = [os.getpid()] + [p.pid for p in children()]
    found: dict = {}
    for pid in pids:
        try:
            _held_shared_memory(pid, found)
            _mapped_shared_memory(pid, found)
        except OSError:
            continue  # the process exited meanwhile
    return found


def shmem_kb(pids=None) -> int:
    """Shared memory, in kB, of this process and its children (``shared_memory``)."""
    return sum(obj.kb for obj in shared_memory(pids).values())


# The thread that polls MXNet's releases of our memory serves the whole process (like
# MXNet's engine threads) and lives while any wrapped array does; the checks below count
# outstanding leases instead, which is the stronger property.
_SERVICE_THREADS = ("shardloader-release",)


def our_threads():
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith("shardloader") and t.name not in _SERVICE_THREADS
    ]


def outstanding_leases() -> int:
    """MXNet arrays over shardloader's memory that MXNet has not released yet."""
    lease.reap_all()
    return lease._registry.pending


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _child_pids(pid: int):
    """The children of process ``pid``, from the kernel's list of each of its threads' (it
    reads a few small files; psutil's children() reads every process's /proc entry, which
    took ~40 ms a call, twice or more a test, on a machine with a hundred processes)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(child) for child in f.read().split())
        except OSError:
            continue  # the thread ended meanwhile
    return out


# Whether the kernel lists each thread's children (CONFIG_PROC_CHILDREN); psutil otherwise.
_PROC_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def children():
    """This process's live descendants (not zombies), as ``psutil.Process`` objects."""
    if not _PROC_CHILDREN:
        found = psutil.Process().children(recursive=True)
    else:
        found, pending, seen = [], [os.getpid()], set()
        while pending:
            try:
                kids = _child_pids(pending.pop())
            except OSError:
                continue  # it exited meanwhile
            for pid in kids:
                if pid in seen:
                    continue
                seen.add(pid)
                pending.append(pid)
                try:
                    found.append(psutil.Process(pid))
                except psutil.Error:
                    continue
    out = []
    for p in found:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.fixture(scope="session", autouse=True)
def _warm_mxnet():
    """Start MXNet's engine and allocators once, so their lazily opened threads and
    descriptors are part of every baseline."""
    a = mx.nd.ones((4, 4)) * 2
    a.copyto(mx.cpu_pinned(0)).wait_to_read()
    a.copyto(mx.cpu(1)).wait_to_read()
    mx.nd.from_numpy(a.asnumpy()).wait_to_read()
    # spawn and forkserver start these interpreter-wide helpers once and keep them; they
    # are Python's, not ours, so they belong in the baseline. The fork server imports MXNet
    # and shardloader before it forks anything, as a user's script run as __main__ has it
    # do (forkserver preloads __main__; pytest's imports neither), and as the benchmarks'
    # harness asks: each forkserver worker then starts in milliseconds, not seconds.
    # (The package imports its modules on first use: shardloader.loader is what a script's
    # `from shardloader import DataLoader` loads.)
    forkserver.set_forkserver_preload(["__main__", "mxnet", "shardloader.loader"])
    resource_tracker.ensure_running()
    forkserver.ensure_running()  # (it imports them meanwhile: no shared memory, no descriptor)
    yield


class Snapshot:
    """What a test's processes hold when it starts: ``problems()`` lists what it left."""

    def __init__(self) -> None:
        gc.collect()
        # What is alive now (modules, MXNet, fixtures) is set aside, so that each gc.collect()
        # of the check scans only what the test made: ~90 ms -> ~1 ms a collection, two or
        # more a test (what a test leaves behind is still collected, and still counted).
        gc.freeze()
        kids = children()  # listed once
        self.children = {p.pid for p in kids}
        self.threads = {t.ident for t in our_threads()}
        self.fds = open_fds()
        self.shared = shared_memory([os.getpid()] + [p.pid for p in kids])
        self.shmem = sum(obj.kb for obj in self.shared.values())
        self.leases = outstanding_leases()

    def problems(self, check_shmem: bool = True):
        gc.collect()
        out = []
        kids = children()
        extra_children = [p for p in kids if p.pid not in self.children]
        if extra_children:
            out.append(f"child processes left: {[p.pid for p in extra_children]}")
        extra_threads = [t.name for t in our_threads() if t.ident not in self.threads]
        if extra_threads:
            out.append(f"threads left: {extra_threads}")
        leases = outstanding_leases()
        if leases > self.leases:
            out.append(f"MXNet arrays over shardloader memory grew from {self.leases} to {leases}")
        fds = open_fds()
        if fds > self.fds:
            out.append(f"open fds grew from {self.fds} to {fds}")
        if check_shmem:
            out.extend(self.shared_memory_problems(kids))
        return out

    def shared_memory_problems(self, kids=None):
        """Slots of shardloader's that the test's processes (this one and ``kids``, by default
        its children now) still map or hold, however small, and other shared memory of theirs
        grown past the tolerance."""
        shared = shared_memory(None if kids is None else [os.getpid()] + [p.pid for p in kids])
        out = []
        slots = [obj for key, obj in shared.items() if obj.ours and key not in self.shared]
        if slots:
            out.append(f"shardloader slots left mapped or open: {slots}")
        shmem = sum(obj.kb for obj in shared.values())
        if shmem > self.shmem + _SHMEM_TOLERANCE_KB:
            grown = [obj for key, obj in shared.items() if key not in self.shared]
            grown.sort(key=lambda obj: -obj.kb)
            out.append(
                f"shared memory of this test's processes grew from {self.shmem} kB to "
                f"{shmem} kB: {grown[:5]}"
            )
        return out

    def settle(self, check_shmem: bool = True, timeout_s: float = _SETTLE_TIMEOUT_S):
        deadline = time.monotonic() + timeout_s
        problems = self.problems(check_shmem)
        while problems and time.monotonic() < deadline:
            time.sleep(0.1)
            problems = self.problems(check_shmem)
        return problems


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves a child process, one of our threads, an open fd or
    shared memory behind (its own processes' shared memory: ``shared_memory``)."""
    snap = Snapshot()
    yield snap
    problems = snap.settle()
    assert not problems, "; ".join(problems)


@pytest.fixture
def no_thread_leak():
    """Fail the test if it leaves any thread behind (for the single-process thread stages,
    whose tests need no process or shared-memory checks)."""
    before = set(threading.enumerate())
    yield
    gc.collect()
    deadline = time.monotonic() + 2.0
    while True:
        extra = [
            t for t in threading.enumerate() if t not in before and t.name not in _SERVICE_THREADS
        ]
        if not extra:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"threads left behind: {extra}")
        time.sleep(0.01)
