"""The third hostile test's transport and worker-process defects (issue 22, items 1, 2, 8 and
9) and the errors a new user tripped on (issue 24): each test fails on 216df86."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from _datasets import RangeDataset

from shardloader import ShardedDataLoader, WorkerDiedError

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")


def labels(loader):
    return [int(v) for _, y in loader for v in y.asnumpy()]


def run_program(name: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """Run ``tests/scripts/<name>`` in its own interpreter, with a deadline."""
    return subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, name), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -------------------------------------------- item 9: worker_init_fn raises in a process worker


class CountingFailingInit:
    """A ``worker_init_fn`` that leaves one file per call, then raises."""

    def __init__(self, directory) -> None:
        self.directory = str(directory)

    def __call__(self, worker_id: int) -> None:
        open(os.path.join(self.directory, f"{os.getpid()}-{worker_id}"), "w").close()
        raise ValueError(f"no such shard for worker {worker_id}")


@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_process_worker_init_fn_error_names_it_and_is_not_restarted(tmp_path, policy):
    init = CountingFailingInit(tmp_path)
    with ShardedDataLoader(
        RangeDataset(16),
        batch_size=4,
        num_workers=2,
        start_method="fork",
        on_worker_death=policy,
        timeout=30,
        worker_init_fn=init,
    ) as loader, pytest.raises(WorkerDiedError) as info:
        list(loader)
    text = str(info.value)
    assert "worker_init_fn raised ValueError: no such shard for worker" in text, text
    # The user's own frame and message, from the worker (invariant 6: as a thread's).
    assert "CountingFailingInit" in info.value.remote_traceback or (
        "raise ValueError" in info.value.remote_traceback
    )
    assert "no such shard for worker" in info.value.remote_traceback
    assert "the fault is in loading it" not in text
    # No restart loop: each of the two workers ran its initializer once.
    assert len(os.listdir(tmp_path)) == 2, sorted(os.listdir(tmp_path))
