"""Prefetcher, DevicePrefetcher and the placement helpers they use.

One contract (order, errors, warm start, close, garbage collection, break) runs against every
stage: a plain Prefetcher, a DevicePrefetcher with one context and with a list of contexts,
and the composition Prefetcher -> DevicePrefetcher.
"""

import collections
import gc
import itertools
import threading
import time
import traceback

import mxnet as mx
import numpy as np
import pytest
from conftest import our_threads

from shardloader import prefetch
from shardloader._engine import device as _device
from shardloader._engine import timing
from shardloader._errors import ClosedIteratorError, WorkerError
from shardloader.prefetch import DevicePrefetcher, Prefetcher, PrefetchIterator

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_thread_leak")]


# -- the stages under test --------------------------------------------------------------------

SHARD_CTXS = [mx.cpu(0), mx.cpu(1)]


def plain_item(i):
    return mx.nd.full((3,), i)


def sharded_item(i):
    return [mx.nd.full((3,), i), mx.nd.full((3,), -i)]


def plain_value(item):
    return int(item.asnumpy()[0])


def sharded_value(item):
    assert [shard.context for shard in item] == SHARD_CTXS
    assert int(item[1].asnumpy()[0]) == -int(item[0].asnumpy()[0])
    return int(item[0].asnumpy()[0])


def device_value(item):
    assert item.context == mx.cpu(1)
    return plain_value(item)


Stage = collections.namedtuple("Stage", "make item value")

STAGES = {
    "prefetcher": Stage(lambda src: Prefetcher(2).prefetch(src), plain_item, plain_value),
    "device": Stage(
        lambda src: DevicePrefetcher(mx.cpu(1), 2).prefetch(src), plain_item, device_value
    ),
    "device-shards": Stage(
        lambda src: DevicePrefetcher(SHARD_CTXS, 2).prefetch(src), sharded_item, sharded_value
    ),
    "composed": Stage(
        lambda src: DevicePrefetcher(SHARD_CTXS, 2).prefetch(Prefetcher(2).prefetch(src)),
        sharded_item,
        sharded_value,
    ),
}


@pytest.fixture(params=sorted(STAGES))
def stage(request):
    return STAGES[request.param]


class Source:
    """A generator-backed source that records what was pulled and whether it was closed."""

    def __init__(self, item, n, fail_at=None, delay_s=0.0):
        self.item, self.n, self.fail_at, self.delay_s = item, n, fail_at, delay_s
        self.pulled = 0
        self.closed = threading.Event()

    def __iter__(self):
        return self._generate()

    def _generate(self):
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise KeyError(f"sample {i} is missing")
                time.sleep(self.delay_s)
                self.pulled += 1
                yield self.item(i)
        finally:
            self.closed.set()


def wait_until(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


# -- the shared contract ------------------------------------------------------------------------


def test_order_and_completeness(stage):
    source = Source(stage.item, 200)
    it = stage.make(source)
    assert [stage.value(x) for x in it] == list(range(200))
    assert source.closed.wait(5)
    with pytest.raises(StopIteration):
        next(it)
    assert not our_threads()


def test_producer_exception_reaches_consumer_at_its_position(stage):
    source = Source(stage.item, 10, fail_at=4)
    it = stage.make(source)
    got = []
    with pytest.raises(KeyError, match="sample 4 is missing") as info:
        for x in it:
            got.append(stage.value(x))
    assert got == [0, 1, 2, 3]
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "_generate" in frames, frames  # the source's own frame is in the traceback
    with pytest.raises(StopIteration):  # finished after the error
        next(it)
    assert not our_threads()


def test_warm_start_pulls_before_first_next(stage):
    source = Source(stage.item, 100)
    it = stage.make(source)
    assert wait_until(lambda: source.pulled >= 2), "nothing was pulled before the first next()"
    assert stage.value(next(it)) == 0
    it.close()


def test_close_stops_thread_and_closes_source(stage):
    source = Source(stage.item, 10_000)
    it = stage.make(source)
    assert stage.value(next(it)) == 0
    it.close()
    assert not our_threads()
    assert source.closed.is_set()
    with pytest.raises(ClosedIteratorError):
        next(it)
    it.close()  # idempotent


def test_garbage_collection_stops_thread(stage):
    source = Source(stage.item, 10_000)
    it = stage.make(source)
    next(it)
    del it
    gc.collect()
    assert wait_until(lambda: not our_threads(), 2.0), our_threads()
    assert source.closed.wait(2)


def test_break_stops_thread(stage):
    source = Source(stage.item, 10_000)
    for i, _x in enumerate(stage.make(source)):
        if i == 3:
            break
    assert wait_until(lambda: not our_threads(), 2.0), our_threads()


def test_context_manager(stage):
    with stage.make(Source(stage.item, 100)) as it:
        assert stage.value(next(it)) == 0
    assert it.closed
    assert not our_threads()


# -- Prefetcher specifics -----------------------------------------------------------------------


def test_back_pressure_bounds_items_in_flight():
    source = Source(int, 100)
    it = Prefetcher(buffer_size=3).prefetch(source)
    assert wait_until(lambda: source.pulled == 3)
    time.sleep(5 * timing.PREFETCH_POLL_S)
    assert source.pulled == 3  # the thread waits for a free slot before pulling more
    assert next(it) == 0
    assert wait_until(lambda: source.pulled == 4)
    it.close()


def test_infinite_source_and_many_iterators_leave_no_thread():
    before = len(threading.enumerate())
    for _ in range(30):
        it = Prefetcher(2).prefetch(itertools.count())
        assert next(it) == 0
        it.close()
    for _ in range(30):
        for _x in Prefetcher(2).prefetch(itertools.count()):
            break
    gc.collect()
    assert wait_until(lambda: len(threading.enumerate()) == before, 2.0)


def test_close_while_source_is_slow_returns_promptly():
    source = Source(int, 100, delay_s=0.3)
    it = Prefetcher(2).prefetch(source)
    time.sleep(0.05)  # the thread is now inside the source's next()
    start = time.monotonic()
    it.close()
    assert time.monotonic() - start < 2.0
    assert not our_threads()


def test_dead_thread_without_sentinel_is_an_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(prefetch, "_produce", lambda *args: None)
    it = PrefetchIterator([1, 2, 3])
    with pytest.raises(WorkerError, match="ended without"):
        next(it)


def test_stop_iteration_from_a_transform_is_not_taken_for_the_end():
    def transform(item):
        raise StopIteration

    it = PrefetchIterator([1, 2], transform=transform)
    with pytest.raises(RuntimeError, match="StopIteration"):
        next(it)


def test_empty_source():
    it = Prefetcher().prefetch([])
    assert list(it) == []


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError)])
def test_buffer_size_is_validated(bad, error):
    with pytest.raises(error, match="buffer_size"):
        Prefetcher(bad)
    with pytest.raises(error, match="buffer_size"):
        DevicePrefetcher(mx.cpu(0), bad)


def test_not_iterable_raises_at_prefetch():
    with pytest.raises(TypeError):
        Prefetcher().prefetch(42)


# -- DevicePrefetcher and placement -------------------------------------------------------------


@pytest.mark.parametrize(
    "ctxs", [[mx.cpu(0), mx.cpu(1)], [mx.cpu(1), mx.cpu_pinned(0)], [mx.cpu_pinned(0)] * 2]
)
def test_device_prefetcher_puts_shard_i_on_ctx_i(ctxs):
    steps = [[mx.nd.full((2, 2), i), mx.nd.full((2, 2), 10 + i)] for i in range(5)]
    with DevicePrefetcher(ctxs).prefetch(steps) as it:
        out = list(it)
    assert len(out) == 5
    for i, step in enumerate(out):
        assert [shard.context for shard in step] == ctxs
        assert step[0].asnumpy().tolist() == [[i, i], [i, i]]
        assert step[1].asnumpy()[0, 0] == 10 + i


def test_device_prefetcher_single_ctx_moves_nested_ndarrays_only():
    Pair = collections.namedtuple("Pair", "x y")
    lengths = np.array([3, 1])
    items = [{"pair": Pair(mx.nd.ones((2,)), mx.nd.zeros((1,))), "lengths": lengths}] * 3
    with DevicePrefetcher(mx.cpu_pinned(0)).prefetch(items) as it:
        out = list(it)
    for item in out:
        assert isinstance(item["pair"], Pair)
        assert item["pair"].x.context == mx.cpu_pinned(0)
        assert item["pair"].y.context == mx.cpu_pinned(0)
        assert item["lengths"] is lengths


def test_device_prefetcher_shard_count_mismatch_reaches_consumer():
    steps = [[mx.nd.ones((1,))] * 3]
    it = DevicePrefetcher([mx.cpu(0), mx.cpu(1)]).prefetch(steps)
    with pytest.raises(ValueError, match="3 shards but 2 contexts"):
        next(it)


def test_normalize_ctx():
    assert _device.normalize_ctx(mx.cpu(1)) == mx.cpu(1)
    assert _device.normalize_ctx((mx.cpu(0), mx.cpu(1))) == [mx.cpu(0), mx.cpu(1)]
    with pytest.raises(TypeError, match="pin_ctx"):
        _device.normalize_ctx("cpu(0)", name="pin_ctx")
    with pytest.raises(TypeError, match=r"ctx\[1\]"):
        _device.normalize_ctx([mx.cpu(0), 1])
    with pytest.raises(ValueError, match="at least one"):
        _device.normalize_ctx([])
    with pytest.raises(TypeError, match="ctx"):
        DevicePrefetcher(None)


def test_place_keeps_structure_and_passes_numpy_through():
    Pair = collections.namedtuple("Pair", "a b")
    arr = np.arange(3)
    nd = mx.nd.ones((2,))
    batch = [nd, (nd, arr), {"k": Pair(nd, 5)}, "tag"]
    out = _device.place(batch, mx.cpu(1))
    _device.wait_to_read(out)
    assert out[0].context == mx.cpu(1)
    assert isinstance(out[1], tuple) and out[1][1] is arr
    assert isinstance(out[2]["k"], Pair) and out[2]["k"].b == 5
    assert out[2]["k"].a.context == mx.cpu(1)
    assert out[3] == "tag"
    assert _device.place(nd, mx.cpu(0)) is nd  # already there: no copy


def test_place_shards_validates():
    with pytest.raises(ValueError, match="3 shards but 2 contexts"):
        _device.place_shards([mx.nd.ones((1,))] * 3, [mx.cpu(0), mx.cpu(1)])
    # An incomplete last step (fewer shards than contexts) fills the first contexts.
    (only,) = _device.place_shards([mx.nd.ones((1,))], [mx.cpu(1), mx.cpu(0)])
    assert only.context == mx.cpu(1)
    with pytest.raises(TypeError, match="list"):
        _device.place_shards(mx.nd.ones((1,)), [mx.cpu(0)])


def _containers(batch):
    """The container types of a nested batch, and its leaves (NDArrays as their values)."""
    if isinstance(batch, dict):
        return (type(batch).__name__, {k: _containers(v) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, [_containers(b) for b in batch])
    if isinstance(batch, mx.nd.NDArray):
        return ("nd", batch.asnumpy().tolist())
    return batch


def test_pin_gives_gluons_containers():
    """``pin`` is what pin_memory returns: Gluon's ``_as_in_context`` makes every list and
    tuple (namedtuples too), at any depth, a list, and returns a dict as it is."""
    from mxnet.gluon.data.dataloader import _as_in_context

    Pair = collections.namedtuple("Pair", "x y")
    nd = mx.nd.arange(3)
    arr = np.arange(2)
    batch = (nd, [Pair(nd, (nd, 4)), "tag"], arr, {"k": (nd, Pair(nd, 1))})
    theirs = _as_in_context(batch, mx.cpu_pinned(0))
    ours = _device.pin(batch, mx.cpu_pinned(0))
    _device.wait_to_read(ours)
    assert _containers(ours) == _containers(theirs)
    assert type(ours) is list and type(ours[1][0]) is list and type(ours[1][0][1]) is list
    assert ours[2] is arr
    # Gluon leaves the NDArrays of a dict where they are; they are pinned here.
    assert theirs[3]["k"][0].context == mx.cpu(0)
    assert ours[3]["k"][0].context == mx.cpu_pinned(0)
    assert ours[3]["k"][1].x.context == mx.cpu_pinned(0)
    assert ours[0].context == ours[1][0][1][0].context == mx.cpu_pinned(0)
    # place keeps every container's type: ctx= uses it.
    placed = _device.place(batch, mx.cpu_pinned(0))
    assert type(placed) is tuple and type(placed[1][0]) is Pair
