"""Module-level datasets and batchify functions for tests/test_resources.py (they must
pickle under spawn and be importable by worker processes), and ``run_program``, which runs a
program of tests/scripts/ with a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
import pytest

from shardloader import DataLoader
from shardloader.batchify import Stack

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
ROOT = os.path.dirname(HERE)


class SlowDataset:
    """Every sample takes ``seconds``."""

    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return np.float32(i)


class MemoizingDataset:
    """Builds each sample with shardloader's own batchify and caches it, as a dataset that
    precomputes features would: the cache must never be overwritten by later batches."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cache = {}
        self.types = set()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i not in self.cache:
            value = Stack()([np.full(4, i, np.float32), np.full(4, i + 0.5, np.float32)])
            self.types.add(type(value).__name__)
            self.cache[i] = value
        cached = self.cache[i]
        return cached.asnumpy() if hasattr(cached, "asnumpy") else cached, type(cached).__name__


class InnerLoaderDataset:
    """Each sample runs a small loader of its own, inline or with process workers."""

    def __init__(self, n: int, inner_workers: int) -> None:
        self.n, self.inner_workers = n, inner_workers

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        inner = np.arange(6, dtype=np.float32) + i
        try:
            with DataLoader(inner, batch_size=3, num_workers=self.inner_workers) as loader:
                batches = list(loader)
        except RuntimeError as exc:
            return np.float32(-1), str(exc)
        return np.float32(sum(b.sum().asnumpy().item() for b in batches)), type(batches[0]).__name__


def sparse_batchify(samples):
    dense = np.stack([s for s in samples]).astype(np.float32)
    return mx.nd.sparse.csr_matrix(dense), mx.nd.sparse.row_sparse_array(dense)


def odd_arrays_batchify(samples):
    dense = np.stack(samples).astype(np.float32)
    masked = np.ma.masked_less(dense, 2.0)
    record = np.rec.fromarrays([dense[:, 0], dense[:, 1]], names="a,b")
    return masked, record


class LazySetupDataset:
    """Does one-time set-up on its first sample that must not run in two threads at once
    (as a hybridized Gluon transform builds its graph), and records the overlap."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ready = False
        self.inside = 0
        self.most_inside = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if not self.ready:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            time.sleep(0.05)
            self.inside -= 1
            self.ready = True
        return np.float32(i)


def run_program(name: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """Run ``tests/scripts/<name>`` in its own interpreter and process group, against this
    checkout's shardloader, with a deadline (a hang kills the whole group)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, os.path.join(SCRIPTS, name), *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{name} {' '.join(args)} hung past {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
