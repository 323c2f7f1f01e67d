"""Issue 7, property: stopping anywhere and resuming anywhere loses and repeats nothing.

For random loaders (dataset size, batch size, ``last_batch``, sampler), random backends
before and after the stop (inline, threads or processes, 0 to 2 workers) and a random stop
point within two epochs: the batches taken before the stop followed by those a new loader
yields after ``load_state_dict`` are byte for byte the batches of the uninterrupted run.
"""

from __future__ import annotations

import json

import pytest
from _datasets import RandomAugDataset, RangeDataset
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shardloader import ShardedDataLoader
from shardloader.sampler import FixedBucketSampler, RandomSampler

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("no_leaks"),
    # Random lengths can leave a bucket empty; the sampler says so, and that is fine here.
    pytest.mark.filterwarnings("ignore:Some buckets are empty"),
]

EPOCHS = 2


@st.composite
def backends(draw):
    """Inline, or 1-2 thread or process workers with a random prefetch window."""
    num_workers = draw(st.integers(0, 2))
    if num_workers == 0:
        return dict(num_workers=0)
    return dict(
        num_workers=num_workers,
        thread_pool=draw(st.booleans()),
        prefetch=draw(st.sampled_from([None, 0, 1, 5])),
    )


def fingerprint(batch):
    if isinstance(batch, (list, tuple)):
        return tuple(leaf for item in batch for leaf in fingerprint(item))
    array = batch.asnumpy()
    return ((array.dtype.str, array.shape, array.tobytes()),)


class Recipe:
    """Builds identical loaders: ``recipe.make(**backend)`` returns a fresh one."""

    def __init__(self, n, batch_size, kind, last_batch, seed, lengths, augment) -> None:
        self.n, self.batch_size, self.kind, self.last_batch = n, batch_size, kind, last_batch
        self.seed, self.lengths, self.augment = seed, lengths, augment

    def make(self, **backend) -> ShardedDataLoader:
        n, seed = self.n, self.seed
        # Per-sample randomness needs the loader's seed; plain data works without it.
        dataset = RandomAugDataset(n) if self.augment else RangeDataset(n)
        loader_seed = seed if self.augment or self.kind == "shuffle+seed" else None
        if self.kind == "bucket":
            sampler = FixedBucketSampler(
                self.lengths, self.batch_size, num_buckets=3, shuffle=True, seed=seed
            )
            return ShardedDataLoader(dataset, batch_sampler=sampler, seed=loader_seed, **backend)
        kwargs = dict(batch_size=self.batch_size, last_batch=self.last_batch, seed=loader_seed)
        if self.kind == "random":
            kwargs["sampler"] = RandomSampler(n, seed=seed)
        elif self.kind == "shuffle+seed":
            kwargs["shuffle"] = True
        return ShardedDataLoader(dataset, **kwargs, **backend)

    def __repr__(self) -> str:
        return (
            f"Recipe(n={self.n}, batch_size={self.batch_size}, kind={self.kind!r}, "
            f"last_batch={self.last_batch!r}, seed={self.seed}, augment={self.augment})"
        )


@st.composite
def recipes(draw):
    n = draw(st.integers(1, 30))
    return Recipe(
        n=n,
        batch_size=draw(st.integers(1, 7)),
        kind=draw(st.sampled_from(["sequential", "random", "shuffle+seed", "bucket"])),
        last_batch=draw(st.sampled_from(["keep", "discard", "rollover"])),
        seed=draw(st.integers(0, 2**31 - 1)),
        lengths=draw(st.lists(st.integers(1, 9), min_size=n, max_size=n)),
        augment=draw(st.booleans()),
    )


INLINE, THREADS, PROCESSES = (
    dict(num_workers=0),
    dict(num_workers=2, thread_pool=True, prefetch=1),
    dict(num_workers=2, prefetch=5),
)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    recipe=recipes(),
    before=backends(),
    after=backends(),
    stop_epoch=st.integers(0, EPOCHS - 1),
    stop_at=st.floats(0, 1),
)
# The cases that matter most, tried every time: a rollover carry into the epoch that is cut,
# per-sample randomness, and a bucket sampler.
@example(Recipe(23, 4, "shuffle+seed", "rollover", 5, [1] * 23, False), PROCESSES, INLINE, 1, 0.5)
@example(Recipe(13, 3, "random", "rollover", 9, [1] * 13, True), THREADS, PROCESSES, 1, 0.0)
@example(Recipe(17, 3, "bucket", "keep", 2, list(range(1, 18)), True), INLINE, THREADS, 1, 0.7)
def test_batches_before_the_stop_plus_after_the_resume_are_the_uninterrupted_run(
    recipe, before, after, stop_epoch, stop_at
):
    with recipe.make() as loader:
        reference = [[fingerprint(b) for b in loader] for _ in range(EPOCHS)]
    k = round(stop_at * len(reference[stop_epoch]))

    with recipe.make(**before) as loader:
        taken = [fingerprint(b) for _ in range(stop_epoch) for b in loader]
        it = iter(loader)
        taken += [fingerprint(next(it)) for _ in range(k)]
        state = json.loads(json.dumps(loader.state_dict()))

    with recipe.make(**after) as loader:
        loader.load_state_dict(state)
        rest = [fingerprint(b) for _ in range(stop_epoch, EPOCHS) for b in loader]

    expected = [b for epoch in reference for b in epoch]
    assert len(taken) + len(rest) == len(expected)
    assert taken + rest == expected
