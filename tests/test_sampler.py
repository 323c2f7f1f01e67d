"""shardloader.sampler: Gluon parity, gluon-nlp behaviour, errors, epochs and state."""

from __future__ import annotations

import ast
import doctest
import json
import pathlib
import warnings

import numpy as np
import pytest
from mxnet.gluon import data as gdata

import shardloader.sampler as S
from shardloader.sampler import (
    BatchSampler,
    ConstWidthBucket,
    ExpWidthBucket,
    FilterSampler,
    FixedBucketSampler,
    IntervalSampler,
    LinearWidthBucket,
    PartitionSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    ShardGroupSampler,
    SortedBucketSampler,
    SortedSampler,
    SplitSampler,
    fill_step,
)

pytestmark = pytest.mark.timeout(60)

POLICIES = ["keep", "discard", "rollover"]


def flat(items):
    return [i for item in items for i in item]


def roundtrip(state):
    """The state as it comes back from a JSON checkpoint."""
    return json.loads(json.dumps(state))


# ---------------------------------------------------------------------------------------------
# Gluon parity


@pytest.mark.parametrize("length,start", [(0, 0), (1, 0), (7, 0), (5, 3)])
def test_sequential_matches_gluon(length, start):
    ours, gluon = SequentialSampler(length, start), gdata.SequentialSampler(length, start)
    assert list(ours) == list(gluon)
    assert list(ours) == list(gluon)
    assert len(ours) == len(gluon)


def test_filter_matches_gluon():
    data = list(range(20))
    ours = FilterSampler(lambda x: x % 3 == 1, data)
    gluon = gdata.FilterSampler(lambda x: x % 3 == 1, data)
    assert list(ours) == list(gluon)
    assert len(ours) == len(gluon)


# MXNet 2.x has it in gluon.data, 1.x in gluon.contrib.data: the same order in both.
GLUON_INTERVAL = getattr(gdata, "IntervalSampler", None)
if GLUON_INTERVAL is None:
    from mxnet.gluon.contrib.data import IntervalSampler as GLUON_INTERVAL


@pytest.mark.parametrize(
    "length,interval,rollover",
    [(13, 3, True), (13, 3, False), (1, 1, True), (8, 8, False), (9, 2, True)],
)
def test_interval_matches_gluon(length, interval, rollover):
    ours = IntervalSampler(length, interval, rollover=rollover)
    gluon = GLUON_INTERVAL(length, interval, rollover=rollover)
    assert list(ours) == list(gluon) == list(ours)
    # Gluon's len() is `length` even when a pass without rollover yields fewer indices.
    assert len(ours) == len(list(gluon))


def test_interval_resumes_mid_pass_and_checks_its_arguments():
    sampler = IntervalSampler(13, 3)
    it = iter(sampler)
    head = [next(it) for _ in range(6)]
    resumed = IntervalSampler(13, 3)
    resumed.load_state_dict(roundtrip(sampler.state_dict()))
    assert head + list(resumed) == list(IntervalSampler(13, 3))
    with pytest.raises(ValueError, match="state_dict mismatch: interval"):
        IntervalSampler(13, 4).load_state_dict(roundtrip(sampler.state_dict()))
    with pytest.raises(ValueError, match=r"interval must be an int in \[1, length=4\], got 5"):
        IntervalSampler(4, 5)
    with pytest.raises(ValueError, match="interval must be a positive int, got 0"):
        IntervalSampler(4, 0)
    with pytest.raises(TypeError, match="rollover must be a bool"):
        IntervalSampler(4, 2, rollover="yes")


def test_random_is_a_permutation_of_python_ints():
    sampler = RandomSampler(50, seed=1)
    order = list(sampler)
    assert sorted(order) == list(range(50)) and len(sampler) == 50
    assert all(type(i) is int for i in order)


def test_samplers_are_gluon_samplers():
    assert isinstance(SequentialSampler(3), gdata.Sampler)
    assert isinstance(BatchSampler(SequentialSampler(3), 2), gdata.Sampler)
    assert isinstance(FixedBucketSampler([1, 2, 3], 2), Sampler)


@pytest.mark.parametrize("last_batch", POLICIES)
@pytest.mark.parametrize("length,batch_size", [(0, 3), (1, 3), (9, 3), (10, 3), (11, 4), (5, 7)])
def test_batch_sampler_matches_gluon_over_epochs(length, batch_size, last_batch):
    ours = BatchSampler(SequentialSampler(length), batch_size, last_batch)
    gluon = gdata.BatchSampler(gdata.SequentialSampler(length), batch_size, last_batch)
    for _ in range(5):
        assert len(ours) == len(gluon)
        assert list(ours) == list(gluon)
        assert len(ours) == len(gluon)


@pytest.mark.parametrize("last_batch", POLICIES)
def test_batch_sampler_over_a_plain_gluon_sampler(last_batch):
    # Gluon's RandomSampler has no set_epoch: its own global-RNG order is used, as in Gluon.
    np.random.seed(11)
    gluon = list(gdata.BatchSampler(gdata.RandomSampler(10), 3, last_batch))
    np.random.seed(11)
    ours = BatchSampler(gdata.RandomSampler(10), 3, last_batch)
    assert list(ours) == gluon
    state = roundtrip(ours.state_dict())
    assert state["sampler"] is None


def test_rollover_len_counts_the_carry():
    sampler = BatchSampler(SequentialSampler(10), 4, "rollover")
    assert len(sampler) == 2
    assert list(sampler) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(sampler) == 3  # 2 carried + 10
    assert list(sampler)[0] == [8, 9, 0, 1]


# ---------------------------------------------------------------------------------------------
# Sharded steps and partitions


def test_shard_groups_keep_partial_discard_rollover():
    def groups(policy):
        return ShardGroupSampler(BatchSampler(SequentialSampler(10), 2), 3, policy)

    # 'keep' (the default) spreads the 4 samples of the 2 leftover batches over 3 shards.
    keep = groups("keep")
    assert keep.last_group == "keep" and ShardGroupSampler(keep._sampler, 3).last_group == "keep"
    assert list(keep) == [[[0, 1], [2, 3], [4, 5]], [[6], [7], [8, 9]]]
    assert keep.repeated_samples == 0
    assert list(groups("partial")) == [[[0, 1], [2, 3], [4, 5]], [[6, 7], [8, 9]]]
    assert len(groups("keep")) == len(groups("partial")) == 2
    assert list(groups("discard")) == [[[0, 1], [2, 3], [4, 5]]]
    rolling = groups("rollover")
    assert (len(rolling), list(rolling)) == (1, [[[0, 1], [2, 3], [4, 5]]])
    assert len(rolling) == 2  # 2 batches carried + 5
    assert list(rolling) == [[[6, 7], [8, 9], [0, 1]], [[2, 3], [4, 5], [6, 7]]]


@pytest.mark.parametrize(
    "length,batch_size,shards,last",
    [
        (10, 3, 2, [[6, 7, 8], [9]]),  # already full: nothing changes
        (11, 3, 3, [[9], [10], [8]]),  # 2 samples left for 3 shards: one repeat from before
        (13, 4, 3, [[12], [11], [10]]),  # 1 sample left: the 2 before it again
        (5, 5, 2, [[0, 1, 2], [3, 4]]),  # one short batch, the only step: cut in two
        (1, 4, 3, [[0], [0], [0]]),  # a single sample in the pass: the only way to fill
        (11, 2, 4, [[8], [9], [10], [7]]),  # a tail of 2 batches with 3 samples
        (13, 2, 4, [[8], [9], [10, 11], [12]]),  # the widest batch is cut
    ],
)
def test_keep_fills_the_last_step(length, batch_size, shards, last):
    sampler = ShardGroupSampler(BatchSampler(SequentialSampler(length), batch_size), shards)
    steps = list(sampler)
    assert len(steps) == len(sampler)
    assert steps[-1] == last
    assert all(len(step) == shards and all(step) for step in steps)
    ids = flat(flat(steps))
    assert set(ids) == set(range(length))
    repeats = len(ids) - length
    assert repeats == max(0, shards - (length - batch_size * shards * (len(steps) - 1)))
    assert sampler.repeated_samples == repeats
    assert type(steps[-1]) is (S.FilledStep if repeats else list)
    list(sampler)
    assert sampler.repeated_samples == 2 * repeats  # counted on every pass


def test_fill_step_spreads_without_repeats_while_it_can():
    assert fill_step([[0, 1, 2, 3, 4, 5, 6]], 3) == [[0, 1, 2], [3, 4], [5, 6]]
    # The extra pieces go to the batch whose pieces are largest, the first on a tie.
    assert fill_step([[0, 1, 2], [3, 4, 5, 6, 7]], 4) == [[0, 1], [2], [3, 4, 5], [6, 7]]
    assert fill_step([[0, 1], [2, 3]], 3) == [[0], [1], [2, 3]]
    assert fill_step([[0], [1], [2]], 3) == [[0], [1], [2]]
    assert fill_step([], 2) == [] and fill_step([[]], 2) == [[]]  # nothing to fill with
    few = fill_step([[5], [6]], 5, before=[4, 3])
    assert few == [[5], [6], [4], [3], [4]] and few.repeated == 3
    alone = fill_step([[5, 6]], 5)
    assert alone == [[5], [6], [5], [6], [5]] and alone.repeated == 3
    assert json.loads(json.dumps(few)) == few


def test_filled_step_pickles_with_its_count():
    import pickle

    step = S.FilledStep([[1], [2]], repeated=1)
    back = pickle.loads(pickle.dumps(step))
    assert type(back) is S.FilledStep and back == [[1], [2]] and back.repeated == 1


def test_repeats_are_counted_by_every_step_sampler_that_yields_them():
    inner = ShardGroupSampler(BatchSampler(SequentialSampler(7), 3), 2)
    parts = [PartitionSampler(inner, 2, i) for i in range(2)]
    assert list(parts[0]) == [[[0, 1, 2], [3, 4, 5]]]
    assert inner.repeated_samples == 1  # the pass made the filled step ...
    assert parts[0].repeated_samples == 0  # ... but this part did not yield it
    assert list(parts[1]) == [[[6], [5]]]
    assert parts[1].repeated_samples == 1 and inner.repeated_samples == 2


def test_a_copied_sampler_drops_its_listeners():
    import copy
    import pickle
    from types import SimpleNamespace

    sampler = ShardGroupSampler(BatchSampler(SequentialSampler(2), 2), 3)

    class Stats:  # a loader's statistics stand-in (held weakly)
        repeated_samples = 0

    owner = SimpleNamespace(stats=Stats())
    sampler.watch_repeats(owner.stats)
    assert list(sampler) == [[[0], [1], [0]]]
    assert owner.stats.repeated_samples == sampler.repeated_samples == 1
    clone = pickle.loads(pickle.dumps(sampler))
    assert clone._repeat_listeners is None and clone.repeated_samples == 1
    list(clone)
    list(copy.deepcopy(sampler))
    assert owner.stats.repeated_samples == 1  # only the sampler it watches counts for it
    list(sampler)
    assert owner.stats.repeated_samples == 2
    del owner
    list(sampler)
    assert sampler._repeat_listeners == []  # the gone owner's listener is dropped


def test_shard_group_rejects_steps_and_indices():
    steps = FixedBucketSampler([1, 2, 3, 4], 1, num_shards=2)
    with pytest.raises(ValueError, match="yields steps"):
        ShardGroupSampler(steps, 2)
    with pytest.raises(ValueError, match="yields steps"):
        ShardGroupSampler(ShardGroupSampler(BatchSampler(SequentialSampler(4), 1), 2), 2)

    class GluonNlpStyle(gdata.Sampler):  # yields steps but does not say so
        def __iter__(self):
            return iter([[[0], [1]], [[2], [3]]])

        def __len__(self):
            return 2

    with pytest.raises(ValueError, match="yields steps"):
        list(ShardGroupSampler(GluonNlpStyle(), 2))
    with pytest.raises(TypeError, match="yielded the index 0; wrap it in a BatchSampler"):
        list(ShardGroupSampler(SequentialSampler(4), 2))


def test_batch_sampler_rejects_a_step_sampler():
    with pytest.raises(ValueError, match="sampler must yield indices"):
        BatchSampler(FixedBucketSampler([1, 2, 3], 1, num_shards=2), 2)


def test_partition_is_disjoint_and_covers_each_epoch():
    parts = [PartitionSampler(RandomSampler(23, seed=5), 4, i) for i in range(4)]
    for epoch in range(3):
        for part in parts:
            part.set_epoch(epoch)
        chunks = [list(p) for p in parts]
        assert [len(c) for c in chunks] == [len(p) for p in parts] == [6, 6, 6, 5]
        assert sorted(flat(chunks)) == list(range(23))
    whole = RandomSampler(23, seed=5)
    whole.set_epoch(2)
    assert flat(chunks) == list(whole)


def test_partition_even_size_pads_from_its_own_part():
    parts = [PartitionSampler(SequentialSampler(10), 4, i, even_size=True) for i in range(4)]
    assert [list(p) for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7, 6], [8, 9, 8]]
    assert [len(p) for p in parts] == [3, 3, 3, 3]
    batches = PartitionSampler(BatchSampler(SequentialSampler(7), 2), 3, 2, even_size=True)
    assert list(batches) == [[6], [6]] and len(batches) == 2


def test_partition_needs_enough_items_for_even_size():
    with pytest.raises(ValueError, match="even_size=True needs a sampler with at least"):
        PartitionSampler(SequentialSampler(2), 3, 0, even_size=True)
    assert list(PartitionSampler(SequentialSampler(2), 3, 2)) == []


def test_partition_forwards_steps_flag():
    steps = FixedBucketSampler([1, 2, 3, 4], 1, num_shards=2)
    assert PartitionSampler(steps, 2, 0).yields_steps
    assert not PartitionSampler(SequentialSampler(4), 2, 0).yields_steps


def test_split_sampler_parts():
    # gluon-nlp's documented contract: disjoint contiguous parts covering every index.
    parts = [SplitSampler(10, 3, i, shuffle=False) for i in range(3)]
    assert [list(p) for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    even = [SplitSampler(10, 3, i, even_size=True, seed=3) for i in range(3)]
    assert [len(p) for p in even] == [4, 4, 4]
    for i, part in enumerate(even):
        got = list(part)
        assert len(got) == 4 and set(got) == set(range(10)[[0, 4, 7][i] : [4, 7, 10][i]])
    assert len(SplitSampler(10, 3, 1, repeat=3, seed=0)) == 9
    repeated = list(SplitSampler(10, 3, 1, repeat=3, seed=0))
    assert [sorted(repeated[k : k + 3]) for k in (0, 3, 6)] == [[4, 5, 6]] * 3


def test_split_sampler_shuffles_each_epoch_from_its_seed():
    sampler = SplitSampler(100, 2, 1, seed=9)
    first, second = list(sampler), list(sampler)
    assert sorted(first) == sorted(second) == list(range(50, 100))
    assert first != second
    sampler.set_epoch(0)
    assert list(sampler) == first


# ---------------------------------------------------------------------------------------------
# Bucketing (gluon-nlp's documented behaviour)


def test_bucket_schemes_follow_the_documented_formulas():
    assert ConstWidthBucket()(100, 1, 4) == [100, 75, 50, 25]
    assert ConstWidthBucket()(5, 3, 10) == [5, 4, 3, 3, 3, 3, 3, 3, 3, 3]
    lo, hi, n = 10, 100, 4
    alpha = 2 * (hi - lo - n) / (n * (n + 1))
    linear = [round(lo + alpha * (i + 1) * (i + 2) / 2 + i + 1) for i in range(n)]
    assert LinearWidthBucket()(hi, lo, n) == linear
    step = 1.5
    w0 = (hi - lo) * (step - 1) / (step**n - 1)
    exp = [round(lo + w0 * (step ** (i + 1) - 1) / (step - 1)) for i in range(n)]
    assert ExpWidthBucket(step)(hi, lo, n) == exp
    for scheme in (ConstWidthBucket(), LinearWidthBucket(), ExpWidthBucket()):
        assert max(scheme(77, 3, 6)) == 77
        keys = scheme((50, 9), (2, 4), 3)
        assert keys == list(zip(scheme(50, 2, 3), scheme(9, 4, 3)))


def test_fixed_bucket_assignment_batch_sizes_and_order():
    lengths = [3, 9, 4, 8, 2, 10, 7, 1, 5]
    sampler = FixedBucketSampler(lengths, 2, bucket_keys=[5, 10], ratio=1.0)
    assert sampler.bucket_keys == [5, 10]
    # B_i = max(int(ratio * B * max_key / key_i), B)
    assert sampler.bucket_batch_sizes == [4, 2]
    batches = list(sampler)
    # Largest key first, each bucket in sample order.
    assert batches == [[1, 3], [5, 6], [0, 2, 4, 7], [8]]
    assert len(sampler) == 4
    for batch in batches:
        keys = {sampler.bucket_keys[sampler.bucket_of()[i]] for i in batch}
        assert len(keys) == 1
        assert all(lengths[i] <= min(keys) for i in batch)


def test_fixed_bucket_generated_keys_and_stats():
    lengths = list(range(1, 101))
    sampler = FixedBucketSampler(lengths, 8, num_buckets=4)
    assert sampler.bucket_keys == sorted(ConstWidthBucket()(100, 1, 4))
    text = sampler.stats()
    assert text.splitlines() == [
        "FixedBucketSampler:",
        "  sample_num=100, batch_num=16",
        "  key=[25, 50, 75, 100]",
        "  cnt=[25, 25, 25, 25]",
        "  batch_size=[8, 8, 8, 8]",
    ]
    assert repr(sampler) == text


def test_fixed_bucket_tuple_lengths():
    lengths = [(3, 4), (5, 1), (2, 2), (9, 9), (4, 6)]
    sampler = FixedBucketSampler(lengths, 2, bucket_keys=[(5, 5), (9, 9), (4, 6)])
    assert sampler.bucket_keys == [(4, 6), (5, 5), (9, 9)]
    # Least padding among fitting keys: (3, 4) pads 3 in (4, 6) and 3 in (5, 5): first wins.
    assert [sampler.bucket_keys[b] for b in sampler.bucket_of()] == [
        (4, 6),
        (5, 5),
        (4, 6),
        (9, 9),
        (4, 6),
    ]
    assert sorted(flat(sampler)) == list(range(5))


def test_fixed_bucket_use_average_length():
    lengths = [10] * 6 + [20] * 4
    with pytest.warns(UserWarning, match="ratio=0.5 is ignored"):
        sampler = FixedBucketSampler(
            lengths, 40, bucket_keys=[10, 20], use_average_length=True, ratio=0.5
        )
    assert sampler.bucket_batch_sizes == [4, 2]  # int(40 / (mean + std))


def test_fixed_bucket_warns_about_empty_buckets():
    with pytest.warns(UserWarning, match="unused bucket keys=\\[5\\]"):
        sampler = FixedBucketSampler([8, 9, 10], 2, bucket_keys=[5, 10])
    assert sampler.bucket_keys == [10]


def test_fixed_bucket_fills_the_last_step_by_default():
    # 13 samples in batches of 2: 6 full batches and [12]; the tail of 5 samples is spread.
    keep = FixedBucketSampler(list(range(1, 14)), 2, bucket_keys=[13], num_shards=4)
    steps = list(keep)
    assert len(keep) == len(steps) == 2
    assert steps[1] == [[8], [9], [10, 11], [12]]
    assert sorted(flat(flat(steps))) == list(range(13)) and keep.repeated_samples == 0
    # 11 samples: the tail has 3 samples for 4 shards, so one sample of the step before.
    lengths = list(range(1, 12))
    keep = FixedBucketSampler(lengths, 2, bucket_keys=[11], num_shards=4)
    steps = list(keep)
    assert steps[1] == [[8], [9], [10], [7]] and keep.repeated_samples == 1
    partial = FixedBucketSampler(lengths, 2, bucket_keys=[11], num_shards=4, last_group="partial")
    assert len(partial) == 2 and [len(s) for s in partial] == [4, 2]
    assert sorted(flat(flat(partial))) == list(range(11)) and partial.repeated_samples == 0
    discard = FixedBucketSampler(lengths, 2, bucket_keys=[11], num_shards=4, last_group="discard")
    assert len(discard) == 1 and [len(s) for s in discard] == [4]


def test_fixed_bucket_keep_cuts_batches_within_their_bucket():
    lengths = [9, 9, 9, 2, 2, 2, 2, 2]
    sampler = FixedBucketSampler(lengths, 3, bucket_keys=[3, 9], num_shards=4)
    # Batches [0, 1, 2] (key 9), [3, 4, 5] and [6, 7] (key 3): only the widest is cut.
    assert list(sampler) == [[[0, 1], [2], [3, 4, 5], [6, 7]]]
    bucket = sampler.bucket_of()
    for shard in list(sampler)[0]:
        assert len({int(bucket[i]) for i in shard}) == 1


def test_fixed_bucket_pad_last_group_like_gluon_nlp():
    lengths = list(range(1, 12))
    pad = FixedBucketSampler(lengths, 2, bucket_keys=[11], num_shards=4, last_group="pad")
    steps = list(pad)
    assert len(pad) == 2 and [len(s) for s in steps] == [4, 4]
    # gluon-nlp: the last step is the last num_shards batches of the epoch.
    assert steps[1] == [[4, 5], [6, 7], [8, 9], [10]]
    assert pad.repeated_samples == 4  # the two batches [4, 5] and [6, 7] come twice
    few = FixedBucketSampler([1, 2, 3], 2, bucket_keys=[3], num_shards=3, last_group="pad")
    assert list(few) == [[[0, 1], [2], [0, 1]]] and few.repeated_samples == 2


def test_fixed_bucket_shuffle_is_seeded_and_covers():
    lengths = np.random.RandomState(0).randint(1, 60, size=300)
    sampler = FixedBucketSampler(lengths, 16, ratio=0.5, shuffle=True, seed=4)
    before = np.random.get_state()[1].copy()
    epochs = [list(sampler) for _ in range(3)]
    assert np.array_equal(before, np.random.get_state()[1])  # the global RNG is untouched
    for batches in epochs:
        assert sorted(flat(batches)) == list(range(300))
    assert epochs[0] != epochs[1]
    sampler.set_epoch(1)
    assert list(sampler) == epochs[1]


def test_sorted_bucket_sampler():
    keys = [5, 1, 4, 2, 3, 6, 9, 7]
    sampler = SortedBucketSampler(keys, 2, mult=2)
    # Chunks of mult * batch_size = 4 samples, each sorted in descending key order.
    assert list(sampler) == [[0, 2], [3, 1], [6, 7], [5, 4]]
    assert len(sampler) == 4
    ascending = SortedBucketSampler(keys, 3, mult=1, reverse=False)
    assert list(ascending) == [[1, 2, 0], [3, 4, 5], [7, 6]]
    shuffled = SortedBucketSampler(keys, 2, mult=2, shuffle=True, seed=1)
    for batch in shuffled:
        assert [keys[i] for i in batch] == sorted((keys[i] for i in batch), reverse=True)
    assert sorted(flat(shuffled)) == list(range(8))


@pytest.mark.parametrize("reverse", [True, False])
def test_sorted_sampler_orders_by_key_stably(reverse):
    keys = [5, 1, 4, 1, 9, 4, 4]
    sampler = SortedSampler(keys, reverse=reverse)
    order = list(sampler)
    assert len(sampler) == len(order) == 7 and sorted(order) == list(range(7))
    assert [keys[i] for i in order] == sorted(keys, reverse=reverse)
    # Equal keys keep their index order, in both directions (Python's stable sort).
    assert [i for i in order if keys[i] == 4] == [2, 5, 6]
    assert [i for i in order if keys[i] == 1] == [1, 3]
    assert sampler.reverse is reverse
    assert list(sampler) == order and sampler.epoch == 2  # the same order in every pass
    sampler.set_epoch(9)
    assert list(sampler) == order


def test_sorted_sampler_takes_any_comparable_keys():
    assert list(SortedSampler(np.array([0.5, 2.5, 1.5]))) == [1, 2, 0]
    assert list(SortedSampler([(1, 9), (2, 0), (1, 3)], reverse=False)) == [2, 0, 1]
    assert list(SortedSampler(["b", "a", "c"])) == [2, 0, 1]
    assert type(next(iter(SortedSampler(np.arange(3))))) is int
    with pytest.raises(TypeError, match="<"):  # keys that do not compare: Python's error
        SortedSampler([1, "a"])


def test_sorted_sampler_batches_and_resumes_in_a_loader_pipeline():
    keys = [3, 8, 1, 6, 2, 7, 5]
    batches = BatchSampler(SortedSampler(keys), 3)
    assert list(batches) == [[1, 5, 3], [6, 0, 4], [2]]
    sampler = SortedSampler(keys)
    it = iter(sampler)
    head = [next(it) for _ in range(4)]
    state = roundtrip(sampler.state_dict())
    assert state == {
        "type": "SortedSampler",
        "length": 7,
        "reverse": True,
        "epoch": 0,
        "offset": 4,
    }
    fresh = SortedSampler(keys)
    fresh.load_state_dict(state)
    assert head + list(fresh) == list(SortedSampler(keys))
    with pytest.raises(ValueError, match="reverse is True in the state but False"):
        SortedSampler(keys, reverse=False).load_state_dict(state)


# ---------------------------------------------------------------------------------------------
# The same results as gluon-nlp 0.10.0 where the two should agree


def _gluon_nlp():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("gluonnlp")


def _plain(steps):
    """gluon-nlp's items as plain int lists: batches, or steps of batches."""
    return [
        [int(i) for i in item] if not len(item) or np.ndim(item[0]) == 0 else _plain(item)
        for item in steps
    ]


@pytest.mark.parametrize("reverse", [True, False])
@pytest.mark.parametrize(
    "keys",
    [
        [3, 1, 2, 3, 1, 2, 0, 3],
        list(np.random.RandomState(0).randint(0, 6, size=50)),
        list(np.random.RandomState(1).rand(40).round(1)),
        [(2, 1), (1, 5), (2, 0), (1, 5), (0, 9)],
        np.random.RandomState(2).randint(0, 4, size=30),
    ],
    ids=["ints", "many-ties", "floats", "tuples", "ndarray"],
)
def test_sorted_sampler_matches_gluon_nlp(keys, reverse):
    nlp = _gluon_nlp()
    theirs = nlp.data.SortedSampler(keys, reverse=reverse)
    ours = SortedSampler(keys, reverse=reverse)
    assert list(ours) == [int(i) for i in theirs]
    assert len(ours) == len(theirs)


GLUON_NLP_CASES = [
    dict(batch_size=4, num_buckets=6, ratio=0.5),
    dict(batch_size=8, num_buckets=10),
    dict(batch_size=3, num_buckets=4, ratio=1.0),
    dict(batch_size=30, num_buckets=5, use_average_length=True),
    dict(batch_size=5, bucket_keys=[10, 30, 49]),
]


@pytest.mark.parametrize("num_shards", [0, 1, 2, 3, 5, 8])
@pytest.mark.parametrize("case", range(len(GLUON_NLP_CASES)))
@pytest.mark.parametrize("n", [97, 5])
def test_fixed_bucket_matches_gluon_nlp(n, case, num_shards):
    """Unshuffled, the two samplers make the same buckets, batches and steps. gluon-nlp fills
    the last step with batches of the step before: so does ``last_group='pad'``. The default
    ``'keep'`` yields the same steps before the last one, and a last step with as many shards,
    made of the samples gluon-nlp had not yielded yet (spread, not repeated, when there are
    enough of them)."""
    nlp = _gluon_nlp()
    lengths = np.random.RandomState(n).randint(1, 50, size=n).tolist()
    kwargs = dict(GLUON_NLP_CASES[case], num_shards=num_shards)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # empty buckets
        theirs_sampler = nlp.data.FixedBucketSampler(lengths, **kwargs)
        pad = FixedBucketSampler(lengths, **kwargs, last_group="pad")
        keep = FixedBucketSampler(lengths, **kwargs)
    theirs = _plain(list(theirs_sampler))
    batches = len(pad._batch_infos)
    if num_shards > batches:
        # Fewer batches than shards: gluon-nlp's slice from a negative start then yields a
        # step with fewer shards after all. Both of ours are full and cover every sample.
        assert len(theirs) == 1 and len(theirs[0]) < num_shards
        for ours in (list(pad), list(keep)):
            assert len(ours) == 1 and len(ours[0]) == num_shards and all(ours[0])
            assert sorted(set(flat(ours[0]))) == list(range(n))
        return
    assert pad.bucket_keys == [int(k) for k in theirs_sampler._bucket_keys]
    assert pad.bucket_batch_sizes == list(theirs_sampler._bucket_batch_sizes)
    assert list(pad) == theirs and len(pad) == len(theirs_sampler)
    assert pad.stats().splitlines()[:5] == theirs_sampler.stats().splitlines()
    ours = list(keep)
    assert len(ours) == len(keep) == len(theirs_sampler)
    if not num_shards:
        assert ours == theirs
        return
    assert ours[:-1] == theirs[:-1]
    assert all(len(step) == num_shards and all(step) for step in theirs + ours)
    earlier = set(flat(flat(theirs[:-1])))
    new = [i for i in flat(theirs[-1]) if i not in earlier]
    assert sorted(i for i in flat(ours[-1]) if i not in earlier) == sorted(new)
    assert keep.repeated_samples == max(0, num_shards - len(new))
    assert sorted(set(flat(flat(ours)))) == list(range(n))


# ---------------------------------------------------------------------------------------------
# Argument errors


@pytest.mark.parametrize(
    "build,error,message",
    [
        (lambda: SequentialSampler(-1), ValueError, "length must be a non-negative int, got -1"),
        (lambda: RandomSampler(3.0), TypeError, "length must be a non-negative int, got 3.0"),
        (lambda: RandomSampler(3, seed="x"), TypeError, "seed must be an int, got 'x'"),
        (lambda: FilterSampler(3, [1]), TypeError, "fn must be callable"),
        (
            lambda: BatchSampler(SequentialSampler(3), 0),
            ValueError,
            "batch_size must be a positive int, got 0",
        ),
        (
            lambda: BatchSampler(SequentialSampler(3), True),
            TypeError,
            "batch_size must be a positive int, got True",
        ),
        (
            lambda: BatchSampler(SequentialSampler(3), 2, "drop"),
            ValueError,
            "last_batch must be one of 'keep', 'discard', 'rollover', got 'drop'",
        ),
        (lambda: BatchSampler(3, 2), TypeError, "sampler must be a sampler"),
        (
            lambda: ShardGroupSampler(BatchSampler(SequentialSampler(3), 1), 0),
            ValueError,
            "num_shards must be a positive int, got 0",
        ),
        (
            lambda: ShardGroupSampler(BatchSampler(SequentialSampler(3), 1), 2, "pad"),
            ValueError,
            "last_group must be one of 'keep', 'partial', 'discard', 'rollover', got 'pad'",
        ),
        (
            lambda: ShardGroupSampler(BatchSampler(SequentialSampler(3), 1), 2, None),
            ValueError,
            "last_group must be one of 'keep', 'partial', 'discard', 'rollover', got None",
        ),
        (
            lambda: PartitionSampler(SequentialSampler(3), 2, 2),
            ValueError,
            r"part_index must be an int in \[0, num_parts\) = \[0, 2\), got 2",
        ),
        (
            lambda: PartitionSampler(SequentialSampler(3), 0, 0),
            ValueError,
            "num_parts must be a positive int, got 0",
        ),
        (
            lambda: PartitionSampler(SequentialSampler(3), 2, 0, even_size=2),
            TypeError,
            r"even_size must be a bool \(True or False; 0 and 1 also do\), got 2",
        ),
        (lambda: SplitSampler(2, 3, 0), ValueError, "length must be at least num_parts=3, got 2"),
        (lambda: SplitSampler(9, 3, 0, repeat=0), ValueError, "repeat must be a positive int"),
        (lambda: FixedBucketSampler([], 2), ValueError, "lengths must be a non-empty sequence"),
        (lambda: FixedBucketSampler([1, 0], 2), ValueError, "lengths must all be positive"),
        (lambda: FixedBucketSampler([1.5, 2], 2), TypeError, "lengths must be a sequence of ints"),
        (lambda: FixedBucketSampler([(1, 2), (3,)], 2), ValueError, "equal-size tuples"),
        (
            lambda: FixedBucketSampler([1, 2], 2, ratio=-1),
            ValueError,
            "ratio must be a number >= 0, got -1",
        ),
        (
            lambda: FixedBucketSampler([1, 2], 2, num_buckets=0),
            ValueError,
            "num_buckets must be a positive int, got 0",
        ),
        (
            lambda: FixedBucketSampler([1, 2, 9], 2, bucket_keys=[5]),
            ValueError,
            "1 samples fit no bucket, e.g. sample 2 of length 9",
        ),
        (
            lambda: FixedBucketSampler([(1, 2)], 2, bucket_keys=[5]),
            ValueError,
            "bucket_keys must be a non-empty sequence of tuples of 2 ints",
        ),
        (
            lambda: FixedBucketSampler([1, 2], 2, num_shards=2, last_group="rollover"),
            ValueError,
            "last_group must be one of 'keep', 'partial', 'discard', 'pad', got 'rollover'",
        ),
        (
            lambda: FixedBucketSampler([1, 2], 2, num_shards=2, last_group="fill"),
            ValueError,
            "last_group must be one of 'keep', 'partial', 'discard', 'pad', got 'fill'",
        ),
        (lambda: SortedSampler([]), ValueError, "sort_keys must be a non-empty sequence"),
        (lambda: SortedSampler(3), TypeError, "sort_keys must be a non-empty sequence, got int"),
        (
            lambda: SortedSampler([1, 2], reverse="yes"),
            TypeError,
            r"reverse must be a bool \(True or False; 0 and 1 also do\), got 'yes'",
        ),
        (
            lambda: SortedBucketSampler([1, 2], 2, mult=0.5),
            ValueError,
            "mult must be a number >= 1, got 0.5",
        ),
        (lambda: SortedBucketSampler([], 2), ValueError, "sort_keys must be a non-empty"),
        (
            lambda: ExpWidthBucket(1.0),
            ValueError,
            "bucket_len_step must be a number greater than 1, got 1.0",
        ),
    ],
)
def test_bad_arguments_name_the_argument(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_set_epoch_rejects_negative():
    with pytest.raises(ValueError, match="epoch must be a non-negative int, got -1"):
        RandomSampler(3, seed=0).set_epoch(-1)


def test_package_validates_without_assert_or_print():
    for path in pathlib.Path(S.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            assert not isinstance(node, ast.Assert), f"assert in {path.name}:{node.lineno}"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                raise AssertionError(f"print in {path.name}:{node.lineno}")


# ---------------------------------------------------------------------------------------------
# Epochs and seeds


RANDOM_BUILDERS = {
    "random": lambda seed: RandomSampler(200, seed=seed),
    "batch": lambda seed: BatchSampler(RandomSampler(200, seed=seed), 7, "rollover"),
    "groups": lambda seed: ShardGroupSampler(
        BatchSampler(RandomSampler(200, seed=seed), 7), 3, "rollover"
    ),
    "partition": lambda seed: PartitionSampler(RandomSampler(200, seed=seed), 3, 1, True),
    "split": lambda seed: SplitSampler(200, 2, 1, seed=seed),
    "fixed": lambda seed: FixedBucketSampler(
        np.arange(200) % 37 + 1, 8, shuffle=True, num_shards=2, seed=seed
    ),
    "sorted": lambda seed: SortedBucketSampler(np.arange(200) % 13, 8, 5, shuffle=True, seed=seed),
}


@pytest.mark.parametrize("name", sorted(RANDOM_BUILDERS))
def test_order_is_a_function_of_seed_and_epoch(name):
    build = RANDOM_BUILDERS[name]
    a, b = build(123), build(123)
    a.set_epoch(4)
    b.set_epoch(4)
    assert list(a) == list(b)
    b.set_epoch(5)
    a.set_epoch(5)
    fifth = list(a)
    assert fifth == list(b)
    a.set_epoch(4)
    assert list(a) != fifth
    assert list(build(124)) != list(build(123))


@pytest.mark.parametrize("name", sorted(RANDOM_BUILDERS))
def test_seed_none_follows_numpy_global_seed(name):
    np.random.seed(42)
    first = RANDOM_BUILDERS[name](None)
    np.random.seed(42)
    second = RANDOM_BUILDERS[name](None)
    assert list(first) == list(second)


def test_each_pass_advances_the_epoch():
    sampler = RandomSampler(100, seed=0)
    assert sampler.epoch == 0
    first = list(sampler)
    assert sampler.epoch == 1
    assert list(sampler) != first
    assert sampler.seed == 0


def test_wrappers_forward_set_epoch():
    inner = RandomSampler(10, seed=0)
    outer = PartitionSampler(BatchSampler(inner, 3), 2, 0)
    outer.set_epoch(7)
    assert inner.epoch == 7
    inner.set_epoch(3)
    assert BatchSampler(inner, 2).epoch == 3  # a new wrapper starts where its sampler is


# ---------------------------------------------------------------------------------------------
# state_dict


STATE_BUILDERS = {
    "sequential": lambda: SequentialSampler(13, 2),
    "random": lambda: RandomSampler(13),
    "filter": lambda: FilterSampler(lambda x: x % 2, list(range(27))),
    "batch-keep": lambda: BatchSampler(RandomSampler(13), 3),
    "batch-rollover": lambda: BatchSampler(RandomSampler(13), 4, "rollover"),
    "groups-rollover": lambda: ShardGroupSampler(
        BatchSampler(RandomSampler(29), 3, "rollover"), 4, "rollover"
    ),
    "partition": lambda: PartitionSampler(BatchSampler(RandomSampler(31), 2, "rollover"), 3, 2),
    "partition-even": lambda: PartitionSampler(RandomSampler(31), 4, 3, even_size=True),
    "split": lambda: SplitSampler(31, 3, 1, even_size=True, repeat=2),
    "fixed": lambda: FixedBucketSampler(np.arange(60) % 17 + 1, 4, shuffle=True, num_shards=3),
    "sorted": lambda: SortedBucketSampler(np.arange(60) % 7, 4, 3, shuffle=True),
    "sorted-indices": lambda: SortedSampler(np.arange(23) % 5),
    "groups-keep": lambda: ShardGroupSampler(BatchSampler(RandomSampler(29), 3), 4),
    "groups-keep-repeats": lambda: ShardGroupSampler(BatchSampler(RandomSampler(26), 3), 4),
    "groups-partial": lambda: ShardGroupSampler(BatchSampler(RandomSampler(29), 3), 4, "partial"),
    "fixed-keep-repeats": lambda: FixedBucketSampler(
        np.arange(49) % 17 + 1, 4, bucket_keys=[17], shuffle=True, num_shards=3
    ),
}


@pytest.mark.parametrize("name", sorted(STATE_BUILDERS))
@pytest.mark.parametrize("epochs_before,cut", [(0, 0), (1, 1), (2, 3)])
def test_state_dict_resumes_mid_stream(name, epochs_before, cut):
    build = STATE_BUILDERS[name]
    np.random.seed(epochs_before)
    original = build()
    for _ in range(epochs_before):
        list(original)
    it = iter(original)
    done = [next(it) for _ in range(cut)]
    state = roundtrip(original.state_dict())
    assert state["offset"] == cut and state["type"] == type(original).__name__
    expected = list(it) + list(original) + list(original)
    assert len(done) == cut

    np.random.seed(999)  # a fresh sampler with a different fresh seed
    restored = build()
    restored.load_state_dict(state)
    restored.set_epoch(state["epoch"])  # what a loader does: keeps the position
    assert list(restored) + list(restored) + list(restored) == expected


@pytest.mark.parametrize("name", sorted(STATE_BUILDERS))
def test_state_between_epochs_restores_the_next_epoch(name):
    build = STATE_BUILDERS[name]
    original = build()
    list(original)
    state = roundtrip(original.state_dict())
    assert state["offset"] == 0 and state["epoch"] == 1
    expected_len = len(original)
    expected = list(original)
    restored = build()
    restored.load_state_dict(state)
    assert len(restored) == expected_len == len(expected)
    assert list(restored) == expected


def test_rollover_carry_is_in_the_state():
    sampler = BatchSampler(SequentialSampler(10), 4, "rollover")
    list(sampler)
    state = sampler.state_dict()
    assert state == {
        "type": "BatchSampler",
        "batch_size": 4,
        "last_batch": "rollover",
        "epoch": 1,
        "offset": 0,
        "carry": [8, 9],
        "length": 10,
        "sampler": {"type": "SequentialSampler", "length": 10, "start": 0, "epoch": 1, "offset": 0},
    }
    fresh = BatchSampler(SequentialSampler(10), 4, "rollover")
    fresh.load_state_dict(roundtrip(state))
    assert len(fresh) == 3 and next(iter(fresh)) == [8, 9, 0, 1]


def test_state_of_numpy_indices_is_json_ready():
    np.random.seed(0)
    sampler = ShardGroupSampler(BatchSampler(gdata.RandomSampler(10), 3, "rollover"), 2, "rollover")
    list(sampler)
    json.dumps(sampler.state_dict())


@pytest.mark.parametrize(
    "state_from,load_into,message",
    [
        (lambda: RandomSampler(5), lambda: SequentialSampler(5), "is for a RandomSampler"),
        (lambda: RandomSampler(5), lambda: RandomSampler(6), "length is 5 in the state but 6"),
        (
            lambda: BatchSampler(SequentialSampler(5), 2),
            lambda: BatchSampler(SequentialSampler(5), 3),
            "batch_size is 2 in the state but 3",
        ),
        (
            lambda: BatchSampler(SequentialSampler(5), 2),
            lambda: BatchSampler(SequentialSampler(5), 2, "rollover"),
            "last_batch is 'keep' in the state but 'rollover'",
        ),
        (
            lambda: BatchSampler(SequentialSampler(5), 2),
            lambda: BatchSampler(SequentialSampler(6), 2),
            "length is 5 in the state but 6",
        ),
        (
            lambda: BatchSampler(gdata.SequentialSampler(5), 2),
            lambda: BatchSampler(gdata.SequentialSampler(6), 2),
            "wrapped sampler's length is 5 in the state but 6",
        ),
        (
            lambda: FixedBucketSampler([1, 2, 3], 1, num_shards=2),
            lambda: FixedBucketSampler([1, 2, 3], 1, num_shards=3),
            "num_shards is 2 in the state but 3",
        ),
        (
            lambda: PartitionSampler(SequentialSampler(6), 3, 1),
            lambda: PartitionSampler(SequentialSampler(6), 3, 2),
            "part_index is 1 in the state but 2",
        ),
    ],
)
def test_incompatible_state_is_rejected(state_from, load_into, message):
    state = roundtrip(state_from().state_dict())
    with pytest.raises(ValueError, match=message):
        load_into().load_state_dict(state)


def test_malformed_state_is_rejected():
    sampler = BatchSampler(SequentialSampler(10), 4, "rollover")
    good = sampler.state_dict()
    with pytest.raises(ValueError, match="missing 'epoch'"):
        sampler.load_state_dict({k: v for k, v in good.items() if k != "epoch"})
    with pytest.raises(ValueError, match="carry'\\] holds 5 items"):
        sampler.load_state_dict({**good, "carry": [0, 1, 2, 3, 4]})
    with pytest.raises(ValueError, match="offset 9 is past the end of the epoch"):
        sampler.load_state_dict({**good, "offset": 9})
    with pytest.raises(TypeError, match="state must be a dict"):
        sampler.load_state_dict([1])


# ---------------------------------------------------------------------------------------------
# Docs


def test_doctests():
    import shardloader.sampler._base as base
    import shardloader.sampler._batch as batch
    import shardloader.sampler._bucket as bucket
    import shardloader.sampler._index as index
    import shardloader.sampler._scheme as scheme
    import shardloader.sampler._sorted as sorted_
    import shardloader.sampler._split as split
    import shardloader.sampler._state as state
    import shardloader.sampler._wrap as wrap

    attempted = 0
    for module in (S, base, state, wrap, index, batch, bucket, sorted_, scheme, split):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = doctest.testmod(
                module, extraglobs=vars(S), optionflags=doctest.NORMALIZE_WHITESPACE
            )
        assert result.failed == 0, module.__name__
        attempted += result.attempted
    assert attempted >= 30


def test_every_public_class_has_an_example():
    for name in S.__all__:
        assert ">>>" in (getattr(S, name).__doc__ or ""), name
