"""Shared fixtures: the leak check that wraps every multiprocess test."""

from __future__ import annotations

import gc
import os
import threading
import time
from multiprocessing import forkserver, resource_tracker

import mxnet as mx
import psutil
import pytest

# How long the leak check waits for children, threads and memory to go away.
_SETTLE_TIMEOUT_S = 10.0
# Shmem is system-wide: allow for a little unrelated noise (in kB).
_SHMEM_TOLERANCE_KB = 4096


def shmem_kb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1])
    return 0


def our_threads():
    return [t for t in threading.enumerate() if t.name.startswith("shardloader")]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def children():
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


@pytest.fixture(scope="session", autouse=True)
def _warm_mxnet():
    """Start MXNet's engine and allocators once, so their lazily opened threads and
    descriptors are part of every baseline."""
    a = mx.nd.ones((4, 4)) * 2
    a.copyto(mx.cpu_pinned(0)).wait_to_read()
    a.copyto(mx.cpu(1)).wait_to_read()
    mx.nd.from_numpy(a.asnumpy()).wait_to_read()
    # spawn and forkserver start these interpreter-wide helpers once and keep them; they
    # are Python's, not ours, so they belong in the baseline.
    resource_tracker.ensure_running()
    forkserver.ensure_running()
    yield


class Snapshot:
    def __init__(self) -> None:
        gc.collect()
        self.children = {p.pid for p in children()}
        self.threads = {t.ident for t in our_threads()}
        self.fds = open_fds()
        self.shmem = shmem_kb()

    def problems(self, check_shmem: bool = True):
        gc.collect()
        out = []
        extra_children = [p for p in children() if p.pid not in self.children]
        if extra_children:
            out.append(f"child processes left: {[p.pid for p in extra_children]}")
        extra_threads = [t.name for t in our_threads() if t.ident not in self.threads]
        if extra_threads:
            out.append(f"threads left: {extra_threads}")
        fds = open_fds()
        if fds > self.fds:
            out.append(f"open fds grew from {self.fds} to {fds}")
        if check_shmem:
            shmem = shmem_kb()
            if shmem > self.shmem + _SHMEM_TOLERANCE_KB:
                out.append(f"Shmem grew from {self.shmem} kB to {shmem} kB")
        return out

    def settle(self, check_shmem: bool = True):
        deadline = time.monotonic() + _SETTLE_TIMEOUT_S
        problems = self.problems(check_shmem)
        while problems and time.monotonic() < deadline:
            time.sleep(0.1)
            problems = self.problems(check_shmem)
        return problems


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves a child process, one of our threads, an open fd or
    shared memory behind."""
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
        extra = [t for t in threading.enumerate() if t not in before]
        if not extra:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"threads left behind: {extra}")
        time.sleep(0.01)
