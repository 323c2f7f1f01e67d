"""The engine's stages on their own, without the loader: one contract test over every stage
of an epoch (``_engine.stage``), and the router's verbs over both kinds of pool."""

from __future__ import annotations

import os
import threading
import time

import mxnet as mx
import numpy as np
import pytest

from shardloader import batchify
from shardloader._engine.consumer import ConsumerStage, Position
from shardloader._engine.device import PinStage
from shardloader._engine.epoch import InlineEpoch, PooledEpoch
from shardloader._engine.ipc.alloc import numpy_flags
from shardloader._engine.pools import ProcessPool, ThreadPool
from shardloader._engine.protocol import Task
from shardloader._engine.router import NOT_READY, Router
from shardloader._engine.stage import CLOSED_MESSAGE
from shardloader._engine.stats import Stats
from shardloader._errors import ClosedIteratorError, LoaderTimeoutError, WorkerDiedError
from shardloader.prefetch import DevicePrefetcher

DATA = np.arange(40, dtype="float32")
BATCHES = [list(range(4 * i, 4 * i + 4)) for i in range(10)]


def _pool(kind: str, dataset=DATA, workers: int = 2):
    cls = ThreadPool if kind == "thread" else ProcessPool
    return cls(
        workers,
        dataset,
        batchify.Stack(),
        native_batchify=True,
        seed=None,
        worker_init_fn=None,
        start_method="fork",
        mxnet_per_sample=False,
        numpy_flags=numpy_flags(),
    )


def _items():
    return iter(enumerate(BATCHES))


class _Closeable:
    """A source that records whether it was closed."""

    def __init__(self, items) -> None:
        self.items = iter(items)
        self.closed = 0

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.items)

    def close(self) -> None:
        self.closed += 1


def _inline(source):
    stats = Stats()
    return InlineEpoch(source, lambda idx: mx.nd.array(DATA[idx]), stats)


def _arrays():
    return _Closeable(mx.nd.array(DATA[b]) for b in BATCHES)


# Each maker returns (stage, the source it must close or None).
def _make_inline():
    src = _Closeable(enumerate(BATCHES))
    return _inline(src), src


def _make_pin():
    src = _arrays()
    return PinStage(src, mx.cpu_pinned(0)), src


def _make_consumer():
    src = _arrays()
    position = Position(0, 0, None)
    return ConsumerStage(src, position, Stats(), lambda: None, lambda: 10), src


def _make_device():
    src = _arrays()
    return DevicePrefetcher(mx.cpu(1)).prefetch(src), src


def _make_pooled():
    router = Router(_pool("thread"), "raise", Stats())
    src = _Closeable(enumerate(BATCHES))
    stage = PooledEpoch(router, src, 0, 0, prefetch=4, timeout=10)
    stage.router_for_test = router
    return stage, src


MAKERS = {
    "inline": _make_inline,
    "pooled": _make_pooled,
    "pin": _make_pin,
    "device": _make_device,
    "consumer": _make_consumer,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(MAKERS))
def test_every_stage_follows_the_contract(name, no_leaks):
    stage, source = MAKERS[name]()
    try:
        # __next__ gives the items in order
        first = next(stage)
        assert first.asnumpy().tolist() == BATCHES[0]
        assert not stage.closed
        # close() is idempotent, closes the source once, and advancing raises one message
        stage.close()
        stage.close()
        assert stage.closed
        assert source.closed == 1
        with pytest.raises(ClosedIteratorError, match=f"^{CLOSED_MESSAGE}$"):
            next(stage)
        del first
    finally:
        router = getattr(stage, "router_for_test", None)
        if router is not None:
            router.shutdown()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(MAKERS))
def test_every_stage_ends_with_its_data_and_is_a_context_manager(name, no_leaks):
    stage, source = MAKERS[name]()
    try:
        with stage as it:
            got = [b.asnumpy().tolist() for b in it]
            assert got == BATCHES
            with pytest.raises(StopIteration):
                next(it)
            assert source.closed == 1  # ended: released and closed its source
        assert stage.closed
    finally:
        router = getattr(stage, "router_for_test", None)
        if router is not None:
            router.shutdown()


# -- the router, over both pools


@pytest.fixture(params=["thread", "process"])
def router(request):
    r = Router(_pool(request.param), "raise", Stats())
    yield r
    r.shutdown()


def _take(router, iter_id, deadline_s=10.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        batch = router.take(iter_id, 0.05)
        if batch is not NOT_READY:
            return batch
    raise AssertionError("no batch within the deadline")


@pytest.mark.timeout(60)
def test_router_returns_each_epochs_batches_in_order(no_leaks, router):
    router.open(1, 0, 0)
    router.open(2, 0, 0)
    router.dispatch(1, list(enumerate(BATCHES[:5])))
    router.dispatch(2, [(0, BATCHES[9]), (1, BATCHES[8])])
    assert router.in_flight(1) == 5 and router.in_flight(2) == 2
    assert _take(router, 2).asnumpy().tolist() == BATCHES[9]
    got = [_take(router, 1).asnumpy().tolist() for _ in range(5)]
    assert got == BATCHES[:5]
    assert _take(router, 2).asnumpy().tolist() == BATCHES[8]
    assert router.in_flight(1) == 0 and router.in_flight(2) == 0
    router.close(1)
    router.close(2)
    assert router.healthy


@pytest.mark.timeout(60)
def test_router_close_frees_buffered_batches_and_refuses_takes(no_leaks, router):
    router.open(1, 0, 0)
    router.dispatch(1, [(seq, BATCHES[seq]) for seq in (1, 2, 3)])  # batch 0 never comes
    for _ in range(20):  # the three arrive and wait in the reorder buffer for batch 0
        assert router.take(1, 0.05) is NOT_READY
    assert router.in_flight(1) == 3
    router.close(1)
    router.close(1)  # idempotent
    assert router.in_flight(1) == 0
    with pytest.raises(ClosedIteratorError):
        router.take(1, 0.01)


class _Stuck:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        time.sleep(1.0)
        return np.float32(i)


@pytest.mark.timeout(60)
def test_router_timeout_names_the_batch_and_marks_the_pool_for_rebuilding(no_leaks):
    router = Router(_pool("thread", dataset=_Stuck(), workers=1), "raise", Stats())
    try:
        stage = PooledEpoch(router, iter(enumerate([[0, 1]])), 0, 0, prefetch=1, timeout=0.2)
        with pytest.raises(LoaderTimeoutError, match=r"batch 0 \(indices \[0, 1\]\)") as info:
            next(stage)
        assert "first batch" not in str(info.value)  # it holds the turn itself
        assert not router.healthy
        assert stage.ended
    finally:
        router.shutdown()


class _StuckInBatchOne:
    """Index 4, batch 1's first sample, blocks until ``release`` is set, and says when it
    has started; every other index loads at once."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __len__(self) -> int:
        return len(DATA)

    def __getitem__(self, i):
        if i == 4:
            self.started.set()
            self.release.wait(30)
        return DATA[i]


@pytest.mark.timeout(60)
def test_a_timeout_behind_the_first_batch_names_the_batch_that_holds_it(no_leaks):
    """Thread workers make a pool's first batch one at a time (lazy set-up). When batch 1
    took that turn and is stuck, batch 0 waits behind it: the timeout is about batch 0, and
    must name batch 1 as where to look (before, only batch 0, whose samples are fine)."""
    ds = _StuckInBatchOne()
    router = Router(_pool("thread", dataset=ds), "raise", Stats())

    def items():
        # Batch 1 alone first: its thread takes the turn (there is no other batch yet) and
        # blocks in sample 4. Only then is batch 0 dispatched, to the other thread.
        yield 1, BATCHES[1]
        if not ds.started.wait(10):
            raise AssertionError("batch 1 never started")
        yield 0, BATCHES[0]

    try:
        stage = PooledEpoch(router, items(), 0, 0, prefetch=2, timeout=0.3)
        assert ds.started.is_set() and stage.in_flight == 2
        with pytest.raises(LoaderTimeoutError) as info:
            next(stage)
        err = info.value
        assert err.seq == 0 and list(err.indices) == BATCHES[0]
        message = str(err)
        assert message.startswith("batch 0 (indices [0, 1, 2, 3]) was not ready after")
        assert "It waits for the pool's first batch" in message
        assert "it is batch 1 (indices [4, 5, 6, 7]), in the making for" in message
        assert "look there" in message
        assert not router.healthy
    finally:
        ds.release.set()
        router.shutdown()


@pytest.mark.timeout(60)
def test_a_timeout_behind_another_epochs_first_batch_says_whose_it_is(no_leaks):
    """Two epochs open on one pool: the first one's batch 0 holds the turn, stuck; the
    second one's batch 0 times out behind it, and the message says it is another epoch's."""
    ds = _StuckInBatchOne()
    router = Router(_pool("thread", dataset=ds), "raise", Stats())
    try:
        first = PooledEpoch(router, iter([(0, BATCHES[1])]), 0, 0, prefetch=1, timeout=None)
        assert ds.started.wait(10)
        second = PooledEpoch(router, iter([(0, BATCHES[0])]), 0, 0, prefetch=1, timeout=0.3)
        with pytest.raises(LoaderTimeoutError) as info:
            next(second)
        assert info.value.seq == 0 and list(info.value.indices) == BATCHES[0]
        assert "it is batch 0 of another epoch (indices [4, 5, 6, 7])" in str(info.value)
        first.close()
    finally:
        ds.release.set()
        router.shutdown()


class _DiesOnce:
    """Index 5 kills its worker process while ``flag`` exists, and removes it first: the
    first worker to load it dies, the next one loads it."""

    def __init__(self, flag) -> None:
        self.flag = str(flag)

    def __len__(self) -> int:
        return len(DATA)

    def __getitem__(self, i):
        if i == 5 and os.path.exists(self.flag):
            os.unlink(self.flag)
            os._exit(3)
        return DATA[i]


def _poll_until_lost(pool, deadline_s=20.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        _, lost = pool.poll(0.1)
        if lost:
            return lost
    raise AssertionError("no worker death within the deadline")


@pytest.mark.timeout(60)
def test_a_lost_worker_names_the_batches_it_owed_as_keys(no_leaks, tmp_path):
    """The pool tracks only which batches a worker owes, ``(iter_id, seq)``; their indices
    live in the router's registry."""
    flag = tmp_path / "die"
    flag.touch()
    pool = _pool("process", dataset=_DiesOnce(flag), workers=1)
    try:
        pool.submit(Task(7, 0, [(3, [4, 5, 6, 7]), (4, [8, 9, 10, 11])]))
        (lost,) = _poll_until_lost(pool)
        assert lost.exitcode == 3
        assert lost.batches == [(7, 3), (7, 4)]
    finally:
        pool.close()


@pytest.mark.timeout(60)
def test_router_resends_a_dead_workers_batches_from_its_registry(no_leaks, tmp_path):
    flag = tmp_path / "die"
    flag.touch()
    router = Router(_pool("process", dataset=_DiesOnce(flag)), "restart", Stats())
    try:
        router.open(1, 0, 3)
        router.dispatch(1, list(enumerate(BATCHES[:4])))
        got = [_take(router, 1, 30.0).asnumpy().tolist() for _ in range(4)]
        assert got == BATCHES[:4]
        assert not flag.exists(), "a worker died on index 5, and its batch was sent again"
        assert router.in_flight(1) == 0 and router.healthy
        router.close(1)
    finally:
        router.shutdown()


@pytest.mark.timeout(60)
def test_router_names_a_dead_workers_batch_from_its_registry(no_leaks, tmp_path):
    flag = tmp_path / "die"
    flag.touch()
    router = Router(_pool("process", dataset=_DiesOnce(flag), workers=1), "raise", Stats())
    try:
        router.open(1, 0, 0)
        router.dispatch(1, [(0, BATCHES[1])])  # indices 4-7: the worker dies on 5
        with pytest.raises(WorkerDiedError, match=r"batch 0 \(indices \[4, 5, 6, 7\]\)") as info:
            _take(router, 1, 30.0)
        assert info.value.seq == 0 and list(info.value.indices) == [4, 5, 6, 7]
        assert not router.healthy
    finally:
        router.shutdown()


@pytest.mark.timeout(60)
def test_cancel_wakes_a_stage_waiting_on_another_thread(no_leaks):
    router = Router(_pool("thread", dataset=_Stuck(), workers=1), "raise", Stats())
    stage = PooledEpoch(router, iter(enumerate([[0], [1]])), 0, 0, prefetch=1, timeout=None)
    outcome = []

    def consume():
        try:
            next(stage)
        except ClosedIteratorError as exc:
            outcome.append(exc)

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.1)
    started = time.monotonic()
    stage.cancel()
    t.join(5)
    assert outcome and time.monotonic() - started < 0.5
    stage.close()
    router.shutdown()
