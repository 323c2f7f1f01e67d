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


@FEW
@given(n=lengths_, batch_size=sizes, shards=st.integers(1, 5), policy=policies, seed=seeds)
def test_shard_groups_never_repeat_a_batch(n, batch_size, shards, policy, seed):
    batches = BatchSampler(RandomSampler(n, seed=seed), batch_size)
    steps_sampler = ShardGroupSampler(batches, shards, policy)
    seen = []
    for epoch in range(2):
        expected_len = len(steps_sampler)
        steps = list(steps_sampler)
        assert len(steps) == expected_len
        assert all(0 < len(step) <= shards for step in steps)
        if policy != "keep":
            assert all(len(step) == shards for step in steps)
        seen.extend(flat(steps))
        whole = at(BatchSampler(RandomSampler(n, seed=seed), batch_size), epoch)
        if policy == "keep":
            assert flat(steps) == whole
    seen.extend(steps_sampler.state_dict()["carry"])
    assert all(len(b) for b in seen)
    if policy != "discard":
        assert sorted(map(sorted, seen)) == sorted(
            map(sorted, flat([at(batches, 0), at(batches, 1)]))
        )


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
    last_group=st.sampled_from(["keep", "discard", "pad"]),
    seed=seeds,
)
def test_fixed_bucket_steps(lengths, batch_size, shards, last_group, seed):
    sampler = FixedBucketSampler(
        lengths, batch_size, 5, num_shards=shards, shuffle=True, last_group=last_group, seed=seed
    )
    steps = list(sampler)
    assert len(steps) == len(sampler)
    indices = flat(flat(steps))
    if last_group == "pad":
        assert all(len(s) == shards for s in steps)
        assert set(indices) == set(range(len(lengths)))
    else:
        assert len(set(indices)) == len(indices)
        assert all(0 < len(s) <= shards for s in steps)
        if last_group == "keep":
            assert sorted(indices) == list(range(len(lengths)))
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
    which=st.integers(0, 5),
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
