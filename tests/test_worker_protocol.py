"""The worker protocol under hostile input: worker lifetime, messages that do not unpickle,
odd exceptions, bad batch samplers, and what a forked worker inherits."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest
from _datasets import RangeDataset

from shardloader import ShardedDataLoader, WorkerDiedError, WorkerError
from shardloader.batchify import default_batchify_fn
from shardloader.dataiter import LoaderDataIter, PrefetchingIter

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = {
    "inline": {},
    "thread": dict(num_workers=2, thread_pool=True),
    "fork": dict(num_workers=2, start_method="fork"),
}
POOLS = {k: MODES[k] for k in ("thread", "fork")}


def labels(loader):
    return [int(v) for _, y in loader for v in y.asnumpy()]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pids, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


class Once:
    """True the first time it is asked (in any process), False afterwards."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __call__(self) -> bool:
        try:
            os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


# --------------------------------------------------------- 1. workers are not tied to a thread


@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_workers_outlive_the_thread_that_started_them(policy):
    with ShardedDataLoader(
        RangeDataset(16), batch_size=4, num_workers=2, on_worker_death=policy, timeout=20
    ) as loader:
        got = []
        first = threading.Thread(target=lambda: got.append(labels(loader)))
        first.start()
        first.join()
        assert got == [list(range(16))]
        pids = loader.worker_pids()
        time.sleep(0.5)  # the thread that forked them is gone by now
        assert all(_alive(p) for p in pids)
        for _ in range(2):
            assert labels(loader) == list(range(16))
        assert loader.worker_pids() == pids  # never killed, never replaced


def test_prefetching_iter_over_a_loader_runs_every_epoch():
    loader = ShardedDataLoader(RangeDataset(16), batch_size=4, num_workers=2, timeout=20)
    with loader, PrefetchingIter(LoaderDataIter(loader)) as it:
        pids = None
        for _ in range(3):
            assert sum(1 for _ in it) == 4
            pids = pids or loader.worker_pids()
            assert loader.worker_pids() == pids
            it.reset()


def test_forkserver_workers_survive_an_idle_pause():
    with ShardedDataLoader(
        RangeDataset(8), batch_size=4, num_workers=1, start_method="forkserver"
    ) as loader:
        assert labels(loader) == list(range(8))
        pids = loader.worker_pids()
        time.sleep(1.5)  # idle workers check on their parent twice a second
        assert labels(loader) == list(range(8))
        assert loader.worker_pids() == pids


_KILL_SCRIPT = """
    import sys, threading, time
    sys.path.insert(0, {here!r})
    from _datasets import SleepyDataset
    from shardloader import ShardedDataLoader

    # Sample 1 sleeps for a minute: one worker is busy in it, the other idle.
    loader = ShardedDataLoader(SleepyDataset(8, bad=1, seconds=60, flag_file="/"),
                               batch_size=1, num_workers=2, prefetch=2, timeout=None)
    def start():
        global it
        it = iter(loader)
        next(it)
    if {from_thread!r}:
        starter = threading.Thread(target=start)
        starter.start()
        starter.join()
    else:
        start()
    print(" ".join(map(str, loader.worker_pids())), flush=True)
    time.sleep(120)
"""


def test_workers_die_at_once_when_the_main_process_is_killed():
    # Two programs, started together: one starts its loader's workers from the main thread,
    # the other from a thread that has ended by the time the program is killed.
    procs = {
        where: subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_KILL_SCRIPT.format(here=HERE, from_thread=t))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for where, t in (("main thread", False), ("other thread", True))
    }
    try:
        workers = {}
        for where, proc in procs.items():
            workers[where] = [int(p) for p in proc.stdout.readline().split()]
            assert len(workers[where]) == 2, (where, proc.stderr.read())
        time.sleep(0.5)
        for where, pids in workers.items():
            # the starting thread's exit killed nobody
            assert all(_alive(p) for p in pids), where
        for proc in procs.values():
            proc.kill()
            proc.wait(10)
        for where, pids in workers.items():
            assert _gone(pids, timeout=3), f"workers started from the {where} outlived it"
    finally:
        for proc in procs.values():
            proc.kill()
            proc.communicate(timeout=10)


def test_launcher_children_get_sigterm_when_the_launcher_is_killed():
    code = textwrap.dedent("""
        import os, subprocess, sys, time
        from shardloader import launch
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 preexec_fn=launch._die_with_parent(os.getpid()))
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(proc.stdout.readline())
        assert _alive(child)
        proc.kill()
        proc.wait(10)
        assert _gone([child], timeout=5)
    finally:
        proc.kill()
        proc.communicate(timeout=10)


# ------------------------------------------------- 2. a class only the worker can import


def _add_to_path(directory):
    def init(worker_id):
        sys.path.insert(0, directory)

    return init


class WorkerOnlyDataset(RangeDataset):
    """Sample ``bad`` holds (or raises) an object of a class from a module that only the
    workers can import, the first time it is loaded."""

    def __init__(self, n, bad, module, raises, once, width=4096):
        super().__init__(n, width=width)  # 16 KB samples: every batch brings a slot
        self.bad, self.module, self.raises, self.once = bad, module, raises, once

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        if i == self.bad and self.once():
            mod = __import__(self.module)
            if self.raises:
                raise mod.WorkerOnlyError("only workers know this class")
            return x, mod.WorkerOnly()
        return x, y


def _stack_and_list(samples):
    return np.stack([x for x, _ in samples]), [y for _, y in samples]


def _worker_only_module(tmp_path, tag):
    module = f"workeronly_{os.getpid()}_{tag}"
    (tmp_path / f"{module}.py").write_text(
        "class WorkerOnly:\n    pass\n\nclass WorkerOnlyError(Exception):\n    pass\n"
    )
    return module


@pytest.mark.parametrize("raises", [False, True], ids=["in-a-batch", "raised"])
def test_a_class_only_the_worker_can_import(tmp_path, raises):
    module = _worker_only_module(tmp_path, int(raises))
    ds = WorkerOnlyDataset(32, 6, module, raises, Once(tmp_path / "once"))
    with ShardedDataLoader(
        ds,
        batch_size=4,
        num_workers=2,
        timeout=10,
        batchify_fn=_stack_and_list,
        worker_init_fn=_add_to_path(str(tmp_path)),
    ) as loader:
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            list(loader)
        pids = loader.worker_pids()
        err = info.value
        assert f"{module}.WorkerOnly" in str(err)  # the class that could not be rebuilt
        assert err.seq == 1 and list(err.indices) == [4, 5, 6, 7]
        assert err.worker_id in (0, 1) and f"worker {err.worker_id}" in str(err)
        # The channel stayed in step: the next epoch is complete, on the same workers.
        assert [int(y) for _, ys in loader for y in ys] == list(range(32))
        assert time.monotonic() - start < 8
        assert loader.worker_pids() == pids and len(pids) == 2


def test_a_class_only_the_worker_can_import_amid_a_message_of_many_batches(tmp_path):
    # Tiny batches travel several to a message; the bad one is in the middle of one.
    module = _worker_only_module(tmp_path, "many")
    ds = WorkerOnlyDataset(96, 61, module, False, Once(tmp_path / "once"), width=2)
    with ShardedDataLoader(
        ds,
        batch_size=2,
        num_workers=1,
        prefetch=8,
        timeout=10,
        batchify_fn=_stack_and_list,
        worker_init_fn=_add_to_path(str(tmp_path)),
    ) as loader:
        seen = []
        with pytest.raises(WorkerError, match=f"{module}.WorkerOnly") as info:
            for _, ys in loader:
                seen.extend(int(y) for y in ys)
        assert seen == list(range(60))  # every batch before it, from the same messages too
        assert info.value.seq == 30 and list(info.value.indices) == [60, 61]
        assert [int(y) for _, ys in loader for y in ys] == list(range(96))


# --------------------------------------------------- 3. an exception whose __str__ raises


class BadStrError(Exception):
    def __str__(self):
        raise TypeError("no str for you")


class BadStrDataset(RangeDataset):
    def __init__(self, n, once):
        super().__init__(n)
        self.once = once

    def __getitem__(self, i):
        if i == 5 and self.once():
            raise BadStrError()
        return super().__getitem__(i)


@pytest.mark.parametrize("pool", list(POOLS))
def test_an_exception_whose_str_raises_arrives(pool, tmp_path):
    ds = BadStrDataset(16, Once(tmp_path / "once"))
    with ShardedDataLoader(ds, batch_size=4, timeout=20, **POOLS[pool]) as loader:
        start = time.monotonic()
        with pytest.raises(WorkerError, match="BadStrError") as info:
            list(loader)
        assert time.monotonic() - start < 5
        pids = loader.worker_pids()
        assert info.value.seq == 1 and list(info.value.indices) == [4, 5, 6, 7]
        assert "str() of a BadStrError raises TypeError" in str(info.value)
        assert labels(loader) == list(range(16))
        assert loader.worker_pids() == pids  # no worker died over it


# ----------------------------------------------------- 4. StopIteration is not the end


class StopDataset(RangeDataset):
    def __getitem__(self, i):
        if i == 5:
            raise StopIteration
        return super().__getitem__(i)


def _stop_on_second_batch(samples):
    if samples[0][1] == 4:
        raise StopIteration
    return default_batchify_fn(samples)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("where", ["getitem", "batchify"])
def test_stop_iteration_from_the_dataset_or_batchify_is_an_error(mode, where):
    if where == "getitem":
        ds, kwargs, text = StopDataset(16), {}, "raised StopIteration for sample index 5"
    else:
        ds = RangeDataset(16)
        kwargs, text = dict(batchify_fn=_stop_on_second_batch), "batchify_fn raised StopIteration"
    with ShardedDataLoader(ds, batch_size=4, timeout=20, **kwargs, **MODES[mode]) as loader:
        for epoch in range(2):
            seen = []
            with pytest.raises(RuntimeError, match=text) as info:
                for _, y in loader:
                    seen.extend(int(v) for v in y.asnumpy())
            assert seen == [0, 1, 2, 3]  # an error at batch 1, not a short epoch
            assert isinstance(info.value.__cause__, StopIteration) or mode != "inline"
            if mode != "inline":
                assert info.value.seq == 1 and "StopIteration" in str(info.value)
            state = loader.state_dict()  # the epoch did not count as finished
            assert (state["epoch"], state["consumed"]) == (epoch, 1)


# --------------------------------------------- 5. SystemExit and KeyboardInterrupt in a worker


class ExitDataset(RangeDataset):
    def __init__(self, n, exc_type, once):
        super().__init__(n)
        self.exc_type, self.once = exc_type, once

    def __getitem__(self, i):
        if i == 5 and self.once():
            raise self.exc_type(3) if self.exc_type is SystemExit else self.exc_type()
        return super().__getitem__(i)


@pytest.mark.parametrize("pool", list(POOLS))
@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_base_exceptions_in_a_worker_reach_the_loop_at_once(pool, exc_type, tmp_path):
    ds = ExitDataset(16, exc_type, Once(tmp_path / "once"))
    with ShardedDataLoader(ds, batch_size=4, timeout=30, **POOLS[pool]) as loader:
        start = time.monotonic()
        with pytest.raises(exc_type) as info:
            list(loader)
        assert time.monotonic() - start < 5, "it must not wait for the timeout"
        pids = loader.worker_pids()
        assert f"Caught {exc_type.__name__} in worker" in str(info.value)
        assert info.value.seq == 1 and list(info.value.indices) == [4, 5, 6, 7]
        assert labels(loader) == list(range(16))  # every worker still serves
        assert loader.worker_pids() == pids


class FailingInit:
    def __init__(self, once):
        self.once = once

    def __call__(self, worker_id):
        if self.once():
            raise ValueError("init failed")


class SlowRange(RangeDataset):
    """Slow enough that the healthy thread cannot finish the epoch before the failing
    thread's report is read, however the threads are scheduled."""

    def __getitem__(self, i):
        time.sleep(0.05)
        return super().__getitem__(i)


def test_a_thread_worker_whose_init_fails_is_reported_at_once(tmp_path):
    with ShardedDataLoader(
        SlowRange(16),
        batch_size=4,
        num_workers=2,
        thread_pool=True,
        timeout=30,
        worker_init_fn=FailingInit(Once(tmp_path / "once")),
    ) as loader:
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            list(loader)
        assert time.monotonic() - start < 5
        text = str(info.value)
        assert "thread worker" in text and "worker_init_fn raised ValueError: init failed" in text
        assert "init failed" in info.value.remote_traceback
        assert labels(loader) == list(range(16))  # a new pool, whose inits succeed


# ------------------------------------------------------- 6. a batch sampler of bare ints


class IntsOnceSampler:
    """Yields bare ints in its first epoch, proper batches afterwards."""

    def __init__(self):
        self.epochs = 0

    def __iter__(self):
        self.epochs += 1
        if self.epochs == 1:
            return iter([0, 1, 2])
        return iter([[0, 1], [2, 3]])

    def __len__(self):
        return 3


@pytest.mark.parametrize("mode", list(MODES))
def test_a_batch_sampler_of_bare_ints_is_a_clear_type_error(mode):
    with ShardedDataLoader(
        RangeDataset(8), batch_sampler=[0, 1, 2], timeout=20, **MODES[mode]
    ) as loader:
        pids = None
        for _ in range(3):  # the same clear error every epoch, on the same workers
            with pytest.raises(TypeError, match=r"batch sampler yielded 0 \(type int\)"):
                list(loader)
            pids = loader.worker_pids() if pids is None else pids
            assert loader.worker_pids() == pids
    with ShardedDataLoader(
        RangeDataset(8), batch_sampler=IntsOnceSampler(), timeout=20, **MODES[mode]
    ) as loader:
        with pytest.raises(TypeError, match="where a batch was expected"):
            list(loader)
        assert labels(loader) == [0, 1, 2, 3]  # the same loader, a good epoch
        if mode == "fork":
            assert len(loader.worker_pids()) == 2


# ---------------------------------------- 7. a forked worker holds nothing of other loaders


def _shmem_kb() -> int:
    # This test's processes' shared memory, not the machine's (which others move too).
    from conftest import shmem_kb

    return shmem_kb()


def _inodes(pid: int):
    """Inodes of the pipes, sockets and memfds process ``pid`` holds, and of its mappings."""
    fds = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
            if link.startswith(("pipe:", "socket:", "/memfd:")):
                fds.add(os.stat(f"/proc/{pid}/fd/{name}").st_ino)
        except OSError:
            pass
    with open(f"/proc/{pid}/maps") as maps:
        mapped = {int(line.split()[4]) for line in maps if "memfd:shardloader" in line}
    return fds, mapped


def _own_fd_inodes():
    return _inodes(os.getpid())[0]


def _memfds(pid: int):
    out = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}").startswith("/memfd:shardloader"):
                out.add(os.stat(f"/proc/{pid}/fd/{name}").st_ino)
        except OSError:
            pass
    return out


def _holders(inodes):
    """Processes of this test (this one and its children) that map or hold any of
    ``inodes``."""
    out = []
    for pid in [os.getpid()] + [p.pid for p in psutil.Process().children(recursive=True)]:
        try:
            fds, mapped = _inodes(pid)
        except OSError:
            continue  # exited meanwhile
        if (fds | mapped) & inodes:
            out.append(pid)
    return out


def test_closing_a_loader_frees_its_memory_while_another_runs():
    big = RangeDataset(64, width=1 << 17)  # 512 KB samples: 8 MB batches
    base = _shmem_kb()
    before_a = _own_fd_inodes()
    a = ShardedDataLoader(big, batch_size=16, num_workers=2, prefetch=4)
    kept = next(iter(a))  # a batch of A's that the training process still holds...
    assert sum(1 for _ in a) == 4
    a_fds = _own_fd_inodes() - before_a  # A's pipes and sentinels, here
    a_slots = set()  # and every pipe, socket and memfd of A's workers
    a_memory = set()
    for pid in a.worker_pids():
        a_slots |= _inodes(pid)[0] - before_a
        a_memory |= _memfds(pid)
    grown = _shmem_kb() - base
    assert a_memory and grown > 16 * 1024, f"A's slots should show in Shmem (+{grown} kB)"

    b = ShardedDataLoader(RangeDataset(8), batch_size=4, num_workers=2)
    try:
        assert labels(b) == list(range(8))  # ...while B's workers are forked
        for pid in b.worker_pids():
            fds, mapped = _inodes(pid)
            assert not fds & (a_fds | a_slots), "B's worker holds a descriptor of A's"
            assert not mapped & a_memory, "B's worker maps A's shared memory"
        del kept
        a.close()
        deadline = time.monotonic() + 10
        while _holders(a_memory) and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.1)
        assert not _holders(a_memory), "A's memory outlived A.close() while B runs"
        # Shmem is system-wide (other programs move it too): only a coarse check.
        assert _shmem_kb() - base < grown // 2
        assert labels(b) == list(range(8))
    finally:
        a.close()
        b.close()


def test_workers_keep_the_users_other_descriptors(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(16)))
    with open(path, "rb") as f:

        class FileDataset:
            def __len__(self):
                return 16

            def __getitem__(self, i):
                return np.frombuffer(os.pread(f.fileno(), 1, i), dtype=np.uint8)

        with ShardedDataLoader(RangeDataset(8), batch_size=4, num_workers=1) as other:
            list(other)  # another loader's pipes exist when this one forks
            with ShardedDataLoader(FileDataset(), batch_size=4, num_workers=2) as loader:
                got = [int(v) for batch in loader for v in batch.asnumpy().ravel()]
    assert got == list(range(16))
