"""Property tests of shardloader.sampler: coverage, disjointness, no duplicates, bucket bounds,
determinism and resumption, over generated lengths, batch sizes, shards, parts, seeds, epochs."""

from __future__ import annotations

import json
import warnings
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardloader.sampler import (
    BatchSampler,
    ConstWidthBucket,
    ExpWidthBucket,
    FixedBucketSampler,
    LinearWidthBucket,
    PartitionSampler,
    RandomSampler,
    ShardGroupSampler,
    SortedBucketSampler,
    SortedSampler,
    SplitSampler,
)

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore:Some buckets are empty"),
]

FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

lengths_ = st.integers(0, 60)
sizes = st.integers(1, 9)
seeds = st.integers(0, 2**32)
epochs = st.integers(0, 50)
policies = st.sampled_from(["keep", "discard", "rollover"])


def flat(items):
    return [i for item in items for i in item]


def at(sampler, epoch):
    sampler.set_epoch(epoch)
    return list(sampler)


@FEW
@given(n=lengths_, batch_size=sizes, policy=policies, seed=seeds, epoch=epochs)
def test_batches_cover_each_epoch_once(n, batch_size, policy, seed, epoch):
    sampler = BatchSampler(RandomSampler(n, seed=seed), batch_size, policy)
    sampler.set_epoch(epoch)
    carried, passes = [], 3
    for _ in range(passes):
        expected_len = len(sampler)
        batches = list(sampler)
        assert len(batches) == expected_len
        assert all(0 < len(b) <= batch_size for b in batches)
        assert all(len(b) == batch_size for b in batches[:-1])
        indices = flat(batches)
        if policy != "rollover":  # a batch straddling two epochs may hold an index twice
            assert len(set(indices)) == len(indices)
        if policy == "keep":
            assert sorted(indices) == list(range(n))
        elif policy == "discard":
            assert len(indices) == n - n % batch_size
        carried.extend(indices)
    if policy == "rollover":
        carried.extend(sampler.state_dict()["carry"])
        assert Counter(carried) == Counter(list(range(n)) * passes)


def check_full_steps(steps, shards, repeated, unique=True):
    """Every step has ``shards`` non-empty shards; samples repeat only in the last step, only
    when fewer than ``shards`` new samples were left for it, and then exactly enough to give
    every shard one sample; ``repeated`` (the sampler's counter) says how many. ``unique``
    is False for batches from a rolled-over ``BatchSampler``, which may hold an index twice."""
    assert all(len(step) == shards and all(len(shard) for shard in step) for step in steps)
    if not unique:
        return
    before = flat(flat(steps[:-1]))
    assert len(set(before)) == len(before)
    if not steps:
        assert repeated == 0
        return
    last = flat(steps[-1])
    fresh = set(last) - set(before)
    if len(fresh) >= shards:
        assert len(fresh) == len(last)  # no repeat, neither of the pass nor of the step
        assert repeated == 0
    else:
        assert all(len(shard) == 1 for shard in steps[-1])
        assert repeated == shards - len(fresh)


@FEW
@given(
    n=lengths_,
    batch_size=sizes,
    shards=st.integers(1, 5),
    last_batch=policies,
    last_group=st.sampled_from(["keep", "partial", "discard", "rollover"]),
    seed=seeds,
)
def test_shard_groups(n, batch_size, shards, last_batch, last_group, seed):
    def batches():
        return BatchSampler(RandomSampler(n, seed=seed), batch_size, last_batch)

    steps_sampler = ShardGroupSampler(batches(), shards, last_group)
    # A rolled-over batch or group can hold a sample of two passes, as in Gluon.
    unique = "rollover" not in (last_batch, last_group)
    seen, counted = [], 0
    for epoch in range(2):
        expected_len = len(steps_sampler)
        steps = list(steps_sampler)
        assert len(steps) == expected_len
        whole = at(batches(), epoch)
        if epoch == 0:  # nothing carried in yet
            full = len(whole) // shards
            assert steps[:full] == [whole[k * shards : (k + 1) * shards] for k in range(full)]
            keeps = last_group in ("keep", "partial") and len(whole) % shards
            assert len(steps) == full + bool(keeps)
        if last_group == "partial":
            assert all(0 < len(step) <= shards for step in steps)
            if last_batch != "rollover":
                assert flat(steps) == whole  # the batches as they are, in order
        else:
            repeated = steps_sampler.repeated_samples - counted
            check_full_steps(steps, shards, repeated, unique)
        if last_group == "keep" and last_batch == "keep":
            assert sorted(set(flat(flat(steps)))) == list(range(n))  # every sample covered
        counted = steps_sampler.repeated_samples
        seen.extend(flat(steps))
    if last_group == "rollover" and last_batch != "rollover":
        seen.extend(steps_sampler.state_dict()["carry"])
        assert sorted(map(sorted, seen)) == sorted(
            map(sorted, flat([at(batches(), 0), at(batches(), 1)]))
        )
    elif last_group != "rollover":
        assert steps_sampler.state_dict()["carry"] == []


@FEW
@given(n=st.integers(0, 60), batch_size=sizes, shards=st.integers(1, 6))
def test_keep_repeats_only_a_tail_shorter_than_the_shards(n, batch_size, shards):
    """The counts, worked out from the sizes alone: a pass of ``n`` samples in batches of
    ``batch_size`` has ``ceil(batches / shards)`` full steps, and repeats ``shards - r``
    samples exactly when its tail of ``r`` samples (after the last whole group of batches) is
    non-empty and shorter than ``shards``."""
    sampler = ShardGroupSampler(BatchSampler(RandomSampler(n, seed=n), batch_size), shards)
    steps = list(sampler)
    batches = -(-n // batch_size)
    assert len(steps) == len(sampler) == -(-batches // shards)
    tail = n - (batches // shards) * shards * batch_size
    expected = shards - tail if 0 < tail < shards else 0
    assert sampler.repeated_samples == expected
    assert len(flat(flat(steps))) == n + expected
    check_full_steps(steps, shards, expected)


@FEW
@given(
    n=st.integers(0, 80),
    parts=st.integers(1, 7),
    even=st.booleans(),
    seed=seeds,
    epoch=epochs,
)
def test_partitions_are_disjoint_and_cover(n, parts, even, seed, epoch):
    if even and n < parts:
        even = False
    samplers = [PartitionSampler(RandomSampler(n, seed=seed), parts, i, even) for i in range(parts)]
    chunks = [at(s, epoch) for s in samplers]
    assert [len(c) for c in chunks] == [len(s) for s in samplers]
    owned = [set(c) for c in chunks]
    for i in range(parts):
        for j in range(i + 1, parts):
            assert not owned[i] & owned[j]
    assert sorted(set().union(*owned)) == list(range(n))
    if even:
        assert len({len(c) for c in chunks}) == 1
        assert sum(len(c) - len(set(c)) for c in chunks) == len(chunks[0]) * parts - n
    else:
        assert sum(len(c) for c in chunks) == n
        assert max(map(len, chunks)) - min(map(len, chunks)) <= 1


@FEW
@given(
    n=st.integers(1, 80),
    parts=st.integers(1, 7),
    even=st.booleans(),
    repeat=st.integers(1, 3),
    shuffle=st.booleans(),
    seed=seeds,
    epoch=epochs,
)
def test_split_parts_are_disjoint_and_cover(n, parts, even, repeat, shuffle, seed, epoch):
    parts = min(parts, n)
    samplers = [
        SplitSampler(n, parts, i, even, repeat, shuffle=shuffle, seed=seed) for i in range(parts)
    ]
    chunks = [at(s, epoch) for s in samplers]
    assert [len(c) for c in chunks] == [len(s) for s in samplers]
    owned = [set(c) for c in chunks]
    assert sum(map(len, owned)) == n and set().union(*owned) == set(range(n))
    if even:
        assert len({len(c) for c in chunks}) == 1
    for chunk, own in zip(chunks, owned):
        rounds = [
            chunk[k * len(chunk) // repeat : (k + 1) * len(chunk) // repeat] for k in range(repeat)
        ]
        for r in rounds:
            assert set(r) == own
            assert len(r) - len(set(r)) <= (1 if even else 0)


bucket_lengths = st.one_of(
    st.lists(st.integers(1, 120), min_size=1, max_size=80),
    st.integers(1, 3).flatmap(
        lambda k: st.lists(st.tuples(*[st.integers(1, 40)] * k), min_size=1, max_size=60)
    ),
)
schemes = st.sampled_from([ConstWidthBucket(), LinearWidthBucket(), ExpWidthBucket(1.3)])


@FEW
@given(
    lengths=bucket_lengths,
    batch_size=sizes,
    num_buckets=st.integers(1, 12),
    ratio=st.sampled_from([0, 0.5, 1.0, 2.0]),
    shuffle=st.booleans(),
    scheme=schemes,
    seed=seeds,
    epoch=epochs,
)
def test_fixed_buckets_bound_lengths_and_cover(
    lengths, batch_size, num_buckets, ratio, shuffle, scheme, seed, epoch
):
    sampler = FixedBucketSampler(
        lengths, batch_size, num_buckets, None, ratio, shuffle, bucket_scheme=scheme, seed=seed
    )
    keys, sizes_ = sampler.bucket_keys, sampler.bucket_batch_sizes
    bucket = sampler.bucket_of()
    batches = at(sampler, epoch)
    assert len(batches) == len(sampler)
    assert sorted(flat(batches)) == list(range(len(lengths)))
    for batch in batches:
        (b,) = {int(bucket[i]) for i in batch}
        assert 0 < len(batch) <= sizes_[b] and sizes_[b] >= batch_size
        for i in batch:
            key, length = keys[b], lengths[i]
            if isinstance(length, tuple):
                assert all(k >= v for k, v in zip(key, length))
            else:
                assert key >= length
    assert at(sampler, epoch) == batches


@FEW
@given(
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=80),
    batch_size=sizes,
    shards=st.integers(1, 5),
    last_group=st.sampled_from(["keep", "partial", "discard", "pad"]),
    shuffle=st.booleans(),
    seed=seeds,
)
def test_fixed_bucket_steps(lengths, batch_size, shards, last_group, shuffle, seed):
    sampler = FixedBucketSampler(
        lengths, batch_size, 5, num_shards=shards, shuffle=shuffle, last_group=last_group, seed=seed
    )
    batches = FixedBucketSampler(lengths, batch_size, 5, shuffle=shuffle, seed=seed)
    whole = list(batches)
    steps = list(sampler)
    assert len(steps) == len(sampler)
    indices = flat(flat(steps))
    bucket = sampler.bucket_of()
    for step in steps:  # every shard within one bucket, whatever the policy
        assert all(len({int(bucket[i]) for i in shard}) == 1 for shard in step)
    if last_group == "pad":
        assert all(len(s) == shards for s in steps)
        assert set(indices) == set(range(len(lengths)))
        assert sampler.repeated_samples == len(indices) - len(lengths)
    elif last_group == "keep":
        check_full_steps(steps, shards, sampler.repeated_samples)
        assert sorted(set(indices)) == list(range(len(lengths)))
        full = len(whole) // shards
        assert steps[:full] == [whole[k * shards : (k + 1) * shards] for k in range(full)]
    else:
        assert len(set(indices)) == len(indices) and sampler.repeated_samples == 0
        assert all(0 < len(s) <= shards for s in steps)
        if last_group == "partial":
            assert flat(steps) == whole
        else:
            assert all(len(s) == shards for s in steps)


@FEW
@given(
    keys=st.lists(st.integers(0, 30), min_size=1, max_size=80),
    batch_size=sizes,
    mult=st.sampled_from([1, 1.5, 3, 100]),
    reverse=st.booleans(),
    shuffle=st.booleans(),
    seed=seeds,
)
def test_sorted_buckets_cover_and_sort(keys, batch_size, mult, reverse, shuffle, seed):
    sampler = SortedBucketSampler(keys, batch_size, mult, reverse, shuffle, seed=seed)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(flat(batches)) == list(range(len(keys)))
    for batch in batches:
        assert [keys[i] for i in batch] == sorted((keys[i] for i in batch), reverse=reverse)


@FEW
@given(
    keys=st.lists(st.integers(0, 6), min_size=1, max_size=60),
    reverse=st.booleans(),
)
def test_sorted_sampler_orders_keys_with_ties_in_index_order(keys, reverse):
    order = list(SortedSampler(keys, reverse))
    sign = -1 if reverse else 1
    assert order == sorted(range(len(keys)), key=lambda i: (sign * keys[i], i))


def _builders(n, batch_size, shards, parts, seed):
    return [
        lambda s: RandomSampler(n, seed=s),
        lambda s: BatchSampler(RandomSampler(n, seed=s), batch_size, "rollover"),
        lambda s: ShardGroupSampler(
            BatchSampler(RandomSampler(n, seed=s), batch_size, "rollover"), shards, "rollover"
        ),
        lambda s: PartitionSampler(RandomSampler(n, seed=s), parts, parts - 1),
        lambda s: SplitSampler(max(n, parts), parts, 0, True, 2, seed=s),
        lambda s: FixedBucketSampler(
            [i % 9 + 1 for i in range(n + 1)],
            batch_size,
            4,
            seed=s,
            shuffle=True,
            num_shards=shards,
        ),
        lambda s: ShardGroupSampler(BatchSampler(RandomSampler(n, seed=s), batch_size), shards),
        lambda s: SortedSampler([(i * 7) % 5 for i in range(n)]),
    ]


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 40),
    batch_size=sizes,
    shards=st.integers(1, 4),
    parts=st.integers(1, 4),
    seed=seeds,
    warmup=st.integers(0, 3),
    cut=st.integers(0, 12),
    which=st.integers(0, 7),
)
def test_resume_from_any_point_and_same_seed_same_order(
    n, batch_size, shards, parts, seed, warmup, cut, which
):
    build = _builders(n, batch_size, shards, parts, seed)[which]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        original, twin, fresh = build(seed), build(seed), build(seed + 1)
    for _ in range(warmup):
        assert list(original) == list(twin)
        list(fresh)
    cut = min(cut, len(original))  # past the end, the state is that of the next epoch
    it = iter(original)
    head = [item for _, item in zip(range(cut), it)]
    state = json.loads(json.dumps(original.state_dict()))
    tail = list(it)
    assert head + tail == list(twin)  # same seed and epoch: same order
    following = list(original)
    assert following == list(twin)
    fresh.load_state_dict(state)
    assert list(fresh) == tail
    assert list(fresh) == following
