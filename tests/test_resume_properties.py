"""Issue 7, property: stopping anywhere and resuming anywhere loses and repeats nothing.

For random loaders (dataset size, batch size, ``last_batch``, sampler), random backends
before and after the stop (inline, threads or processes, 0 to 2 workers) and a random stop
point within two epochs: the batches taken before the stop followed by those a new loader
yields after ``load_state_dict`` are byte for byte the batches of the uninterrupted run.
"""

from __future__ import annotations

import copy
import json

import pytest
from _datasets import RandomAugDataset, RangeDataset
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from shardloader import ShardedDataLoader
from shardloader.sampler import (
    BatchSampler,
    FixedBucketSampler,
    PartitionSampler,
    RandomSampler,
    SequentialSampler,
    ShardGroupSampler,
    SplitSampler,
)

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


# ------------------------------------------------------------------------ garbage states

# Anything JSON can hold, and numbers around the edges of the valid ranges.
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
NEAR = st.integers(-2, 8) | st.sampled_from([10**6, 2**63, -(2**63), 2**64 + 1])
FIELDS = ["version", "epoch", "consumed", "sampler", "seed", "dataset_len", "batch_size"]


def _paths(value, prefix=()):
    """Every position in a nested state: dict keys and list items, depth first."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        yield prefix + (key,)
        if isinstance(item, (dict, list)):
            yield from _paths(item, prefix + (key,))


@st.composite
def garbage(draw, valid):
    """A random value, a random dict of state-like fields, or ``valid`` with 1 to 3 fields
    replaced (by anything, or by a number near a valid one), deleted or added."""
    kind = draw(st.sampled_from(["random", "fields", "mutated", "mutated", "mutated"]))
    if kind == "random":
        return draw(JSON)
    if kind == "fields":
        return draw(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), JSON))
    state = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(state))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = state
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        action = draw(st.sampled_from(["replace", "near", "delete", "add"]))
        if action == "delete":
            del parent[key]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(JSON)
        elif action == "add":
            parent.append(draw(NEAR))
        else:
            parent[key] = draw(NEAR if action == "near" else JSON)
    return state


class PlainRecipe(Recipe):
    """A Recipe over RangeDataset (sample i carries the label i), whose batch sampler can be
    built on its own, to say which batches a state stands for."""

    def batch_sampler(self):
        if self.kind == "bucket":
            return FixedBucketSampler(
                self.lengths, self.batch_size, num_buckets=3, shuffle=True, seed=self.seed
            )
        if self.kind == "sequential":
            indices = SequentialSampler(self.n)
        else:
            indices = RandomSampler(self.n, seed=self.seed)
        return BatchSampler(indices, self.batch_size, self.last_batch)


@st.composite
def plain_recipes(draw):
    kind = draw(st.sampled_from(["sequential", "random", "shuffle+seed", "bucket"]))
    n = draw(st.integers(1 if kind == "bucket" else 0, 25))
    return PlainRecipe(
        n=n,
        batch_size=draw(st.integers(1, 6)),
        kind=kind,
        last_batch=draw(st.sampled_from(["keep", "discard", "rollover"])),
        seed=draw(st.integers(0, 2**31 - 1)),
        lengths=draw(st.lists(st.integers(1, 9), min_size=n, max_size=n)),
        augment=False,
    )


def labels(loader, epochs=2):
    return [[b[1].asnumpy().tolist() for b in loader] for _ in range(epochs)]


def batches_of_state(recipe, state, epochs=2):
    """The batches a loader resumed from ``state`` must yield, from the batch sampler alone:
    ``state['sampler']`` loaded, the epoch's batches past ``consumed``, then the next epoch."""
    sampler = recipe.batch_sampler()
    sampler.load_state_dict(state["sampler"])
    out, skip = [], state["consumed"]
    for epoch in range(state["epoch"], state["epoch"] + epochs):
        sampler.set_epoch(epoch)
        out.append([list(batch) for batch in sampler][skip:])
        skip = 0
    return out


@settings(
    max_examples=75,  # each builds three loaders and runs two or three epochs
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    recipe=plain_recipes(),
    stop_epoch=st.integers(0, 1),
    stop_at=st.floats(0, 1),
    history=st.integers(0, 1),
    data=st.data(),
)
@example(  # the cases from the bug report: out-of-range and mistyped counters
    PlainRecipe(20, 4, "shuffle+seed", "rollover", 5, [1] * 20, False), 1, 0.4, 1, None
)
def test_a_garbage_state_is_refused_unchanged_or_resumes_exactly(
    recipe, stop_epoch, stop_at, history, data
):
    with recipe.make() as loader:
        reference = labels(loader, stop_epoch + 2)
    k = round(stop_at * len(reference[stop_epoch]))
    with recipe.make() as loader:
        for _ in range(stop_epoch):
            list(loader)
        it = iter(loader)
        for _ in range(k):
            next(it)
        valid = json.loads(json.dumps(loader.state_dict()))
    # The oracle agrees with the uninterrupted run on the genuine state.
    assert batches_of_state(recipe, valid) == [reference[stop_epoch][k:], reference[stop_epoch + 1]]

    if data is None:  # the explicit example: each of the reported cases in turn
        states = [dict(valid, consumed=-3), dict(valid, consumed="2"), dict(valid, epoch="1")]
        states += [dict(valid, consumed=10**6), {k: v for k, v in valid.items() if k != "seed"}]
    else:
        states = [data.draw(garbage(valid), label="state")]
    for state in states:
        with recipe.make() as loader, recipe.make() as control:
            for each in (loader, control):  # the same history before the load
                for _ in range(history):
                    list(each)
            before = loader.state_dict()
            try:
                loader.load_state_dict(state)
            except ValueError:
                event("refused")
                assert loader.state_dict() == before
                assert labels(loader) == labels(control)
                continue
            event("accepted" if state != valid else "accepted unchanged")
            assert labels(loader) == batches_of_state(recipe, state)


SAMPLERS = {
    "batches_rollover": lambda: BatchSampler(RandomSampler(11, seed=3), 3, "rollover"),
    "steps_rollover": lambda: ShardGroupSampler(
        BatchSampler(RandomSampler(13, seed=3), 2, "rollover"), 2, "rollover"
    ),
    "bucket_steps": lambda: FixedBucketSampler(
        [1 + i % 5 for i in range(17)], 3, num_buckets=3, shuffle=True, num_shards=2, seed=4
    ),
    "partition": lambda: PartitionSampler(BatchSampler(RandomSampler(14, seed=2), 3), 2, 1),
    "split": lambda: SplitSampler(15, 2, 1, seed=6),
}


def _agrees(mine, given):
    """Whether every field of ``mine`` (a state_dict) has the same value and type in
    ``given``; ``given`` may hold more."""
    if isinstance(mine, dict):
        return isinstance(given, dict) and all(
            key in given and _agrees(value, given[key]) for key, value in mine.items()
        )
    if isinstance(mine, list):
        return (
            isinstance(given, list)
            and len(mine) == len(given)
            and all(_agrees(a, b) for a, b in zip(mine, given))
        )
    return type(mine) is type(given) and mine == given


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(sorted(SAMPLERS)),
    passes=st.integers(0, 2),
    taken=st.integers(0, 4),
    data=st.data(),
)
def test_a_sampler_refuses_a_garbage_state_unchanged_or_takes_all_of_it(name, passes, taken, data):
    make = SAMPLERS[name]
    source = make()
    for _ in range(passes):
        list(source)
    valid = json.loads(json.dumps(source.state_dict()))
    state = data.draw(garbage(valid), label="state")

    sampler, twin = make(), make()
    passes_before = data.draw(st.integers(0, 2), label="passes_before")
    for each in (sampler, twin):
        for _ in range(passes_before):
            list(each)
    # A pass in progress, as when a loader is checkpointed in the middle of an epoch.
    running, running_twin = iter(sampler), iter(twin)
    for _ in range(taken):
        assert next(running, None) == next(running_twin, None)
    before = sampler.state_dict()
    try:
        sampler.load_state_dict(state)
    except ValueError:
        event("refused")
        assert sampler.state_dict() == before
        assert list(running) == list(running_twin)
        assert [list(sampler) for _ in range(2)] == [list(twin) for _ in range(2)]
        return
    event("accepted")
    assert _agrees(sampler.state_dict(), state)

    def indices(item):
        return [i for part in item for i in indices(part)] if isinstance(item, list) else [item]

    assert all(type(i) is int for i in indices(list(sampler) + list(sampler)))
