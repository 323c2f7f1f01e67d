"""The leak check of conftest.py counts the shared memory of the test's own processes: another
program's shared memory never fails a test, and a slot of shardloader's that a test keeps
always does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import Snapshot

from shardloader import DataLoader
from shardloader._engine.ipc.slots import SLOT_MEMFD_PATH

pytestmark = pytest.mark.timeout(120)

NOISE = Path(__file__).parent / "tools" / "shm_noise.py"
NOISE_MB = 512


def machine_shmem_kb() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Shmem:"))


class Noise:
    """Another program on the machine that takes shared memory (tests/tools/shm_noise.py,
    detached: not a child of the test)."""

    def __init__(self, tmp_path: Path) -> None:
        self.pid_file = tmp_path / "noise.pid"
        self.pid = None

    def start(self, megabytes: int = NOISE_MB, hold_s: float = 90.0) -> int:
        subprocess.run(
            [sys.executable, str(NOISE), "--detach", "--cycles", "1", "--free-s", "0"]
            + ["--mb", str(megabytes), "--hold-s", str(hold_s), "--pid-file", str(self.pid_file)],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )
        deadline = time.monotonic() + 60
        while not self.pid_file.exists():
            assert time.monotonic() < deadline, "shm_noise.py did not take its memory in 60 s"
            time.sleep(0.1)
        self.pid = int(self.pid_file.read_text())
        return self.pid

    def stop(self) -> None:
        if self.pid is None:
            return
        try:
            process = psutil.Process(self.pid)
            process.terminate()
            process.wait(timeout=30)
        except psutil.NoSuchProcess:
            pass
        self.pid = None


@pytest.fixture
def noise(tmp_path):
    # Requested before no_leaks, so it is stopped after no_leaks has checked the test.
    noise = Noise(tmp_path)
    yield noise
    noise.stop()


def test_another_programs_shared_memory_does_not_fail_the_check(noise, no_leaks):
    machine_before = machine_shmem_kb()
    pid = noise.start()
    assert pid not in {p.pid for p in psutil.Process().children(recursive=True)}
    # Other programs move the machine's Shmem too: half the noise is proof enough.
    assert machine_shmem_kb() - machine_before > NOISE_MB * 1024 // 2
    data = np.arange(64 * 4096, dtype=np.float32).reshape(64, 4096)
    with DataLoader(data, batch_size=8, num_workers=2) as loader:
        assert sum(batch.shape[0] for batch in loader) == 64
    # With the noise still held (no_leaks checks again once the test returns):
    assert no_leaks.settle() == []


def _reopen_a_slot(pids) -> int:
    """A new descriptor of one of the slots the processes ``pids`` hold, as a test that kept
    one would have."""
    for pid in pids:
        for name in os.listdir(f"/proc/{pid}/fd"):
            path = f"/proc/{pid}/fd/{name}"
            try:
                if os.readlink(path).startswith(SLOT_MEMFD_PATH):
                    return os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                continue
    raise AssertionError(f"no slot found in processes {pids}")


@pytest.mark.parametrize(
    "kept, batch_kb",
    [("a batch", 1024), ("a batch", 8192), ("a descriptor", 256)],
)
def test_a_slot_kept_by_the_test_fails_the_check(no_leaks, kept, batch_kb):
    snap = Snapshot()
    # numpy batches (the batchify returns numpy) are views of the slot, with no MXNet array
    # that the other checks could count.
    data = np.ones((8, batch_kb * 256 // 4), dtype=np.float32)
    leak = None
    with DataLoader(data, batch_size=4, num_workers=1, batchify_fn=np.stack) as loader:
        it = iter(loader)
        batch = next(it)
        assert isinstance(batch, np.ndarray) and batch.nbytes == batch_kb * 1024
        if kept == "a batch":
            leak = batch
        else:
            leak = _reopen_a_slot(loader.worker_pids())
        del batch, it
    try:
        problems = snap.settle(timeout_s=1.0)  # a kept slot stays: any wait ends in failure
        assert any(p.startswith("shardloader slots left mapped or open") for p in problems), (
            problems
        )
        assert str(os.getpid()) in "; ".join(problems)  # it names who holds it
    finally:
        if isinstance(leak, int):
            os.close(leak)
        del leak
    assert snap.settle() == []


def test_a_child_or_grandchild_left_fails_the_check():
    """Descendants the test started and left, a grandchild and one started by a thread of the
    test's among them, are named (the check lists them from each thread's children)."""
    snap = Snapshot()
    grandparent = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    started = []
    thread = threading.Thread(
        target=lambda: started.append(
            subprocess.Popen([sys.executable, "-c", grandparent], start_new_session=True)
        )
    )
    thread.start()
    thread.join()
    (proc,) = started
    try:
        deadline = time.monotonic() + 30
        while len(psutil.Process(proc.pid).children()) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        (grandchild,) = psutil.Process(proc.pid).children()
        problems = snap.problems(check_shmem=False)
        assert len(problems) == 1 and problems[0].startswith("child processes left: "), problems
        assert sorted(map(int, re.findall(r"\d+", problems[0]))) == sorted(
            [proc.pid, grandchild.pid]
        ), problems
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    assert snap.settle(check_shmem=False) == []
