"""A ragged last step must never train wrong: data-parallel training replayed on one device.

With one shard per device, ``gluon.Trainer.step`` sums the gradient of every device. A step
that leaves a device without a shard leaves that device's gradient from the step before in
place, and the sum takes it again: the update is wrong, and MXNet says nothing (with the
kvstore doing the update, its stale-gradient check never fires). So every step the loader
yields must have a shard for every device.

Each test here trains whole epochs of a small linear model with ``gluon.Trainer`` on two CPU
contexts (``ctx=[cpu(0), cpu(1)]``, ``num_shards=2``), records the samples of every step, and
replays the same steps on one device: one batch per step made of all of that step's samples,
whose gradient is the sum of the per-device gradients. The final weights must agree. The
dataset sizes leave ragged tails: a last step with fewer batches than shards, or with fewer
samples than shards.
"""

from __future__ import annotations

import json

import mxnet as mx
import numpy as np
import pytest
from conftest import ARRAYS, where
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mxnet import autograd, gluon

from shardloader import ShardedDataLoader
from shardloader.sampler import (
    BatchSampler,
    FixedBucketSampler,
    RandomSampler,
    SequentialSampler,
    ShardGroupSampler,
)

pytestmark = pytest.mark.timeout(120)

CTXS = [mx.cpu(0), mx.cpu(1)]
FEATURES = 3
BATCH = 4
EPOCHS = 3


class LinearDataset:
    """Sample ``i``: ``(x_i, y_i, i)`` with ``y = x . w + b`` plus noise. Module-level, so
    that worker processes can load it."""

    def __init__(self, n: int) -> None:
        rng = np.random.RandomState(n)
        self.x = rng.normal(size=(n, FEATURES)).astype("float32")
        noise = 0.1 * rng.normal(size=n)
        self.y = (self.x @ np.array([1.5, -2.0, 0.5]) + 0.3 + noise).astype("float32")[:, None]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], np.int32(i)


def make_net(ctx):
    net = gluon.nn.Dense(1, in_units=FEATURES)
    net.initialize(mx.init.Constant(0.25), ctx)  # the bias starts at zero (2.x: device=)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    return net, trainer


def weights(net, ctx):
    return np.concatenate([p.data(ctx).asnumpy().ravel() for p in net.collect_params().values()])


def train_on_two_devices(loader, epochs=EPOCHS):
    """Trains with one shard per context; returns the weights and each step's sample ids."""
    net, trainer = make_net(CTXS)
    loss_fn = gluon.loss.L2Loss()
    steps = []
    for _ in range(epochs):
        for step in loader:
            assert [where(x) for x, _, _ in step][: len(CTXS)] == CTXS[: len(step)]
            with autograd.record():
                losses = [loss_fn(net(x), y) for x, y, _ in step]
            autograd.backward(losses)
            trainer.step(sum(y.shape[0] for _, y, _ in step))
            steps.append([ids.asnumpy().tolist() for _, _, ids in step])
    final = weights(net, CTXS[0])
    np.testing.assert_array_equal(final, weights(net, CTXS[1]))  # the copies stay in sync
    return final, steps


def replay_on_one_device(dataset, steps):
    """The same steps on one context: a step's gradient is the sum over all its samples."""
    net, trainer = make_net(mx.cpu(0))
    loss_fn = gluon.loss.L2Loss()
    for step in steps:
        ids = [i for shard in step for i in shard]
        x, y = ARRAYS.array(dataset.x[ids]), ARRAYS.array(dataset.y[ids])  # the blocks' type
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(len(ids))
    return weights(net, mx.cpu(0))


def check_epochs(steps, n, per_epoch, repeated):
    """Every step has a non-empty shard per device, and in each epoch of ``per_epoch`` steps
    the samples counted as repeats (``repeated`` in all) are the only ones seen twice."""
    assert all(len(step) == len(CTXS) and all(step) for step in steps)
    seen_twice = 0
    for begin in range(0, len(steps), per_epoch):
        ids = [i for step in steps[begin : begin + per_epoch] for shard in step for i in shard]
        assert set(ids) <= set(range(n))
        seen_twice += len(ids) - len(set(ids))
    assert seen_twice == repeated


def ragged(n, batch_size=BATCH, shards=2):
    """``(batches, samples)`` left after the last whole group of ``shards`` batches of a pass
    of ``n`` samples: the tail that has to be spread over the shards."""
    batches = -(-n // batch_size)
    if not batches % shards:
        return 0, 0
    return batches % shards, n - (batches // shards) * shards * batch_size


# Sizes whose last steps cover the cases, with batches of 4 and 2 shards: a tail of 1 sample
# (fewer than shards: one repeat), of 2 (as many as shards), of 4 (a whole batch, cut in
# two), whole steps with a short last batch (21), and whole steps of whole batches (24).
SIZES = [17, 18, 20, 21, 24]


def test_the_sizes_leave_the_ragged_tails_they_are_meant_to():
    assert [ragged(n) for n in SIZES] == [(1, 1), (1, 2), (1, 4), (0, 0), (0, 0)]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("last_batch", [None, "keep", "discard", "rollover"])
def test_training_on_two_devices_equals_the_one_device_replay(n, last_batch):
    dataset = LinearDataset(n)
    with ShardedDataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=True,
        seed=n,
        last_batch=last_batch,
        num_shards=2,
        ctx=CTXS,
    ) as loader:
        lengths = [len(loader)]
        multi, steps = train_on_two_devices(loader)
        repeated = loader.stats()["repeated_samples"]
        lengths.append(len(loader))
    assert steps, "the run trained nothing"
    single = replay_on_one_device(dataset, steps)
    np.testing.assert_allclose(multi, single, rtol=1e-5, atol=1e-6)
    assert all(len(step) == len(CTXS) and all(step) for step in steps)
    if last_batch in (None, "keep"):
        per_epoch = len(steps) // EPOCHS
        assert lengths == [per_epoch] * 2 and per_epoch * EPOCHS == len(steps)
        tail = ragged(n)[1]
        assert repeated == (EPOCHS * (2 - tail) if 0 < tail < 2 else 0)
        check_epochs(steps, n, per_epoch, repeated)
        for e in range(EPOCHS):  # every epoch covers every sample
            epoch = steps[e * per_epoch : (e + 1) * per_epoch]
            assert {i for step in epoch for shard in step for i in shard} == set(range(n))
    elif last_batch == "discard":
        assert all(len(shard) == BATCH for step in steps for shard in step)
        assert repeated == 0 and len(steps) == EPOCHS * (n // BATCH // 2)
        check_epochs(steps, n, len(steps) // EPOCHS, 0)
    else:  # a rolled-over step can hold a sample of two passes, as with Gluon
        assert all(len(shard) == BATCH for step in steps for shard in step)
        assert repeated == 0 and len(steps) == (EPOCHS * n) // (BATCH * 2)
        stream = [i for step in steps for shard in step for i in shard]
        order = RandomSampler(n, seed=n)
        passes = [i for _ in range(EPOCHS) for i in order]  # the loader's shuffles, in turn
        assert stream == passes[: len(stream)]  # nothing lost or repeated, only carried


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_replay_with_process_workers(no_leaks):
    dataset = LinearDataset(17)
    with ShardedDataLoader(
        dataset, batch_size=BATCH, shuffle=True, seed=3, num_shards=2, ctx=CTXS, num_workers=2
    ) as loader:
        multi, steps = train_on_two_devices(loader)
        repeated = loader.stats()["repeated_samples"]
    assert repeated == EPOCHS  # one sample short of a full last step in every epoch
    check_epochs(steps, 17, 3, repeated)
    np.testing.assert_allclose(multi, replay_on_one_device(dataset, steps), rtol=1e-5, atol=1e-6)


BUCKET_N = 37
BUCKET_LENGTHS = [1 + (7 * i) % 23 for i in range(BUCKET_N)]


def bucket_sampler(**kwargs):
    return FixedBucketSampler(BUCKET_LENGTHS, 3, num_buckets=3, shuffle=True, seed=11, **kwargs)


def test_the_bucket_sampler_leaves_a_last_step_of_one_batch():
    sampler = bucket_sampler()
    assert len(sampler) % 2 == 1  # 13 batches: the seventh step has only one
    assert min(len(batch) for batch in sampler) == 2  # enough to spread, not repeat


@pytest.mark.parametrize("last_group", [None, "keep", "pad", "discard"])
def test_bucket_sampler_training_equals_the_one_device_replay(last_group):
    dataset = LinearDataset(BUCKET_N)
    policy = {} if last_group is None else {"last_group": last_group}
    sampler = bucket_sampler(num_shards=2, **policy)
    with ShardedDataLoader(dataset, batch_sampler=sampler, ctx=CTXS) as loader:
        multi, steps = train_on_two_devices(loader)
        repeated = loader.stats()["repeated_samples"]
    assert repeated == sampler.repeated_samples
    np.testing.assert_allclose(multi, replay_on_one_device(dataset, steps), rtol=1e-5, atol=1e-6)
    check_epochs(steps, BUCKET_N, len(sampler), repeated)
    assert len(steps) == EPOCHS * len(sampler)
    ids = [i for step in steps for shard in step for i in shard]
    if last_group == "discard":
        assert repeated == 0 and len(ids) < EPOCHS * BUCKET_N
    else:
        assert set(ids) == set(range(BUCKET_N)) and len(ids) == EPOCHS * BUCKET_N + repeated
    if last_group == "pad":
        assert repeated > 0  # gluon-nlp's way: a whole batch of the step before, again
    else:
        assert repeated == 0  # the last batch has at least 2 samples: spread, not repeated


def test_a_partial_step_trains_on_a_stale_gradient():
    """Why partial steps are only given on request: ``last_group='partial'`` leaves cpu(1)
    without a shard in the last step, and the Trainer sums cpu(1)'s gradient of the step
    before again, without a warning. The replay (what the step should have done) differs."""
    dataset = LinearDataset(17)
    steps_sampler = ShardGroupSampler(
        BatchSampler(RandomSampler(17, seed=17), BATCH), 2, last_group="partial"
    )
    with ShardedDataLoader(dataset, batch_sampler=steps_sampler, ctx=CTXS) as loader:
        multi, steps = train_on_two_devices(loader, epochs=1)
    assert [len(step) for step in steps] == [2, 2, 1]
    single = replay_on_one_device(dataset, steps)
    assert not np.allclose(multi, single, rtol=1e-3, atol=1e-4)
    # Without the partial step, the two agree: it is the one step that trained wrong.
    with ShardedDataLoader(
        dataset, batch_sampler=ShardGroupSampler(BatchSampler(RandomSampler(17, seed=17), 4), 2)
    ) as loader:
        full = [[ids.asnumpy().tolist() for _, _, ids in step] for step in loader]
    assert full[:2] == steps[:2] and len(full[2]) == 2


@pytest.mark.parametrize("stop", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [17, 19])
def test_checkpoint_in_the_middle_of_an_epoch_resumes_the_same_training(n, stop):
    """Stop after ``stop`` steps of the second epoch (3 is just before the filled last
    step), save the loader's state and the weights, resume in a fresh loader and net: the
    steps and the final weights are those of the uninterrupted run."""
    dataset = LinearDataset(n)

    def loader():
        return ShardedDataLoader(
            dataset, batch_size=BATCH, shuffle=True, seed=5, num_shards=2, ctx=CTXS
        )

    with loader() as whole:
        expected_weights, expected_steps = train_on_two_devices(whole)
        assert len(whole) == 3

    net, trainer = make_net(CTXS)
    loss_fn = gluon.loss.L2Loss()
    taken = []

    def train(step):
        with autograd.record():
            losses = [loss_fn(net(x), y) for x, y, _ in step]
        autograd.backward(losses)
        trainer.step(sum(y.shape[0] for _, y, _ in step))
        taken.append([ids.asnumpy().tolist() for _, _, ids in step])

    with loader() as first:
        for step in first:
            train(step)
        it = iter(first)
        for _ in range(stop):
            train(next(it))
        state = json.loads(json.dumps(first.state_dict()))
    saved = [p.data(CTXS[0]).copy() for p in net.collect_params().values()]

    net, trainer = make_net(CTXS)  # plain SGD: the weights are the whole training state
    for p, value in zip(net.collect_params().values(), saved):
        p.set_data(value)
    with loader() as second:
        second.load_state_dict(state)
        for _ in range(EPOCHS - 1):
            for step in second:
                train(step)
    assert taken == expected_steps
    np.testing.assert_allclose(weights(net, CTXS[0]), expected_weights, rtol=1e-6, atol=1e-7)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    n=st.integers(1, 40),
    batch_size=st.integers(1, 6),
    shards=st.integers(1, 4),
    last_batch=st.sampled_from(["keep", "discard", "rollover"]),
    shuffle=st.booleans(),
)
@example(n=1, batch_size=3, shards=4, last_batch="keep", shuffle=False)
@example(n=9, batch_size=4, shards=3, last_batch="keep", shuffle=False)
def test_loader_steps_are_full_and_repeat_only_a_short_tail(
    n, batch_size, shards, last_batch, shuffle
):
    """Over dataset size, batch size and shards, for each ``last_batch``: every step has
    ``num_shards`` non-empty shards, ``len()`` is right, nothing repeats while at least
    ``num_shards`` samples remain, and with ``'keep'`` every sample of every epoch comes."""
    kwargs = dict(shuffle=True, seed=n) if shuffle else {}
    with ShardedDataLoader(
        LinearDataset(n),
        batch_size=batch_size,
        last_batch=last_batch,
        num_shards=shards,
        **kwargs,
    ) as loader:
        counted = 0
        for _ in range(2):
            expected_len = len(loader)
            steps = [[ids.asnumpy().tolist() for _, _, ids in step] for step in loader]
            assert len(steps) == expected_len
            assert all(len(step) == shards and all(step) for step in steps)
            repeated = loader.stats()["repeated_samples"] - counted
            counted += repeated
            ids = [i for step in steps for shard in step for i in shard]
            if last_batch == "keep":
                assert set(ids) == set(range(n))
                tail = ragged(n, batch_size, shards)[1]
                assert repeated == (shards - tail if 0 < tail < shards else 0)
                assert len(ids) == n + repeated
                before = [i for step in steps[:-1] for shard in step for i in shard]
                assert len(set(before)) == len(before)  # no repeat before the last step
            else:
                assert repeated == 0
                assert all(len(shard) == batch_size for step in steps for shard in step)
                if last_batch == "discard":
                    assert len(ids) == len(set(ids))


def test_sequential_keep_steps_are_the_documented_ones():
    """The example of docs/sharding.md: 23 samples, batches of 3, steps of 3 shards."""
    steps = ShardGroupSampler(BatchSampler(SequentialSampler(23), 3), 3)
    assert [[len(shard) for shard in step] for step in steps] == [[3, 3, 3], [3, 3, 3], [2, 1, 2]]
