"""Sharded steps and per-device placement (issue 5, points 2 and 3).

A *step* is a list of per-shard batches, one per device. These tests check, for inline, thread
and process workers, that:

- ``num_shards=N`` groups any batch sampler's batches into steps, with the ``last_batch`` policy
  for the incomplete last group and a matching ``len()``: every step has ``N`` non-empty
  shards (``'keep'`` spreads a short tail over them), no sample is repeated unless the tail has
  fewer samples than shards, and ``stats()["repeated_samples"]`` counts those repeats;
- a batch sampler that yields steps itself (``FixedBucketSampler(num_shards=...)``) pads every
  shard only to its own longest sequence;
- ``ctx`` puts shard ``i`` on ``ctx[i]`` (or everything on a single context) before the user
  sees the step, without changing the values, on a bounded background thread that never
  outlives the loader and never swallows a worker's error;
- a ``DevicePrefetcher`` stage composes with a sharded loader.
"""

from __future__ import annotations

import gc
import threading
import time

import mxnet as mx
import numpy as np
import pytest
from _backends import FixedSampler
from _datasets import FailingDataset, RangeDataset, VarLenDataset

from shardloader import ShardedDataLoader, batchify
from shardloader.prefetch import DevicePrefetcher
from shardloader.sampler import (
    BatchSampler,
    FixedBucketSampler,
    RandomSampler,
    SequentialSampler,
    ShardGroupSampler,
    SortedBucketSampler,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

BACKENDS = {
    "inline": dict(num_workers=0),
    "thread": dict(num_workers=2, thread_pool=True),
    "fork": dict(num_workers=2, start_method="fork"),
}
IN_PROCESS = {k: BACKENDS[k] for k in ("inline", "thread")}
CTXS = [mx.cpu(0), mx.cpu(1)]


@pytest.fixture(params=list(BACKENDS))
def backend(request):
    return BACKENDS[request.param]


def step_ids(step):
    """The sample ids of a step of ``(data, label)`` batches: one list per shard."""
    return [[int(v) for v in label.asnumpy()] for _, label in step]


def epoch_ids(loader):
    """One epoch as a list of steps, each a list of per-shard id lists."""
    return [step_ids(step) for step in loader]


def flat(steps):
    return [i for step in steps for shard in step for i in shard]


def device_threads():
    return [t for t in threading.enumerate() if t.name.startswith("shardloader-device")]


def wait_until(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# ---------------------------------------------------------------- num_shards on any sampler

# 23 samples, batches of 3, steps of 3 shards: 7 full batches and one of 2 (ids 21, 22).
N, BATCH, SHARDS = 23, 3, 3


def test_keep_spreads_a_short_last_step_and_yields_every_sample_once(backend):
    with ShardedDataLoader(
        RangeDataset(N), batch_size=BATCH, num_shards=SHARDS, last_batch="keep", **backend
    ) as loader:
        for _ in range(2):
            expected_len = len(loader)
            steps = epoch_ids(loader)
            assert len(steps) == expected_len == 3
            assert [len(step) for step in steps] == [3, 3, 3]  # every step full
            assert steps[0] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]  # batches in sampler order
            # The 2 leftover batches, [18, 19, 20] and [21, 22], spread over 3 shards.
            assert steps[-1] == [[18, 19], [20], [21, 22]]
            assert sorted(flat(steps)) == list(range(N))  # exactly once
        assert loader.stats()["repeated_samples"] == 0


@pytest.mark.parametrize("n,last", [(19, [[18], [17], [16]]), (20, [[18], [19], [17]])])
def test_keep_repeats_only_a_tail_shorter_than_the_shards_and_counts_it(backend, n, last):
    """19 samples leave 1 for the last step of 3 shards, 20 leave 2: the missing shards get
    the last samples of the step before, and stats() counts them, epoch after epoch."""
    with ShardedDataLoader(
        RangeDataset(n), batch_size=BATCH, num_shards=SHARDS, **backend
    ) as loader:
        repeats = SHARDS - (n - 18)
        for epoch in range(2):
            steps = epoch_ids(loader)
            assert len(steps) == len(loader) == 3
            assert all(len(step) == SHARDS and all(step) for step in steps)
            assert steps[-1] == last
            assert sorted(set(flat(steps))) == list(range(n))
            assert len(flat(steps)) == n + repeats
            assert loader.stats()["repeated_samples"] == repeats * (epoch + 1)
        loader.reset_stats()
        assert loader.stats()["repeated_samples"] == 0


def test_partial_steps_come_only_when_asked_for_by_name(backend):
    steps = ShardGroupSampler(BatchSampler(SequentialSampler(N), BATCH), SHARDS, "partial")
    with ShardedDataLoader(RangeDataset(N), batch_sampler=steps, **backend) as loader:
        got = epoch_ids(loader)
        assert len(got) == len(loader) == 3
        assert got[-1] == [[18, 19, 20], [21, 22]]  # 2 shards: what 'partial' means
        assert loader.stats()["repeated_samples"] == 0


def test_discard_drops_the_short_batch_and_the_short_group(backend):
    with ShardedDataLoader(
        RangeDataset(N), batch_size=BATCH, num_shards=SHARDS, last_batch="discard", **backend
    ) as loader:
        for _ in range(2):
            expected_len = len(loader)
            steps = epoch_ids(loader)
            assert len(steps) == expected_len == 2
            assert all(len(step) == SHARDS for step in steps)
            assert all(len(shard) == BATCH for step in steps for shard in step)
            ids = flat(steps)
            assert len(set(ids)) == len(ids)  # at most once
            assert ids == list(range(18))  # only the incomplete tail is dropped


def test_rollover_carries_the_short_group_into_the_next_epoch(backend):
    """Over several epochs the samples come out as an uninterrupted stream of passes: the
    short group of one epoch opens the next one, and nothing is lost or repeated."""
    with ShardedDataLoader(
        RangeDataset(N), batch_size=BATCH, num_shards=SHARDS, last_batch="rollover", **backend
    ) as loader:
        stream, lengths = [], []
        for _ in range(4):
            expected_len = len(loader)
            steps = epoch_ids(loader)
            assert len(steps) == expected_len
            assert all(len(step) == SHARDS for step in steps)
            assert all(len(shard) == BATCH for step in steps for shard in step)
            lengths.append(len(steps))
            stream.extend(flat(steps))
        assert lengths == [2, 3, 2, 3]
        passes = list(range(N)) * 4
        assert stream == passes[: len(stream)]
        assert len(passes) - len(stream) < BATCH * SHARDS  # only the last carry is pending


def test_num_shards_groups_a_shuffled_sampler_without_repeats(backend):
    kwargs = dict(batch_size=4, shuffle=True, seed=7, last_batch="keep")
    dataset = RangeDataset(30)
    with ShardedDataLoader(dataset, **kwargs, **backend) as plain:
        batches = [[int(v) for v in y.asnumpy()] for _, y in plain]
    with ShardedDataLoader(dataset, num_shards=2, **kwargs, **backend) as sharded:
        steps = epoch_ids(sharded)
    # The same batches, in the same order, two to a step.
    assert [shard for step in steps for shard in step] == batches
    assert [len(step) for step in steps] == [2, 2, 2, 2]
    assert sorted(flat(steps)) == list(range(30))


def spread_in_two(batches):
    """The steps of 2 shards that 'keep' makes of ``batches``: pairs, and a leftover batch
    cut into two halves (the longer first)."""
    steps = [batches[i : i + 2] for i in range(0, len(batches) - 1, 2)]
    if len(batches) % 2:
        last = batches[-1]
        half = (len(last) + 1) // 2
        steps.append([last[:half], last[half:]])
    return steps


@pytest.mark.parametrize(
    "make",
    [
        lambda: FixedSampler([[0, 1], [2], [3, 4, 5], [6], [7, 8, 9]]),
        lambda: SortedBucketSampler(list(range(10)), batch_size=3),
        lambda: BatchSampler(RandomSampler(10, seed=1), 3, "keep"),
    ],
    ids=["plain-iterable", "sorted-bucket", "batch-sampler"],
)
def test_num_shards_wraps_any_batch_sampler(backend, make):
    batches = [list(map(int, b)) for b in make()]
    with ShardedDataLoader(
        RangeDataset(10), batch_sampler=make(), num_shards=2, **backend
    ) as loader:
        assert len(loader) == (len(batches) + 1) // 2
        steps = epoch_ids(loader)
    assert steps == spread_in_two(batches)
    assert sorted(flat(steps)) == list(range(10))


def test_num_shards_refuses_a_sampler_that_already_yields_steps():
    steps = FixedBucketSampler([1] * 10, 2, num_shards=2)
    with pytest.raises(ValueError, match="already groups shards"):
        ShardedDataLoader(RangeDataset(10), batch_sampler=steps, num_shards=2)


def test_num_shards_with_num_parts_gives_disjoint_covering_parts():
    parts = []
    for part_index in range(2):
        with ShardedDataLoader(
            RangeDataset(22),
            batch_size=2,
            shuffle=True,
            seed=3,
            num_shards=2,
            num_parts=2,
            part_index=part_index,
        ) as loader:
            steps = epoch_ids(loader)
            assert len(steps) == len(loader)
            assert all(len(step) == 2 and all(step) for step in steps)
            parts.append(flat(steps))
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == list(range(22))


# ---------------------------------------------------------------- steps from the sampler itself

VARLEN = 60
LENGTHS = [1 + i % 7 for i in range(VARLEN)]  # VarLenDataset's lengths
PAD_STACK = batchify.Tuple(batchify.Pad(pad_val=0), batchify.Stack())


def bucket_steps(**kwargs):
    return FixedBucketSampler(LENGTHS, 4, num_buckets=3, num_shards=2, shuffle=True, **kwargs)


def check_varlen_shard(data, label):
    """Each row is sample ``i`` (``arange(len) + i``) followed by zero padding, and the
    shard is padded only to its own longest sample."""
    data, ids = data.asnumpy(), label.asnumpy().astype(int)
    lengths = [LENGTHS[i] for i in ids]
    assert data.shape == (len(ids), max(lengths))
    for row, i, n in zip(data, ids, lengths):
        assert row[:n].tolist() == list(range(i, i + n))
        assert not row[n:].any()
    return data.shape[1]


@pytest.mark.parametrize("with_ctx", [False, True], ids=["host", "ctx"])
def test_bucket_steps_pad_each_shard_to_its_own_longest(backend, with_ctx):
    sampler = bucket_steps(seed=5)
    expected = list(sampler)
    extra = dict(ctx=CTXS) if with_ctx else {}
    with ShardedDataLoader(
        VarLenDataset(VARLEN),
        batch_sampler=bucket_steps(seed=5),
        batchify_fn=PAD_STACK,
        **backend,
        **extra,
    ) as loader:
        assert len(loader) == len(expected)
        widths, ids = [], []
        for step, indices in zip(loader, expected):
            assert step_ids(step) == indices
            assert len(step) == 2  # every step full
            widths.append([check_varlen_shard(data, label) for data, label in step])
            ids.extend(i for shard in step_ids(step) for i in shard)
            if with_ctx:
                assert [data.context for data, _ in step] == CTXS
        repeated = loader.stats()["repeated_samples"]
    assert sorted(set(ids)) == list(range(VARLEN)) and len(ids) == VARLEN + repeated
    # The point of per-shard batches: the shards of one step have different widths, where
    # padding across devices would have given every shard the widest one.
    assert any(len(set(w)) > 1 for w in widths)


# ---------------------------------------------------------------- per-device placement


def plain_steps(dataset, **kwargs):
    """The steps (or, without ``num_shards``, the batches) as numpy, loaded without
    placement, for comparing values."""
    with ShardedDataLoader(dataset, **kwargs) as loader:
        if not kwargs.get("num_shards"):
            return [(x.asnumpy(), y.asnumpy()) for x, y in loader]
        return [[(x.asnumpy(), y.asnumpy()) for x, y in step] for step in loader]


@pytest.mark.parametrize(
    "ctxs", [CTXS, [mx.cpu_pinned(0), mx.cpu_pinned(1)]], ids=["cpu", "cpu_pinned"]
)
def test_shard_i_arrives_on_ctx_i_with_the_same_values(backend, ctxs):
    kwargs = dict(batch_size=3, num_shards=2, shuffle=True, seed=1)
    expected = plain_steps(RangeDataset(24), **kwargs)
    with ShardedDataLoader(RangeDataset(24), ctx=ctxs, **kwargs, **backend) as loader:
        got = list(loader)
    assert len(got) == len(expected) == 4
    for step, want in zip(got, expected):
        assert len(step) == 2
        for i, (data, label) in enumerate(step):
            assert data.context == ctxs[i] and label.context == ctxs[i]
            np.testing.assert_array_equal(data.asnumpy(), want[i][0])
            np.testing.assert_array_equal(label.asnumpy(), want[i][1])


def test_keep_gives_the_last_step_a_shard_on_every_context(backend):
    with ShardedDataLoader(
        RangeDataset(10), batch_size=2, num_shards=2, ctx=CTXS, last_batch="keep", **backend
    ) as loader:
        steps = list(loader)
    assert [len(step) for step in steps] == [2, 2, 2]
    for step in steps:
        assert [data.context for data, _ in step] == CTXS
    assert step_ids(steps[-1]) == [[8], [9]]


def test_partial_last_step_is_placed_on_the_first_contexts(backend):
    """With last_group='partial' the last step has fewer shards than contexts: shard i still
    goes to ctx[i], and the step is delivered, not turned into an error."""
    steps = ShardGroupSampler(BatchSampler(SequentialSampler(10), 2), 2, last_group="partial")
    with ShardedDataLoader(RangeDataset(10), batch_sampler=steps, ctx=CTXS, **backend) as loader:
        steps = list(loader)
    assert [len(step) for step in steps] == [2, 2, 1]
    for step in steps:
        assert [data.context for data, _ in step] == CTXS[: len(step)]
    assert step_ids(steps[-1]) == [[8, 9]]


@pytest.mark.parametrize("ctx", [mx.cpu(1), [mx.cpu(1)]], ids=["context", "one-item-list"])
@pytest.mark.parametrize("num_shards", [0, 2])
def test_single_context_takes_the_whole_batch(backend, ctx, num_shards):
    kwargs = dict(batch_size=2, num_shards=num_shards)
    expected = plain_steps(RangeDataset(8), **kwargs)
    with ShardedDataLoader(RangeDataset(8), ctx=ctx, **kwargs, **backend) as loader:
        got = list(loader)
    assert len(got) == len(expected)
    for item, want in zip(got, expected):
        batches = item if num_shards else [item]
        want = want if num_shards else [want]
        for (data, label), (want_x, want_y) in zip(batches, want):
            assert data.context == mx.cpu(1) and label.context == mx.cpu(1)
            np.testing.assert_array_equal(data.asnumpy(), want_x)
            np.testing.assert_array_equal(label.asnumpy(), want_y)


def first_item(*args, **kwargs):
    """Build a loader and take its first item (either may raise), then close it."""
    with ShardedDataLoader(*args, **kwargs) as loader:
        return next(iter(loader))


def test_more_shards_than_contexts_is_a_clear_error():
    with pytest.raises(ValueError) as info:
        first_item(RangeDataset(12), batch_size=2, num_shards=3, ctx=CTXS, num_workers=2)
    text = str(info.value)
    assert "3" in text and "2 contexts" in text


def test_several_contexts_without_shards_is_a_clear_error():
    """A (data, label) batch is not a step: it must not be split across the contexts (data
    on ctx[0], labels on ctx[1])."""
    with pytest.raises(ValueError, match="shard"):
        first_item(RangeDataset(8), batch_size=2, ctx=CTXS)


def test_pin_memory_and_ctx_are_rejected_together():
    with pytest.raises(ValueError, match="pin_memory and ctx"):
        ShardedDataLoader(RangeDataset(8), batch_size=2, num_shards=2, pin_memory=True, ctx=CTXS)


@pytest.mark.parametrize("ctx", ["cpu(0)", [mx.cpu(0), "gpu(1)"], []])
def test_bad_ctx_values_are_rejected_up_front(ctx):
    with pytest.raises((TypeError, ValueError), match="ctx"):
        ShardedDataLoader(RangeDataset(8), batch_size=2, num_shards=2, ctx=ctx)


# ---------------------------------------------------------------- the device stage


class RecordingDataset(RangeDataset):
    """Remembers which samples were loaded (inline and thread workers share it)."""

    def __init__(self, n):
        super().__init__(n)
        self.loaded = []
        self.lock = threading.Lock()

    def __getitem__(self, i):
        with self.lock:
            self.loaded.append(i)
        return super().__getitem__(i)


@pytest.mark.parametrize("name", list(IN_PROCESS))
def test_device_stage_runs_ahead_only_a_bounded_number_of_steps(name):
    backend = IN_PROCESS[name]
    dataset = RecordingDataset(400)  # 100 steps of 2 x 2
    with ShardedDataLoader(
        dataset, batch_size=2, num_shards=2, ctx=CTXS, prefetch=2, **backend
    ) as loader:
        it = iter(loader)
        next(it)
        assert device_threads(), "placement should run on a background thread"
        time.sleep(0.5)  # let the stages fill their buffers
        loaded = len(dataset.loaded)
        # The step taken, the device stage's buffer (prefetch), the steps in flight in the
        # pool (prefetch) and the one being pulled: 6 steps of 4 samples, not the epoch.
        bound = 4 * (1 + 2 + 2 + 1)
        assert loaded <= bound, f"{loaded} samples loaded ahead of a consumer at step 1"
        rest = list(it)
    assert len(rest) == 99
    assert sorted(dataset.loaded) == list(range(400))


def test_no_device_thread_outlives_break_gc_or_close(backend):
    loader = ShardedDataLoader(RangeDataset(200), batch_size=2, num_shards=2, ctx=CTXS, **backend)
    for _ in loader:
        assert device_threads()
        break
    gc.collect()
    assert wait_until(lambda: not device_threads()), "break left a device thread"

    it = iter(loader)
    next(it)
    del it
    gc.collect()
    assert wait_until(lambda: not device_threads()), "garbage collection left a device thread"

    it = iter(loader)
    next(it)
    loader.close()
    assert wait_until(lambda: not device_threads()), "close() left a device thread"
    del it

    # A loader dropped mid-epoch without close() takes its device thread with it too.
    loader = ShardedDataLoader(RangeDataset(200), batch_size=2, num_shards=2, ctx=CTXS, **backend)
    it = iter(loader)
    next(it)
    del it, loader
    gc.collect()
    assert wait_until(lambda: not device_threads()), "a dropped loader left a device thread"


# (A worker's error travels pickled from fork workers as from spawn ones: spawn, whose
# workers spend seconds importing MXNet, has its own worker-error test in test_reliability.)
@pytest.mark.parametrize("pool", ["inline", "thread", "fork"])
def test_worker_error_reaches_the_consumer_through_the_device_stage(pool):
    backend = BACKENDS[pool]
    with ShardedDataLoader(
        FailingDataset(20, bad=9, exc_type=KeyError),
        batch_size=2,
        num_shards=2,
        ctx=CTXS,
        **backend,
    ) as loader:
        for _ in range(2):  # the loader stays usable after the error
            seen = []
            with pytest.raises(KeyError, match="sample 9 is broken"):
                for step in loader:
                    assert [data.context for data, _ in step] == CTXS
                    seen.extend(step_ids(step))
            assert seen == [[0, 1], [2, 3], [4, 5], [6, 7]]  # raised at the failing step
            assert wait_until(lambda: not device_threads())


# ---------------------------------------------------------------- DevicePrefetcher


def test_device_prefetcher_over_a_sharded_loader(backend):
    kwargs = dict(batch_size=3, num_shards=2)
    expected = plain_steps(RangeDataset(24), **kwargs)
    with ShardedDataLoader(RangeDataset(24), **kwargs, **backend) as loader:
        for _ in range(2):  # a fresh prefetcher per epoch, as in a training loop
            with DevicePrefetcher(CTXS, buffer_size=2).prefetch(loader) as steps:
                got = list(steps)
            assert len(got) == len(expected) == len(loader)
            for step, want in zip(got, expected):
                assert [data.context for data, _ in step] == CTXS
                assert [label.context for _, label in step] == CTXS
                for (data, label), (want_x, want_y) in zip(step, want):
                    np.testing.assert_array_equal(data.asnumpy(), want_x)
                    np.testing.assert_array_equal(label.asnumpy(), want_y)
        # Closed half way, it stops its thread and the loader's epoch.
        with DevicePrefetcher(CTXS).prefetch(loader) as steps:
            next(steps)
        assert wait_until(lambda: not device_threads())
