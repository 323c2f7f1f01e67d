"""Never hang, never lose an error, never leak (issue: reliability)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest
from _backends import backends
from _datasets import ExitingDataset, FailingDataset, RangeDataset, SleepyDataset
from conftest import outstanding_leases, sigint_ignored, without_mxnet_banner

from shardloader import (
    ClosedIteratorError,
    LoaderTimeoutError,
    ShardedDataLoader,
    WorkerDiedError,
    WorkerError,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

HERE = os.path.dirname(os.path.abspath(__file__))
POOLS = backends("thread", "fork", "spawn")
QUICK_POOLS = backends("thread", "fork")


def labels(loader):
    return [int(v) for _, y in loader for v in y.asnumpy()]


# ----------------------------------------------------------------- worker exceptions


@pytest.mark.parametrize("pool", list(POOLS))
def test_worker_exception_keeps_type_and_context(pool):
    ds = FailingDataset(40, bad=13, exc_type=KeyError)
    with ShardedDataLoader(ds, batch_size=4, **POOLS[pool]) as loader:
        seen = []
        with pytest.raises(KeyError) as info:
            for _, y in loader:
                seen.extend(y.asnumpy().tolist())
        assert seen == list(range(12))  # it surfaced exactly at the failing batch
        text = str(info.value)
        assert "sample 13 is broken" in text
        assert "Traceback" in text and "_datasets.py" in text
        assert "batch 3" in text and "12, 13, 14, 15" in text
        assert "worker" in text
        assert info.value.seq == 3 and list(info.value.indices) == [12, 13, 14, 15]
        # The loader stays usable.
        ds.bad = -1 if pool == "thread" else ds.bad
        if pool == "thread":
            assert labels(loader) == list(range(40))
        else:
            with pytest.raises(KeyError):
                labels(loader)


class OddError(Exception):
    def __init__(self, a, b):  # cannot be rebuilt from one message string
        super().__init__(a, b)


class OddDataset(RangeDataset):
    def __getitem__(self, i):
        raise OddError(1, 2)


def test_unrebuildable_exception_becomes_worker_error():
    loader = ShardedDataLoader(OddDataset(8), batch_size=4, num_workers=1)
    with loader, pytest.raises(WorkerError, match="OddError"):
        next(iter(loader))


def test_inline_exception_is_the_original():
    with ShardedDataLoader(FailingDataset(8, bad=5), batch_size=4) as loader:
        with pytest.raises(KeyError, match="sample 5"):
            list(loader)
        with pytest.raises(KeyError):
            list(loader)


# ----------------------------------------------------------------------- worker death


@pytest.mark.parametrize(
    "how,expect", [("exit", "exited with code 7"), ("kill", "killed by SIGKILL")]
)
def test_worker_death_is_reported_quickly(how, expect, tmp_path):
    once = str(tmp_path / "died")
    ds = ExitingDataset(40, bad=9, how=how, once_file=once)
    with ShardedDataLoader(ds, batch_size=4, num_workers=2, timeout=100) as loader:
        old_pids = set(loader.worker_pids()) if loader.worker_pids() else None
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            list(loader)
        assert time.monotonic() - start < 5, "death must be noticed long before timeout"
        err = info.value
        assert expect in str(err)
        assert f"pid {err.pid}" in str(err)
        assert "indices [8, 9, 10, 11]" in str(err)
        assert err.exitcode == (7 if how == "exit" else -signal.SIGKILL)
        # The next epoch runs on a rebuilt pool and is complete.
        assert labels(loader) == list(range(40))
        assert old_pids is None or not old_pids & set(loader.worker_pids())


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_restart_policy_finishes_the_epoch_without_loss(how, tmp_path):
    ds = ExitingDataset(60, bad=21, how=how, once_file=str(tmp_path / "died"))
    with ShardedDataLoader(
        ds, batch_size=3, num_workers=2, prefetch=6, on_worker_death="restart"
    ) as loader:
        assert labels(loader) == list(range(60))  # nothing lost, nothing repeated, in order
        assert labels(loader) == list(range(60))


def test_restart_policy_gives_up_on_a_batch_that_always_kills_its_worker():
    ds = ExitingDataset(40, bad=9, how="kill")  # dies every time, not once
    with ShardedDataLoader(
        ds, batch_size=4, num_workers=2, on_worker_death="restart", timeout=None
    ) as loader:
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match="not retried again") as info:
            list(loader)
        assert time.monotonic() - start < 15
        assert info.value.seq == 2 and list(info.value.indices) == [8, 9, 10, 11]


# -------------------------------------------------------------------------- timeouts


@pytest.mark.parametrize("pool", list(QUICK_POOLS))
def test_timeout_names_the_batch_and_loader_recovers(pool, tmp_path, capsys):
    flag = tmp_path / "slow"
    flag.touch()
    # A thread cannot be killed: the stuck one wakes when the flag goes (process workers
    # sleep on, as before). The stuck sample is in batch 2, which a thread takes only after
    # it has made a batch: thread workers make the pool's first batch one at a time (lazy
    # set-up), and a sample stuck in it would hold up batch 0 too, on whichever thread
    # took batch 1 first (the timeout is then batch 0's, and names batch 1 as the one to
    # look at: tests/test_stages.py makes that case on purpose).
    ds = SleepyDataset(16, bad=10, seconds=4, flag_file=str(flag), wake=pool == "thread")
    with ShardedDataLoader(ds, batch_size=4, timeout=1, **QUICK_POOLS[pool]) as loader:
        start = time.monotonic()
        with pytest.raises(LoaderTimeoutError) as info:
            list(loader)
        assert time.monotonic() - start < 3.5
        assert isinstance(info.value, TimeoutError)
        assert "batch 2" in str(info.value) and "timeout=1.0s" in str(info.value)
        assert "Likely causes" in str(info.value)
        assert ds.sleeping == (1 if pool == "thread" else 0)  # (a worker process's own copy)
        flag.unlink()
        if pool == "thread":  # let the stuck one finish
            deadline = time.monotonic() + 10
            while ds.sleeping and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not ds.sleeping
        assert labels(loader) == list(range(16))
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_a_batch_that_returns_after_its_timeout_is_not_kept(tmp_path, no_leaks):
    """A thread stuck past the timeout returns after the next epoch has closed its pool;
    the epoch iterator and the error, still held, refer to that pool: it must not keep the
    late batch (before, it sat in the closed pool's result queue, over the loader's memory,
    for as long as either lived)."""
    flag = tmp_path / "slow"
    flag.touch()
    ds = SleepyDataset(16, bad=10, seconds=10, flag_file=str(flag), wake=True)
    with ShardedDataLoader(ds, batch_size=4, timeout=1, **QUICK_POOLS["thread"]) as loader:
        it = iter(loader)
        with pytest.raises(LoaderTimeoutError) as info:
            list(it)
        assert info.value.seq == 2 and ds.sleeping == 1
        flag.unlink()
        deadline = time.monotonic() + 10
        while ds.sleeping and time.monotonic() < deadline:
            time.sleep(0.01)
        # The next epoch closes the old pool, which waits for the woken thread: it has made
        # its batch by then.
        assert labels(loader) == list(range(16))
        leases = outstanding_leases()
        deadline = time.monotonic() + 3
        while leases > no_leaks.leases and time.monotonic() < deadline:
            time.sleep(0.05)
            leases = outstanding_leases()
        assert leases == no_leaks.leases, "a closed thread pool holds a batch"
        del it, info


# -------------------------------------------------------------------- clean shutdown


@pytest.mark.parametrize("pool", list(QUICK_POOLS))
def test_break_fifty_times_leaks_nothing(pool, no_leaks):
    ds = RangeDataset(400, width=4096)  # 16 KB samples: batches travel in shared memory
    with ShardedDataLoader(ds, batch_size=8, prefetch=6, **QUICK_POOLS[pool]) as loader:
        for _ in range(50):
            for batch in loader:
                assert batch[0].shape == (8, 4096)
                break
        pids = loader.worker_pids()
        assert len(set(pids)) == len(pids)


def test_exception_in_loop_body_then_reuse(no_leaks):
    with ShardedDataLoader(RangeDataset(40), batch_size=4, num_workers=2) as loader:
        with pytest.raises(ZeroDivisionError):
            for i, _ in enumerate(loader):
                if i == 3:
                    1 / 0  # noqa: B018
        assert labels(loader) == list(range(40))


def test_del_and_gc_release_everything(no_leaks):
    loader = ShardedDataLoader(RangeDataset(40), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    pids = loader.worker_pids()
    del it, loader
    gc.collect()
    deadline = time.monotonic() + 5
    while (
        any(
            psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
            for p in pids
        )
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not any(psutil.pid_exists(p) for p in pids)


def test_close_is_idempotent_and_final(no_leaks):
    loader = ShardedDataLoader(RangeDataset(40), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    loader.close()
    loader.close()
    with pytest.raises(ClosedIteratorError):
        next(it)
    with pytest.raises(ClosedIteratorError):
        iter(loader)


def test_kept_batches_survive_close(no_leaks):
    with ShardedDataLoader(RangeDataset(40, width=8192), batch_size=4, num_workers=2) as loader:
        kept = list(loader)
    # The loader and its workers are gone; the batches the user kept are still valid.
    assert [int(y.asnumpy()[0]) for _, y in kept] == list(range(0, 40, 4))
    assert float(kept[-1][0].asnumpy()[-1, 0]) == 39.0
    del kept


def _run_script(body: str, timeout: float = 60, **popen):
    code = textwrap.dedent(f"""
        import sys, os, time
        sys.path.insert(0, {HERE!r})
        from _datasets import *
        from shardloader import ShardedDataLoader
    """) + textwrap.dedent(body)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def _gone(pids, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_interpreter_exit_while_workers_are_busy():
    proc = _run_script("""
        loader = ShardedDataLoader(SleepyDataset(64, bad=9, seconds=30, flag_file=__file__
                                   if False else "/"), batch_size=4, num_workers=2)
        it = iter(loader)
        next(it)
        print(" ".join(map(str, loader.worker_pids())), flush=True)
        # exit with a worker stuck in a 30 s sleep and batches in flight
    """)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert without_mxnet_banner(err).strip() == ""
    assert _gone([int(p) for p in out.split()])


def test_ctrl_c_raises_keyboard_interrupt_without_worker_tracebacks():
    with sigint_ignored():  # the harder caller: the program must set its own handler
        proc = _run_script(
            """
        import signal
        # Ctrl-C must raise KeyboardInterrupt even when the caller ignores SIGINT (a shell's
        # background job starts its programs so, and Python then installs no handler).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        loader = ShardedDataLoader(SleepyDataset(64, bad=9, seconds=30, flag_file="/"),
                                   batch_size=4, num_workers=2)
        it = iter(loader)
        next(it)
        print(" ".join(map(str, loader.worker_pids())), flush=True)
        for batch in it:
            pass
    """,
            start_new_session=True,
        )
    pids = [int(p) for p in proc.stdout.readline().split()]
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # like a terminal: the whole process group
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err
    assert err.count("Traceback") == 1, err
    assert "shardloader-worker" not in err
    assert _gone(pids)


# -------------------------------------------------------------------------- bad input


class BadIndexSampler:
    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


@pytest.mark.parametrize("pool", ["inline"] + list(QUICK_POOLS))
@pytest.mark.parametrize(
    "batch,exc,text",
    [
        ([0, 1, "2"], TypeError, "non-integer index '2'"),
        ([0, 99], IndexError, "index 99 .* outside the dataset's range \\[0, 10\\)"),
        ([0, -1], IndexError, "index -1"),
    ],
)
def test_bad_indices_from_a_batch_sampler(pool, batch, exc, text):
    kwargs = QUICK_POOLS.get(pool, {})
    with ShardedDataLoader(
        RangeDataset(10), batch_sampler=BadIndexSampler([batch]), **kwargs
    ) as loader, pytest.raises(exc, match=text):
        list(loader)


def _unpicklable_batchify(samples):
    return threading.Lock()


def test_unpicklable_batch_gets_a_clear_error():
    loader = ShardedDataLoader(
        RangeDataset(8), batch_size=4, num_workers=1, batchify_fn=_unpicklable_batchify
    )
    with loader, pytest.raises(TypeError, match="cannot be sent from a worker process") as info:
        list(loader)
    assert "indices [0, 1, 2, 3]" in str(info.value)


class LockedDataset(RangeDataset):
    def __init__(self, n):
        super().__init__(n)
        self.lock = threading.Lock()


def test_unpicklable_dataset_under_spawn_names_the_fix():
    loader = ShardedDataLoader(LockedDataset(8), batch_size=4, num_workers=1, start_method="spawn")
    with pytest.raises(TypeError, match="thread_pool=True") as info:
        list(loader)
    assert "cannot be pickled" in str(info.value)
    loader.close()
    # and it works under fork and with threads
    for kwargs in (dict(start_method="fork"), dict(thread_pool=True)):
        with ShardedDataLoader(LockedDataset(8), batch_size=4, num_workers=1, **kwargs) as loader:
            assert labels(loader) == list(range(8))


class RaggedDataset(RangeDataset):
    def __getitem__(self, i):
        return np.zeros((3, 5 if i == 6 else 4), dtype=np.float32)


@pytest.mark.parametrize("pool", ["inline", "fork"])
def test_mismatched_shapes_name_sample_and_shapes(pool):
    kwargs = QUICK_POOLS.get(pool, {})
    loader = ShardedDataLoader(RaggedDataset(8), batch_size=4, **kwargs)
    with loader, pytest.raises(ValueError) as info:
        list(loader)
    text = str(info.value)
    assert "(3, 5)" in text and "(3, 4)" in text and "dataset index 6" in text


# ---------------------------------------------------------------------- start methods


# spawn: two epochs against Gluon's batches in tests/test_mx2_smoke.py (its keep-spawn case),
# and a worker's error under spawn above: each spawned worker spends seconds importing MXNet.
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_every_start_method_works(method):
    with ShardedDataLoader(
        RangeDataset(20), batch_size=3, num_workers=2, start_method=method
    ) as loader:
        assert labels(loader) == list(range(20))
        assert labels(loader) == list(range(20))


class HandedOverDataset(RangeDataset):
    """1 MiB of state (more than a pipe holds). Unpickling it, in a worker, writes down how
    many of the loader's workers exist by then."""

    def __init__(self, n, log):
        super().__init__(n)
        self.log, self.ballast = str(log), bytes(1 << 20)

    def __setstate__(self, state):
        self.__dict__.update(state)
        siblings = [
            p
            for p in psutil.Process(os.getppid()).children()
            if "spawn_main" in " ".join(p.cmdline())
        ]
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {len(siblings)}\n")


def test_spawned_workers_start_together(tmp_path):
    """Under spawn (and forkserver), the dataset goes to each worker over its pipe once
    every worker has started: passed to Process.start() instead, it would make each start
    wait for the last worker to import MXNet and read it (a payload over a pipe's buffer)."""
    log = tmp_path / "unpickled"
    dataset = HandedOverDataset(12, log)
    with ShardedDataLoader(dataset, batch_size=3, num_workers=2, start_method="spawn") as loader:
        assert labels(loader) == list(range(12))
        pids = sorted(loader.worker_pids())
    seen = dict(line.split() for line in log.read_text().splitlines())
    assert sorted(int(pid) for pid in seen) == pids
    # When each worker read the dataset, both workers had been started.
    assert set(seen.values()) == {"2"}, seen


class SharedCounterDataset(RangeDataset):
    """Holds a lock and a shared counter, which multiprocessing lets a new process have."""

    def __init__(self, n, method):
        super().__init__(n)
        ctx = multiprocessing.get_context(method)
        self.lock, self.count = ctx.Lock(), ctx.Value("i", 0)

    def __getitem__(self, i):
        with self.lock:
            self.count.value += 1
        return super().__getitem__(i)


@pytest.fixture(scope="module")
def fd_sharing():
    """multiprocessing's process-wide resources that a pickled descriptor brings: the
    resource sharer's socket and thread, started at its first use, and kept (module scope:
    before the leak check's first count)."""
    from multiprocessing import resource_sharer

    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        os.close(resource_sharer.DupFd(fd).detach())
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def counter_dataset(fd_sharing):
    return SharedCounterDataset(12, "forkserver")  # its shared value's memory stays open


def test_a_dataset_with_a_lock_and_a_shared_value_reaches_forkserver_workers(counter_dataset):
    dataset = counter_dataset
    with ShardedDataLoader(
        dataset, batch_size=3, num_workers=2, start_method="forkserver"
    ) as loader:
        assert labels(loader) == list(range(12))
    assert dataset.count.value == 12


@pytest.mark.parametrize("method", ["forkserver"])  # spawn hands over the same way
def test_a_dataset_of_mxnet_arrays_reaches_every_worker(method, fd_sharing):
    """MXNet pickles an array as a descriptor of shared memory, which a process can fetch
    once: each worker gets its own pickling (spawn and forkserver workers used to fail to
    map it)."""
    import mxnet as mx
    from mxnet.gluon.data import ArrayDataset

    dataset = ArrayDataset(mx.nd.arange(24).reshape((12, 2)), mx.nd.arange(12))
    with ShardedDataLoader(dataset, batch_size=3, num_workers=2, start_method=method) as loader:
        steps = list(loader)
    assert [int(v) for _, y in steps for v in y.asnumpy()] == list(range(12))
    assert [float(v) for x, _ in steps for v in x.asnumpy().ravel()] == list(range(24))


_NO_MAIN_GUARD = """
import numpy as np
from shardloader import DataLoader, WorkerDiedError

data = np.zeros((600, 1000), "float32")  # 2.4 MB, pickled: more than a pipe holds
loader = DataLoader(data, batch_size=50, num_workers=1, start_method="spawn")
try:
    next(iter(loader))
except WorkerDiedError as exc:
    print("WorkerDiedError", "exited with code 1" in str(exc))
finally:
    loader.close()
"""


@pytest.mark.timeout(90)
def test_a_spawn_script_without_a_main_guard_fails_and_does_not_hang(tmp_path):
    """Without ``if __name__ == "__main__":``, a spawned worker runs the script again and
    dies before it reads its start-up data. ``Process.start()`` writes that data while it
    still holds the pipe's read end, so with a dataset over a pipe's buffer it used to wait
    forever; the dataset now travels on the worker's own pipe, whose write fails."""
    script = tmp_path / "train.py"
    script.write_text(_NO_MAIN_GUARD)
    root = os.path.dirname(HERE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["WorkerDiedError", "True"], (run.stdout, run.stderr[-2000:])


class UnloadableDataset(RangeDataset):
    def __setstate__(self, state):
        raise ValueError("cannot open /data/train.rec from here")


# forkserver: the same hand-over as spawn, without seconds of importing MXNet per worker
@pytest.mark.parametrize("method", ["forkserver"])
def test_a_dataset_that_does_not_unpickle_in_the_worker_is_a_failed_start(method):
    loader = ShardedDataLoader(
        UnloadableDataset(8), batch_size=4, num_workers=1, start_method=method
    )
    with loader, pytest.raises(WorkerDiedError) as info:
        list(loader)
    text = str(info.value)
    assert "worker 0 stopped: unpickling the dataset, batchify_fn and worker_init_fn raised" in text
    assert "ValueError: cannot open /data/train.rec from here" in text, text
    assert "a worker whose start failed is not restarted" in text, text


# ----------------------------------------------------------------- resources stay flat


def _rss_kb() -> int:
    return psutil.Process().memory_info().rss // 1024


def test_resources_stay_flat_over_200_epochs():
    from conftest import open_fds, our_threads, shmem_kb

    ds = RangeDataset(32, width=8192)  # 32 KB samples, batches in shared memory
    with ShardedDataLoader(ds, batch_size=8, num_workers=2) as loader:
        for _ in range(10):
            list(loader)
        gc.collect()
        fds, threads, shmem, rss = open_fds(), len(our_threads()), shmem_kb(), _rss_kb()
        for _ in range(200):
            for batch in loader:
                batch[0].wait_to_read()
        gc.collect()
        assert open_fds() <= fds
        assert len(our_threads()) <= threads
        assert shmem_kb() <= shmem + 4096
        assert _rss_kb() - rss < 8 * 1024, f"RSS grew by {_rss_kb() - rss} kB"


def test_pickled_errors_roundtrip():
    from shardloader._errors import RemoteError

    try:
        raise KeyError("x")
    except KeyError as e:
        record = RemoteError.capture(e, 1, 2, [3])
    again = pickle.loads(pickle.dumps(record))
    err = again.rebuild()
    assert isinstance(err, KeyError) and err.seq == 2 and err.worker_id == 1
