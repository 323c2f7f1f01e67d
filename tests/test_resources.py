"""Memory, threads and misuse: what a hostile test of the loader found (regressions)."""

from __future__ import annotations

import threading
import time

import mxnet as mx
import numpy as np
import psutil
import pytest
from _datasets import RangeDataset
from _programs import (
    InnerLoaderDataset,
    LazySetupDataset,
    MemoizingDataset,
    SlowDataset,
    odd_arrays_batchify,
    sparse_batchify,
)
from conftest import ARRAY_TYPE, MX2, shmem_kb
from mxnet import gluon

from shardloader import ClosedIteratorError, DataLoader
from shardloader._engine.ipc import slots

MODES = {
    "inline": {},
    "thread": {"num_workers": 2, "thread_pool": True},
    "process": {"num_workers": 2},
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(MODES))
def test_batchify_inside_a_dataset_gets_its_own_memory(no_leaks, mode):
    """A dataset that memoizes batchify results keeps them intact across epochs, and gets
    the same types as in the main process (the worker's slot allocator is for the batch
    only)."""
    with DataLoader(MemoizingDataset(64), batch_size=8, **MODES[mode]) as loader:
        for _ in range(3):
            for values, kinds in loader:
                rows = values.asnumpy()
                first = rows[:, 0, 0]
                np.testing.assert_array_equal(rows[:, 0], np.repeat(first[:, None], 4, 1))
                np.testing.assert_array_equal(rows[:, 1], rows[:, 0] + 0.5)
                assert set(kinds) == {ARRAY_TYPE.__name__}


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", list(MODES))
def test_rss_stays_flat_over_many_seeded_epochs(no_leaks, mode):
    """Reseeding MXNet per batch used to queue ~2 ms of engine work per batch, unbounded."""
    process = psutil.Process()
    data = np.random.rand(32, 8).astype("float32")
    with DataLoader(data, batch_size=8, seed=0, **MODES[mode]) as loader:
        for epoch in range(300):
            for _ in loader:
                pass
            if epoch == 30:
                mx.nd.waitall()
                start = process.memory_info().rss
        mx.nd.waitall()
        grown = process.memory_info().rss - start
    assert grown < 5 << 20, f"RSS grew by {grown / 1e6:.1f} MB over 270 seeded epochs"


@pytest.mark.timeout(120)
def test_a_slot_above_the_bound_is_returned_not_kept(no_leaks, monkeypatch):
    """Large slots are used once: after release neither side keeps the memory."""
    monkeypatch.setattr(slots, "MAX_KEPT_SLOT_BYTES", 1 << 20)
    data = np.ones((8, 1 << 18), dtype=np.float32)  # 1 MiB a sample, 4 MiB a batch
    before = shmem_kb()
    with DataLoader(data, batch_size=4, num_workers=1, prefetch=1) as loader:
        it = iter(loader)
        batch = next(it)
        mx.nd.waitall()
        held = shmem_kb() - before
        del batch
        for batch in it:
            del batch
        deadline = time.monotonic() + 5
        while shmem_kb() - before > 1024 and time.monotonic() < deadline:
            time.sleep(0.05)
        left = shmem_kb() - before
    assert held >= 3072  # the batch's 4 MiB slot (Shmem is system-wide: some slack)
    assert left <= 1024, f"{left} kB of shared memory kept after every batch was released"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_close_from_another_thread_wakes_the_waiter(no_leaks, mode):
    # A thread cannot be stopped inside __getitem__: keep its sleep short enough for the
    # leak check to see it end (thread workers make their first batches one after the
    # other, so two batches of two samples: 5 s). The first batch comes 2.5 s in; the loader
    # is closed 0.75 s in.
    data = SlowDataset(8, seconds=30.0 if mode == "process" else 1.25)
    loader = DataLoader(data, batch_size=2, timeout=None, **MODES[mode])
    it = iter(loader)
    outcome = []

    def consume():
        try:
            next(it)
        except BaseException as exc:  # noqa: BLE001
            outcome.append((type(exc), time.monotonic()))

    cpu = psutil.Process()
    waiter = threading.Thread(target=consume)
    waiter.start()
    time.sleep(0.25)
    busy = cpu.cpu_times()
    time.sleep(0.5)
    spent = sum(cpu.cpu_times()[:2]) - sum(busy[:2])
    closed_at = time.monotonic()
    loader.close()
    closed_in = time.monotonic() - closed_at
    waiter.join(10)
    assert not waiter.is_alive(), "the waiting thread never returned"
    assert outcome and outcome[0][0] is ClosedIteratorError, outcome
    # Woken by close() itself, at once, not by its worker's first batch (2.5 s in): the
    # waiter used to take the router's lock again between two short waits, and close(),
    # waiting for that lock, could lose the race until the batch came.
    assert outcome[0][1] - closed_at < 1.0, outcome[0][1] - closed_at
    # close() waits JOIN_TIMEOUT_S (2 s) for a worker inside __getitem__, then stops it.
    assert closed_in < 5.0, closed_in
    assert spent < 0.25, f"the waiting thread used {spent:.2f}s of CPU in 0.5s"


@pytest.mark.timeout(60)
def test_one_iterator_from_two_threads_is_refused(no_leaks):
    loader = DataLoader(SlowDataset(16, seconds=0.2), batch_size=2, num_workers=2)
    it = iter(loader)
    errors = []

    def consume():
        try:
            for _ in it:
                pass
        except RuntimeError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    loader.close()
    assert not any(t.is_alive() for t in threads)
    assert errors and "belongs to one consumer" in errors[0]


@pytest.mark.timeout(60)
def test_an_iterator_can_be_handed_over_between_threads(no_leaks):
    with DataLoader(RangeDataset(16), batch_size=4, num_workers=2) as loader:
        it = iter(loader)
        first = next(it)
        rest = []
        t = threading.Thread(target=lambda: rest.extend(it))
        t.start()
        t.join(30)
    labels = [b[1].asnumpy().tolist() for b in [first, *rest]]
    assert sum(labels, []) == list(range(16))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("inner_workers", [0, 2])
def test_a_loader_inside_a_process_worker(no_leaks, inner_workers):
    """Inline loaders work there (with NDArrays); process loaders say what to do."""
    data = InnerLoaderDataset(4, inner_workers)
    with DataLoader(data, batch_size=2, num_workers=2, batchify_fn=list) as loader:
        samples = [s for batch in loader for s in batch]
    if inner_workers == 0:
        assert [float(total) for total, _ in samples] == [15.0 + 6 * i for i in range(4)]
        assert {kind for _, kind in samples} == {ARRAY_TYPE.__name__}
    else:
        assert all("daemonic process" in message for _, message in samples)
        assert all("num_workers=0 or thread_pool=True" in message for _, message in samples)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(MODES))
def test_sparse_batches_pass_through_like_gluons(no_leaks, mode):
    data = np.eye(8, dtype=np.float32)
    kwargs = dict(batch_size=4, batchify_fn=sparse_batchify, **MODES[mode])
    # Gluon 2.x's worker processes cannot pickle sparse arrays under numpy shape semantics
    # (MXNetError "only allow serializing ndarray of default storage type"); shardloader's
    # can. There the reference is Gluon's loader without workers: the same batches.
    gluon_kwargs = dict(kwargs, num_workers=0) if MX2 and mode == "process" else kwargs
    reference = gluon.data.DataLoader(data, **gluon_kwargs)
    theirs = list(reference)
    del reference
    with DataLoader(data, **kwargs) as loader:
        mine = list(loader)
        assert loader.stats()["bytes"] > 0
    assert len(mine) == len(theirs) == 2
    for (csr, rsp), (gcsr, grsp) in zip(mine, theirs):
        assert (csr.stype, rsp.stype) == (gcsr.stype, grsp.stype) == ("csr", "row_sparse")
        np.testing.assert_array_equal(csr.asnumpy(), gcsr.asnumpy())
        np.testing.assert_array_equal(rsp.asnumpy(), grsp.asnumpy())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(MODES))
def test_masked_and_record_arrays_keep_what_they_carry(no_leaks, mode):
    data = np.arange(32, dtype=np.float32).reshape(8, 4) % 5
    with DataLoader(data, batch_size=4, batchify_fn=odd_arrays_batchify, **MODES[mode]) as ld:
        for masked, record in ld:
            assert isinstance(masked, np.ma.MaskedArray)
            assert (masked.mask == (masked.data < 2.0)).all()
            assert record.dtype.names == ("a", "b")


@pytest.mark.timeout(60)
def test_thread_workers_make_their_first_batch_one_at_a_time(no_leaks):
    """Lazy first-call set-up (a hybridized transform's graph) never runs in two threads."""
    data = LazySetupDataset(64)
    with DataLoader(data, batch_size=4, num_workers=4, thread_pool=True) as loader:
        got = [float(x) for batch in loader for x in batch.asnumpy()]
    assert got == list(range(64))
    assert data.most_inside == 1
