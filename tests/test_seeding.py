"""Issue 7, points 1 and 2: seeded order, per-sample randomness, worker info and init.

Randomness must be a function of ``(seed, epoch, sample or worker)``, never of scheduling
(docs/design.md, invariant 5), and thread and process pools follow the same rules (invariant 6).
"""

from __future__ import annotations

import os
import random
import warnings

import mxnet as mx
import numpy as np
import pytest
from _datasets import (
    RandomAugDataset,
    RandomAugExitOnce,
    RangeDataset,
    RecordingInit,
    WorkerInfoDataset,
)
from mxnet.gluon.data import ArrayDataset

from shardloader import ShardedDataLoader, get_worker_info
from shardloader._engine.seeding import (
    derive_seed,
    sample_seed,
    sample_seed_prefix,
    seed_python_and_numpy,
)
from shardloader.sampler import FixedBucketSampler, SplitSampler

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

BACKENDS = {
    "inline": dict(num_workers=0),
    "thread2": dict(num_workers=2, thread_pool=True),
    "fork1": dict(num_workers=1, start_method="fork"),
    "fork2": dict(num_workers=2, start_method="fork"),
    "fork3": dict(num_workers=3, start_method="fork"),
}
SPAWN = dict(num_workers=2, start_method="spawn")
SEED = 11
N = 24


# Each factory builds a fresh loader configuration: (dataset, loader kwargs). Samplers are
# stateful, so every loader gets its own.
def _shuffle():
    return RangeDataset(N), dict(batch_size=4, shuffle=True, seed=SEED)


def _bucket():
    lengths = [1 + (7 * i) % 13 for i in range(N)]
    sampler = FixedBucketSampler(lengths, batch_size=3, num_buckets=3, shuffle=True, seed=SEED)
    return RangeDataset(N), dict(batch_sampler=sampler, seed=SEED)


def _split():
    sampler = SplitSampler(N, num_parts=2, part_index=1, seed=SEED)
    return RangeDataset(N), dict(sampler=sampler, batch_size=4, seed=SEED)


SAMPLERS = {"shuffle": _shuffle, "FixedBucketSampler": _bucket, "SplitSampler": _split}


def _loader(factory, **backend) -> ShardedDataLoader:
    dataset, kwargs = factory()
    return ShardedDataLoader(dataset, **kwargs, **backend)


def _orders(loader: ShardedDataLoader, epochs: int):
    """The label (sample index) lists of every batch, per epoch."""
    with loader:
        return [[batch[1].asnumpy().tolist() for batch in loader] for _ in range(epochs)]


def _arrays(loader: ShardedDataLoader, epochs: int):
    with loader:
        return [[batch.asnumpy() for batch in loader] for _ in range(epochs)]


def _same_arrays(a, b) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(p.tobytes() == q.tobytes() for p, q in zip(x, y))
        for x, y in zip(a, b)
    )


def _disturb_global_rngs(value: int) -> None:
    """Nothing the program does with the global RNGs may change a seeded loader's output."""
    np.random.seed(value)
    random.seed(value)
    mx.random.seed(value)


# ------------------------------------------------------------------------------ order


_reference_orders: dict = {}


def _reference(sampler: str, epochs: int = 3):
    """Inline loading's orders, computed once per sampler (seeding every sample costs MXNet
    about a millisecond)."""
    if sampler not in _reference_orders:
        _disturb_global_rngs(1)
        _reference_orders[sampler] = _orders(_loader(SAMPLERS[sampler]), epochs)
    return _reference_orders[sampler]


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_order_is_the_same_on_every_run_and_changes_with_the_epoch(sampler):
    reference = _reference(sampler)
    _disturb_global_rngs(2)
    assert _orders(_loader(SAMPLERS[sampler]), 3) == reference, "two runs differ"
    epochs = [sorted(i for batch in epoch for i in batch) for epoch in reference]
    assert epochs[0] == epochs[1] == epochs[2], "every epoch visits the same samples"
    assert len(set(map(str, reference))) == 3, "the order must change with the epoch"


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "inline"])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_order_does_not_depend_on_the_workers(sampler, backend):
    reference = _reference(sampler)
    _disturb_global_rngs(3)
    assert _orders(_loader(SAMPLERS[sampler], **BACKENDS[backend]), 3) == reference


def test_different_seeds_give_different_orders():
    a = _orders(ShardedDataLoader(RangeDataset(N), batch_size=4, shuffle=True, seed=1), 1)
    b = _orders(ShardedDataLoader(RangeDataset(N), batch_size=4, shuffle=True, seed=2), 1)
    assert a != b


@pytest.mark.parametrize("backend", ["inline", "fork2"])
def test_set_epoch_selects_the_order_of_the_next_iter(backend):
    reference = _orders(_loader(_shuffle), 4)
    assert reference[:3] == _reference("shuffle")
    with _loader(_shuffle, **BACKENDS[backend]) as loader:
        loader.set_epoch(2)
        assert [b[1].asnumpy().tolist() for b in loader] == reference[2]
        assert [b[1].asnumpy().tolist() for b in loader] == reference[3], "epochs go on from e"
        loader.set_epoch(0)
        assert [b[1].asnumpy().tolist() for b in loader] == reference[0]


@pytest.mark.parametrize("backend", ["inline", "fork2"])
def test_every_new_iter_advances_the_epoch(backend):
    reference = _reference("shuffle")
    with _loader(_shuffle, **BACKENDS[backend]) as loader:
        it = iter(loader)
        assert next(it)[1].asnumpy().tolist() == reference[0][0]
        del it  # an epoch given up after one batch still counts
        assert [b[1].asnumpy().tolist() for b in loader] == reference[1]
        assert [b[1].asnumpy().tolist() for b in loader] == reference[2]


# ------------------------------------------------------------------------ per-sample RNG


def _aug(backend=None, n=24, epochs=2, **kwargs) -> list:
    kwargs.setdefault("batch_size", 4)
    kwargs.setdefault("shuffle", True)
    loader = ShardedDataLoader(RandomAugDataset(n), **kwargs, **(backend or {}))
    return _arrays(loader, epochs)


def _by_index(epoch_batches, columns=slice(1, 4)) -> dict:
    """{sample index: its draws} for one epoch of RandomAugDataset batches (columns 1, 2
    and 3: random, numpy, MXNet)."""
    rows = np.concatenate(epoch_batches)
    return {int(r[0]): r[columns].tobytes() for r in rows}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_seeded_augmentation_is_identical_for_any_workers(backend):
    _disturb_global_rngs(5)
    reference = _aug(seed=7)
    _disturb_global_rngs(6)
    assert _same_arrays(_aug(BACKENDS[backend], seed=7), reference)


def test_seeded_augmentation_and_order_are_identical_under_spawn(tmp_path):
    """One spawn run (it costs a second or two): order, per-sample draws, worker info."""
    spawned = _aug(SPAWN, seed=7, worker_init_fn=RecordingInit(tmp_path))
    assert _same_arrays(spawned, _aug(seed=7))
    records = RecordingInit.read(tmp_path)
    assert [r["info"] for r in records] == [[0, 2, 7], [1, 2, 7]]


@pytest.mark.parametrize("backend", ["inline", "thread2", "fork2"])
def test_seeded_draws_differ_per_sample_and_per_epoch(backend):
    n = 32
    epochs = _aug(BACKENDS[backend], n=n, epochs=2, seed=3)
    first, second = (np.concatenate(e) for e in epochs)
    for column, rng in enumerate(["random", "numpy", "mxnet"], start=1):
        assert len(set(first[:, column])) == n, f"{rng}: two samples drew the same value"
    first, second = _by_index(epochs[0]), _by_index(epochs[1])
    assert sorted(first) == sorted(second) == list(range(n))
    assert all(first[i] != second[i] for i in range(n)), "a sample repeated its draws"


def _regrouped():
    """One epoch in two groupings: shuffled batches of 4, and sequential batches of 3."""
    a = _aug(n=20, epochs=1, seed=3, batch_size=4, shuffle=True)[0]
    b = _aug(BACKENDS["fork2"], n=20, epochs=1, seed=3, batch_size=3, shuffle=False)[0]
    return a, b


@pytest.mark.parametrize("rng,column", [("random", 1), ("numpy", 2)])
def test_seeded_draws_depend_on_the_sample_not_on_its_batch_or_position(rng, column):
    """Seeds come from (seed, epoch, sample index): batching and order do not matter."""
    a, b = _regrouped()
    assert _by_index(a, column) == _by_index(b, column)


def test_seeded_mxnet_draws_are_a_function_of_the_batch():
    """MXNet's RNG is seeded once per batch, from (seed, epoch, the batch's indices):
    reseeding it costs about a millisecond of engine work, too much per sample. So a
    sample's MXNet draws follow its batch (the same batch gives the same draws on any
    backend), while random and numpy.random follow the sample alone."""
    inline = _aug(n=20, epochs=1, seed=3, batch_size=4, shuffle=True)[0]
    forked = _aug(BACKENDS["fork2"], n=20, epochs=1, seed=3, batch_size=4, shuffle=True)[0]
    assert _by_index(inline, 3) == _by_index(forked, 3)
    regrouped = _aug(BACKENDS["fork2"], n=20, epochs=1, seed=3, batch_size=3, shuffle=False)[0]
    assert _by_index(inline, 3) != _by_index(regrouped, 3)
    draws = [r[3] for batch in inline for r in batch]
    assert len(set(draws)) == len(draws)


@pytest.mark.parametrize("backend", ["inline", "thread2", "fork2"])
def test_mxnet_seed_per_sample_makes_mxnet_draws_follow_the_sample(backend):
    """mxnet_seed='sample' reseeds MXNet before every sample too, as issue 7 words it: a
    sample's MXNet draws then do not depend on its batch, its position or the backend."""
    kwargs = dict(n=20, epochs=1, seed=3, mxnet_seed="sample")
    shuffled = _aug(BACKENDS[backend], batch_size=4, shuffle=True, **kwargs)[0]
    regrouped = _aug(batch_size=3, shuffle=False, **kwargs)[0]
    assert _by_index(shuffled, 3) == _by_index(regrouped, 3)
    draws = [r[3] for batch in shuffled for r in batch]
    assert len(set(draws)) == len(draws)


def test_mxnet_seed_is_validated():
    with pytest.raises(ValueError, match="mxnet_seed must be one of 'batch', 'sample'"):
        ShardedDataLoader(RandomAugDataset(4), batch_size=2, seed=0, mxnet_seed="epoch")


def test_rollover_batches_that_start_alike_still_draw_distinct_values():
    """With seed 6, epoch 1 is [7, 1, 8, 6], [7, 1, 4, 5], [2, 9, 3, 0]: the rollover
    carry makes two batches start with the same samples. Different samples must still get
    different draws from every RNG (the same sample, 7 or 1, may repeat its own)."""
    epochs = _aug(n=10, epochs=2, seed=6, batch_size=4, last_batch="rollover")
    order = [row[0] for row in np.concatenate(epochs[1])]
    assert order == [7, 1, 8, 6, 7, 1, 4, 5, 2, 9, 3, 0], "the sampler's order changed"
    rows = np.concatenate(epochs[1])
    for column, rng in enumerate(["random", "numpy", "mxnet"], start=1):
        per_sample = {int(r[0]): r[column] for r in rows}
        assert len(set(per_sample.values())) == 10, f"{rng}: two samples drew alike"


def test_different_seeds_give_different_draws():
    a = _by_index(_aug(n=16, epochs=1, seed=1)[0])
    b = _by_index(_aug(n=16, epochs=1, seed=2)[0])
    assert all(a[i] != b[i] for i in range(16))


@pytest.mark.parametrize("backend", ["fork2", "fork3", "thread2", "inline"])
def test_unseeded_workers_draw_distinct_values(backend):
    """The duplicate-augmentation bug: forked workers must not repeat each other's draws."""
    n = 64
    workers = dict(BACKENDS[backend])
    if backend.startswith("fork"):
        workers["num_workers"] = 4
    np.random.seed(0)  # the parent's state, which forked workers inherit
    epochs = _aug(workers, n=n, epochs=2, batch_size=4, shuffle=False)
    rows = np.concatenate(epochs[0] + epochs[1])
    for column, rng in enumerate(["random", "numpy", "mxnet"], start=1):
        distinct = len(set(rows[:, column]))
        assert distinct >= 0.95 * len(rows), f"{rng}: {distinct} distinct of {len(rows)}"


def _restarted_run(tmp_path, seed):
    """An epoch in which worker process 0 or 1 dies once and is replaced."""
    once = str(tmp_path / "died")
    dataset = RandomAugExitOnce(64, bad=41, once_file=once)
    loader = ShardedDataLoader(
        dataset, batch_size=4, seed=seed, num_workers=2, on_worker_death="restart"
    )
    with loader:
        rows = np.concatenate([b.asnumpy() for b in loader])
    assert os.path.exists(once), "the worker never died"
    return rows


def test_seeded_draws_survive_a_worker_restart(tmp_path):
    """A replaced worker redoes the lost batch with the same per-sample seeds."""
    reference = np.concatenate(_aug(n=64, epochs=1, seed=3, shuffle=False)[0])
    assert _restarted_run(tmp_path, seed=3).tobytes() == reference.tobytes()


def test_a_restarted_worker_does_not_repeat_its_predecessors_draws(tmp_path):
    """Without seed, the worker that replaces a dead one must get a stream of its own."""
    rows = _restarted_run(tmp_path, seed=None)
    for column, rng in enumerate(["random", "numpy"], start=1):
        assert len(set(rows[:, column])) == len(rows), f"{rng} draws repeat after a restart"


def test_inline_seeding_leaves_the_callers_rngs_alone():
    np.random.seed(123)
    random.seed(123)
    expected_np, expected_py = np.random.rand(3).tolist(), [random.random() for _ in range(3)]

    np.random.seed(123)
    random.seed(123)
    got_np, got_py = [np.random.rand()], [random.random()]
    with ShardedDataLoader(RandomAugDataset(8), batch_size=4, seed=5) as loader:
        for _ in loader:
            got_np.append(np.random.rand())
            got_py.append(random.random())
    assert got_np == expected_np
    assert got_py == expected_py


def _caller_draws(n):
    return np.random.rand(n).tolist(), [random.random() for _ in range(n)]


def test_seeded_thread_workers_leave_the_callers_numpy_and_random_alone():
    """Thread workers share the process's global RNGs with the caller. They may seed them
    around each sample (taking turns), but the caller's streams must go on where they were
    once the epoch is over."""
    np.random.seed(123)
    random.seed(123)
    expected = _caller_draws(4)
    np.random.seed(123)
    random.seed(123)
    first = _caller_draws(1)
    with ShardedDataLoader(RandomAugDataset(8), batch_size=4, seed=5, **BACKENDS["thread2"]) as dl:
        for _ in dl:
            pass
    rest = _caller_draws(3)
    assert (first[0] + rest[0], first[1] + rest[1]) == expected


def test_seeded_thread_workers_leave_the_callers_mxnet_rng_alone():
    """MXNet's RNG is per thread: thread workers have no reason to touch the caller's."""

    def draws(n):
        return [mx.nd.random.uniform().asscalar() for _ in range(n)]

    mx.random.seed(123)
    expected = draws(3)
    mx.random.seed(123)
    got = draws(1)
    with ShardedDataLoader(RandomAugDataset(8), batch_size=4, seed=5, **BACKENDS["thread2"]) as dl:
        for _ in dl:
            pass
    got += draws(2)
    assert got == expected


# ------------------------------------------------------------------- worker info and init


def test_get_worker_info_is_none_in_the_main_process():
    assert get_worker_info() is None
    with ShardedDataLoader(WorkerInfoDataset(6), batch_size=3, seed=4) as loader:
        rows = np.concatenate([b.asnumpy() for b in loader])
    assert (rows[:, 1:] == [-1, 0, -1, 0, 0]).all(), "inline loading happens in the main process"


@pytest.mark.parametrize("backend", ["thread2", "fork2", "fork3"])
@pytest.mark.parametrize("seed", [9, None])
def test_get_worker_info_inside_workers(backend, seed):
    workers = BACKENDS[backend]
    n = 48
    with ShardedDataLoader(WorkerInfoDataset(n), batch_size=2, seed=seed, **workers) as loader:
        rows = np.concatenate([b.asnumpy() for b in loader])
    assert rows[:, 0].tolist() == list(range(n))
    assert set(rows[:, 1]) <= set(range(workers["num_workers"]))
    if not workers.get("thread_pool"):
        # Tasks go to the least-loaded worker, so with 24 batches every worker gets some.
        assert set(rows[:, 1]) == set(range(workers["num_workers"]))
    assert (rows[:, 2] == workers["num_workers"]).all()
    assert (rows[:, 3] == (-1 if seed is None else seed)).all()
    assert (rows[:, 4] == 1).all(), "info.dataset must be the dataset the worker loads from"
    assert (rows[:, 5] == n).all()


def _init_records(tmp_path, name, seed, np_seed, epochs=2, **workers):
    directory = tmp_path / name
    directory.mkdir()
    np.random.seed(np_seed)  # what a forked worker inherits: must not decide its draws
    random.seed(np_seed)
    loader = ShardedDataLoader(
        RangeDataset(16),
        batch_size=2,
        seed=seed,
        worker_init_fn=RecordingInit(directory),
        **workers,
    )
    with loader:
        for _ in range(epochs):
            for _ in loader:
                pass
    return RecordingInit.read(directory)


@pytest.mark.parametrize("backend", ["fork3", "fork1"])
def test_worker_init_fn_runs_once_per_worker_after_seeding(tmp_path, backend):
    workers = BACKENDS[backend]
    num = workers["num_workers"]
    first = _init_records(tmp_path, "a", seed=21, np_seed=1, **workers)
    assert [r["worker_id"] for r in first] == list(range(num)), "once per worker, all epochs"
    assert [r["info"] for r in first] == [[i, num, 21] for i in range(num)]
    assert len({r["np"] for r in first}) == num, "workers share a numpy stream"
    assert len({r["py"] for r in first}) == num, "workers share a random stream"

    again = _init_records(tmp_path, "b", seed=21, np_seed=2, **workers)
    assert [(r["np"], r["py"]) for r in again] == [(r["np"], r["py"]) for r in first], (
        "worker_init_fn must run after the worker is seeded from (seed, worker id)"
    )
    other = _init_records(tmp_path, "c", seed=22, np_seed=1, **workers)
    assert all(r["np"] != s["np"] for r, s in zip(other, first))


def test_worker_init_fn_unseeded_workers_get_distinct_streams(tmp_path):
    records = _init_records(tmp_path, "a", seed=None, np_seed=0, epochs=1, num_workers=3)
    assert len({r["np"] for r in records}) == 3
    assert len({r["py"] for r in records}) == 3


def test_worker_init_fn_in_thread_workers(tmp_path):
    records = _init_records(tmp_path, "a", seed=3, np_seed=0, **BACKENDS["thread2"])
    assert [r["worker_id"] for r in records] == [0, 1]
    assert [r["info"] for r in records] == [[0, 2, 3], [1, 2, 3]]


def test_worker_init_fn_does_not_change_seeded_augmentation(tmp_path):
    """Per-sample seeding happens before every sample, whatever worker_init_fn drew."""
    plain = _aug(BACKENDS["fork2"], seed=8)
    with_init = _aug(BACKENDS["fork2"], seed=8, worker_init_fn=RecordingInit(tmp_path))
    assert _same_arrays(plain, with_init)


# ------------------------------------------------------------- seeding only what draws
# Seeding costs microseconds a sample (random, numpy.random) and a millisecond a batch
# (MXNet), so a dataset that draws from none of them is not seeded: MXNet is reseeded just
# before the batch's first call that can draw, random and numpy.random only for a dataset
# that drew from them. The batches must be those of seeding everything, always.


def _mx_jitter(x):
    """A transform that draws from MXNet's RNG."""
    return x + mx.nd.random.uniform(shape=x.shape, ctx=mx.cpu()).asnumpy()


class HybridDropoutDataset(RangeDataset):
    """Samples through a hybridized Dropout (a cached graph, not one operator at a time)."""

    def __init__(self, n: int) -> None:
        super().__init__(n, width=8)
        self._net = None

    def __getitem__(self, i):
        if self._net is None:
            self._net = mx.gluon.nn.Dropout(0.5)
            self._net.hybridize()
        ones = mx.np.ones if mx.__version__.startswith("2") else mx.nd.ones
        with mx.autograd.train_mode():
            return self._net(ones((8,), ctx=mx.cpu())).asnumpy() * (i + 1)

    def __getstate__(self):
        return {**self.__dict__, "_net": None}


class SelfSeedingDataset(RangeDataset):
    """Seeds MXNet itself for some samples, then draws."""

    def __getitem__(self, i):
        if i % 3 == 0:
            mx.random.seed(i)
        return np.array([i, mx.nd.random.uniform(ctx=mx.cpu()).asscalar()])


class LateDrawsDataset(RangeDataset):
    """Draws from random and numpy.random only from sample ``first`` on: not in the first
    batch, which finds no draws, so later batches load unseeded until one draws."""

    calls = 0  # counted in this process (inline loading)

    def __init__(self, n: int, first: int) -> None:
        super().__init__(n)
        self.first = first

    def __getitem__(self, i):
        type(self).calls += 1
        if i < self.first:
            return np.array([i, -1.0, -1.0])
        return np.array([i, random.random(), np.random.rand()])


MODES = {**BACKENDS, "forkserver2": dict(num_workers=2, start_method="forkserver")}


@pytest.mark.parametrize(
    "dataset",
    [
        lambda: ArrayDataset(np.arange(40, dtype=np.float32).reshape(20, 2)).transform(_mx_jitter),
        lambda: HybridDropoutDataset(20),
        lambda: SelfSeedingDataset(20),
    ],
    ids=["transform", "hybridized", "self-seeding"],
)
@pytest.mark.parametrize("backend", ["fork2", "thread2", "forkserver2"])
def test_mxnet_draws_are_identical_inline_and_in_workers(dataset, backend):
    _disturb_global_rngs(1)
    reference = _arrays(ShardedDataLoader(dataset(), batch_size=4, shuffle=True, seed=9), 2)
    _disturb_global_rngs(2)
    loader = ShardedDataLoader(dataset(), batch_size=4, shuffle=True, seed=9, **MODES[backend])
    assert _same_arrays(_arrays(loader, 2), reference)
    other_seed = _arrays(ShardedDataLoader(dataset(), batch_size=4, shuffle=False, seed=10), 1)
    same_order = _arrays(ShardedDataLoader(dataset(), batch_size=4, shuffle=False, seed=9), 1)
    assert not _same_arrays(other_seed, same_order), "MXNet's draws did not follow the seed"


def test_a_dataset_that_seeds_mxnet_itself_draws_from_its_own_seed():
    with ShardedDataLoader(SelfSeedingDataset(12), batch_size=4, seed=9) as loader:
        rows = np.concatenate([b.asnumpy() for b in loader])
    for i in (0, 3, 6, 9):
        mx.random.seed(i)
        assert rows[i, 1] == mx.nd.random.uniform(ctx=mx.cpu()).asscalar()


def _expected_late_draws(n: int, first: int, seed: int, epoch: int) -> np.ndarray:
    rows = []
    for i in range(n):
        if i < first:
            rows.append([i, -1.0, -1.0])
            continue
        value = derive_seed(seed, epoch, i)
        random.seed(value)
        np.random.seed(value)
        rows.append([i, random.random(), np.random.rand()])
    return np.array(rows)


@pytest.mark.parametrize("backend", ["inline", "thread2", "fork2", "forkserver2"])
def test_a_dataset_that_draws_only_in_later_batches_still_gets_every_samples_seed(backend):
    """Batches 0 and 1 draw nothing; batch 2 does, unseeded: it is made again, seeded."""
    n, first = 16, 9
    LateDrawsDataset.calls = 0
    loader = ShardedDataLoader(LateDrawsDataset(n, first), batch_size=4, seed=3, **MODES[backend])
    epochs = _arrays(loader, 2)
    for epoch, batches in enumerate(epochs):
        got = np.concatenate(batches)
        assert got.tobytes() == _expected_late_draws(n, first, 3, epoch).tobytes()
    if backend == "inline":
        # Each epoch: its first batch seeded, batches 1 and 2 unseeded, batch 2 again
        # seeded, and the rest seeded.
        assert LateDrawsDataset.calls == 2 * (n + 4)


@pytest.mark.parametrize("first", [0, 9, 99], ids=["draws", "draws-later", "never-draws"])
def test_inline_seeding_gives_back_the_callers_states_even_mid_gaussian_pair(first):
    """The caller's random and numpy.random go on as if nothing had loaded, a cached
    Gaussian value (``randn`` and ``random.gauss`` draw them in pairs) included."""

    def caller(n):
        return [np.random.randn(), random.gauss(0, 1), np.random.rand(), random.random()][:n]

    np.random.seed(5)
    random.seed(5)
    np.random.randn()  # a cached value in each
    random.gauss(0, 1)
    expected = [caller(4) for _ in range(4)]
    np.random.seed(5)
    random.seed(5)
    np.random.randn()
    random.gauss(0, 1)
    got = []
    with ShardedDataLoader(LateDrawsDataset(16, first), batch_size=4, seed=1) as loader:
        for _ in loader:
            got.append(caller(4))
    assert got == expected


def test_inline_loading_that_draws_nothing_from_mxnet_leaves_the_callers_mxnet_rng_alone():
    def draws(n):
        return [mx.nd.random.uniform(ctx=mx.cpu()).asscalar() for _ in range(n)]

    mx.random.seed(123)
    expected = draws(4)
    mx.random.seed(123)
    got = draws(1)
    with ShardedDataLoader(LateDrawsDataset(12, 0), batch_size=4, seed=5) as loader:
        for _ in loader:
            got += draws(1)
    assert got == expected


def test_seeding_primitives_match_the_plain_calls():
    assert all(
        sample_seed(sample_seed_prefix(s, e), i) == derive_seed(s, e, i)
        for s, e, i in [(0, 0, 0), (7, 3, 11), (2**40, -1, 5), (-3, 2**63, 2**62)]
    )
    random.gauss(0, 1)
    np.random.randn()
    seed_python_and_numpy(42)
    ours = (random.random(), random.gauss(0, 1), np.random.rand(), np.random.randn())
    random.seed(42)
    np.random.seed(42)
    assert ours == (random.random(), random.gauss(0, 1), np.random.rand(), np.random.randn())


# ------------------------------------------------------------ no warnings of our own


class StrictDataset(RangeDataset):
    """Draws from random, numpy and MXNet, with every warning an error wherever it loads:
    a spawn worker turns them on as it unpickles the dataset (before it seeds), a forked
    worker inherits the filter, threads share it."""

    def __getitem__(self, i):
        draw = mx.nd.random.uniform(ctx=mx.cpu()).asscalar()  # the device named: no warning
        return np.array([i, random.random(), np.random.rand(), draw], dtype=np.float64)

    def __setstate__(self, state):
        self.__dict__.update(state)
        warnings.simplefilter("error")


@pytest.mark.mx2_smoke
@pytest.mark.parametrize("backend", ["inline", "thread2", "fork2", "spawn1"])
def test_seeding_raises_no_warning_even_as_errors(backend):
    """Issue 22, item 16: under MXNet 2.x the per-worker and per-batch seeding called a
    deprecated MXNet function, so with warnings as errors (``-W error``) every worker died.
    Seeding is silent now, and the draws are those of inline loading without the filter."""
    spawn1 = dict(num_workers=1, start_method="spawn")  # one: each spawned worker costs seconds
    backend_kwargs = spawn1 if backend == "spawn1" else BACKENDS[backend]
    with ShardedDataLoader(StrictDataset(12), batch_size=4, seed=5) as loader:
        expected = [b.asnumpy() for b in loader]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ShardedDataLoader(StrictDataset(12), batch_size=4, seed=5, **backend_kwargs) as ld:
            got = [b.asnumpy() for b in ld]
    assert _same_arrays([got], [expected])
