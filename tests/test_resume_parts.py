"""Issue 29, item 3: a job checkpointed mid-epoch on P machines resumes on Q.

For random datasets, batch sizes, samplers (shuffled or not, a bucket sampler cut by batches,
gluon-nlp's SplitSampler), old and new machine counts from 1 to 4, and a random number of
batches consumed on each old machine: the batches the old machines took before the stop and
those the new machines yield after loading the merged job state are the batches of the old
job's epoch, each once (with ``even_size``, each at least once and every new machine yields
as many), and the next epoch of every new machine is a fresh loader's with the new count.
The new machines are stopped and merged again, onto a third count, with the same result.
The whole program (tests/scripts/resume_parts.py as dist_sync jobs on 2 hosts, then 3, then 1)
runs on the network-namespace lab: tests/test_multihost.py.
"""

from __future__ import annotations

import collections
import json

import mxnet as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardloader import DataLoader
from shardloader.distributed import merge_states
from shardloader.sampler import FixedBucketSampler, SplitSampler

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:Some buckets are empty"),
]


class Recipe:
    """Builds the loader of machine ``part_index`` of ``num_parts``."""

    def __init__(self, kind, n, batch_size, shuffle, seed, last_batch, even_size, num_shards):
        self.kind, self.n, self.batch_size, self.shuffle = kind, n, batch_size, shuffle
        self.seed, self.last_batch, self.even_size = seed, last_batch, even_size
        self.num_shards = num_shards
        self.lengths = (np.arange(n) * 7919 % 13 + 1).tolist()

    def __repr__(self):
        return f"Recipe({self.__dict__})"

    def fits(self, num_parts):
        """Whether the loaders of ``num_parts`` machines can be built (``even_size`` needs
        an item per part)."""
        if self.kind == "bucket":
            return not self.even_size or len(self._bucket()) >= num_parts
        return self.n >= num_parts if self.even_size or self.kind == "split" else True

    def _bucket(self):
        return FixedBucketSampler(
            self.lengths, self.batch_size, num_buckets=3, shuffle=self.shuffle, seed=self.seed
        )

    def make(self, num_parts, part_index):
        data = np.arange(self.n, dtype="float32")
        parts = dict(num_parts=num_parts, part_index=part_index, even_size=self.even_size)
        common = dict(seed=self.seed, num_shards=self.num_shards)
        if self.kind == "bucket":
            return DataLoader(data, batch_sampler=self._bucket(), **parts, **common)
        if self.kind == "split":
            sampler = SplitSampler(
                self.n,
                num_parts,
                part_index,
                even_size=self.even_size,
                shuffle=self.shuffle,
                seed=self.seed,
            )
            return DataLoader(
                data, self.batch_size, sampler=sampler, last_batch=self.last_batch, **common
            )
        return DataLoader(
            data,
            self.batch_size,
            shuffle=self.shuffle,
            last_batch=self.last_batch,
            **parts,
            **common,
        )


def key(batch):
    """A batch or a step as a tuple of sample values."""
    if isinstance(batch, (list, tuple)):
        return tuple(key(b) for b in batch)
    return tuple(int(v) for v in batch.asnumpy().tolist())


@st.composite
def recipes(draw):
    kind = draw(st.sampled_from(["plain", "plain", "bucket", "split"]))
    return Recipe(
        kind=kind,
        n=draw(st.integers(1, 40)),
        batch_size=draw(st.integers(1, 4)),
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        last_batch=draw(st.sampled_from(["keep", "discard"])),
        even_size=draw(st.booleans()),
        num_shards=draw(st.sampled_from([0, 0, 2])) if kind != "bucket" else 0,
    )


def stop(recipe, num_parts, epoch, draw_consumed, job=None):
    """Run ``num_parts`` machines into ``epoch`` (from ``job`` if given), each taking a
    drawn number of batches; return the batches taken, every machine's whole epoch as the
    uninterrupted machine would yield it, and the merged job state (through JSON)."""
    taken, whole, states = [], [], []
    for rank in range(num_parts):
        with recipe.make(num_parts, rank) as loader, recipe.make(num_parts, rank) as twin:
            if job is None:
                loader.set_epoch(epoch)
                twin.set_epoch(epoch)
            else:
                loader.load_state_dict(job)
                twin.load_state_dict(job)
            full = [key(b) for b in twin]
            k = draw_consumed(len(full))
            it = iter(loader)
            mine = [key(next(it)) for _ in range(k)]
            assert mine == full[:k]
            taken += mine
            whole.append(full)
            states.append(json.loads(json.dumps(loader.state_dict())))
    return taken, whole, merge_states(states[::-1])


def check_exactly_once(recipe, epoch_batches, before, after, repeats, equal):
    """``before + after`` are ``epoch_batches``, each once; with ``even_size``, each at
    least once, with at most ``repeats`` more, and shares of equal length if ``equal``."""
    expected = collections.Counter(epoch_batches)
    served = collections.Counter(before) + collections.Counter(b for share in after for b in share)
    if not recipe.even_size:
        assert served == expected
        return
    assert set(served) == set(expected)
    assert sum((served - expected).values()) <= repeats
    if equal and recipe.kind != "split":
        assert len({len(share) for share in after}) == 1


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    recipe=recipes(),
    counts=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
    epoch=st.integers(0, 2),
    data=st.data(),
)
def test_a_job_resumes_on_any_number_of_machines(recipe, counts, epoch, data):
    if not all(recipe.fits(c) for c in counts):
        return
    consumed = lambda total: data.draw(st.integers(0, total))  # noqa: E731
    before, whole, job = stop(recipe, counts[0], epoch, consumed)
    epoch_batches = [b for part in whole for b in part]
    started, repeats = bool(before), 0
    for previous, num_parts in zip(counts, counts[1:]):
        # The new machines take some of their shares, and are stopped in turn.
        taken, shares, job = stop(recipe, num_parts, epoch, consumed, job=job)
        if started:
            # even_size pads each share to the same length: at most one repeat a machine.
            repeats += num_parts if num_parts != previous else 0
            equal = num_parts != previous
            check_exactly_once(recipe, epoch_batches, before, shares, repeats, equal)
        else:
            # Stopped before any batch of the epoch: it runs as the new count's epoch.
            fresh = [
                [key(b) for b in fresh_epoch(recipe, num_parts, r, epoch)] for r in range(num_parts)
            ]
            assert shares == fresh
            epoch_batches = [b for part in shares for b in part]
        before += taken
        started = bool(before)
    # Then every machine of the last count goes on with its own next epoch.
    for rank in range(counts[-1]):
        with recipe.make(counts[-1], rank) as loader:
            loader.load_state_dict(job)
            list(loader)
            nxt = [key(b) for b in loader]
        assert nxt == [key(b) for b in fresh_epoch(recipe, counts[-1], rank, epoch + 1)]


def fresh_epoch(recipe, num_parts, part_index, epoch):
    with recipe.make(num_parts, part_index) as loader:
        loader.set_epoch(epoch)
        return list(loader)


def test_the_same_count_resumes_each_machine_from_its_own_state():
    recipe = Recipe("plain", 30, 3, True, 7, "keep", False, 0)
    taken, whole, job = stop(recipe, 2, 1, lambda total: total // 3)
    for rank in range(2):
        with recipe.make(2, rank) as loader:
            loader.load_state_dict(job)
            assert [key(b) for b in loader] == whole[rank][len(whole[rank]) // 3 :]


def test_a_job_stopped_at_the_start_of_an_epoch_runs_the_new_counts_epoch():
    recipe = Recipe("plain", 30, 3, True, 7, "keep", False, 0)
    _, _, job = stop(recipe, 2, 2, lambda total: 0)
    with recipe.make(3, 1) as loader, recipe.make(3, 1) as fresh:
        loader.load_state_dict(job)
        fresh.set_epoch(2)
        assert [key(b) for b in loader] == [key(b) for b in fresh]


def test_a_machine_that_ended_the_epoch_is_merged_with_the_others():
    recipe = Recipe("plain", 30, 3, False, 7, "keep", False, 0)
    states = []
    with recipe.make(2, 0) as done, recipe.make(2, 1) as busy:
        list(done)
        states.append(done.state_dict())  # epoch 1, batch 0
        next(iter(busy))
        states.append(busy.state_dict())  # epoch 0, batch 1
    job = merge_states(states)
    assert (job["epoch"], job["num_parts"]) == (0, 2)
    with recipe.make(1, 0) as loader:
        loader.load_state_dict(job)
        rest = [v for b in loader for v in key(b)]
    assert rest == list(range(18, 30))  # machine 1's part, less its first batch


def test_one_machines_state_is_a_job_state():
    recipe = Recipe("plain", 20, 2, True, 3, "keep", False, 0)
    with recipe.make(1, 0) as loader:
        it = iter(loader)
        taken = [key(next(it)) for _ in range(4)]
        state = loader.state_dict()
    rest = []
    for rank in range(3):
        with recipe.make(3, rank) as loader:
            loader.load_state_dict(state)
            rest += [key(b) for b in loader]
    assert sorted(v for b in taken + rest for v in b) == list(range(20))


@pytest.mark.usefixtures("no_leaks")
def test_a_share_checkpointed_again_resumes_with_process_workers():
    make = _plain(num_workers=2)
    job = merge_states(_states(_plain(), 2, take=2))
    with make(3, 1) as loader, _plain()(3, 1) as twin:
        loader.load_state_dict(job)
        twin.load_state_dict(job)
        share = [key(b) for b in twin]
        it = iter(loader)
        assert [key(next(it)) for _ in range(2)] == share[:2]
        state = json.loads(json.dumps(loader.state_dict()))
    assert state["resumed_from"] == job and state["consumed"] == 2
    with make(3, 1) as loader:
        loader.load_state_dict(state)
        assert [key(b) for b in loader] == share[2:]
        assert "resumed_from" not in loader.state_dict()


def _states(make, num_parts, take=1):
    states = []
    for rank in range(num_parts):
        with make(num_parts, rank) as loader:
            it = iter(loader)
            for _ in range(take):
                next(it)
            states.append(loader.state_dict())
    return states


def _plain(**kwargs):
    def make(num_parts, rank):
        args = dict(batch_size=2, shuffle=True, seed=1, num_parts=num_parts, part_index=rank)
        args.update(kwargs)
        return DataLoader(np.arange(20, dtype="float32"), **args)

    return make


@pytest.mark.parametrize(
    "make, message",
    [
        (_plain(last_batch="rollover"), "without rollover: the BatchSampler's last_batch="),
        (
            _plain(num_shards=2, last_batch="rollover"),
            "without rollover: the ShardGroupSampler's last_group=",
        ),
        (
            lambda p, r: DataLoader(
                np.arange(20, dtype="float32"),
                batch_sampler=mx.gluon.data.BatchSampler(mx.gluon.data.SequentialSampler(20), 2),
                num_parts=p,
                part_index=r,
            ),
            "the BatchSampler in this loader's batch sampler has none",
        ),
    ],
    ids=["rollover", "step-rollover", "gluon-sampler"],
)
def test_what_cannot_be_shared_exactly_is_refused_with_the_reason(make, message):
    job = merge_states(_states(make, 2))
    with make(3, 0) as loader:
        before = loader.state_dict()
        with pytest.raises(ValueError, match=message):
            loader.load_state_dict(job)
        assert loader.state_dict() == before
    with make(2, 1) as loader, make(2, 1) as twin:  # the same count replays nothing
        loader.load_state_dict(job)
        assert [key(b) for b in loader] == [key(b) for b in twin][1:]


def test_one_machines_state_of_several_is_refused_on_another_count():
    states = _states(_plain(), 2)
    message = r"machine 1's of a job on 2 .*merge_states"
    with _plain()(3, 0) as loader, pytest.raises(ValueError, match=message):
        loader.load_state_dict(states[1])


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda s: s[:1], ValueError, r"states of parts \[1\] are missing"),
        (lambda s: [s[0], s[0]], ValueError, "both for part 0"),
        (lambda s: s[0], TypeError, "non-empty list"),
        (lambda s: [], TypeError, "non-empty list"),
        (lambda s: [s[0], {**s[1], "seed": 2}], ValueError, "seed is 2 there but 1"),
        (lambda s: [s[0], {**s[1], "epoch": 3}], ValueError, "machine 1 is at batch 1 of epoch 3"),
        (lambda s: [s[0], {**s[1], "version": 9}], ValueError, r"states\[1\] must be a dict"),
        (lambda s: s + _states(_plain(), 3)[:1], ValueError, "different numbers of machines"),
    ],
    ids=["missing", "twice", "a-dict", "empty", "other-loader", "epochs", "version", "counts"],
)
def test_merging_checks_the_states(change, error, message):
    with pytest.raises(error, match=message):
        merge_states(change(_states(_plain(), 2)))


def test_a_damaged_job_state_is_refused_and_changes_nothing():
    job = merge_states(_states(_plain(), 2))
    with _plain()(3, 2) as loader:
        before = loader.state_dict()
        for damaged, message in [
            ({**job, "epoch": 5}, r"state\['epoch'\] is 5, but its parts say 0"),
            ({**job, "version": 2}, "must be a job state from"),
            (
                {**job, "parts": [job["parts"][0], {**job["parts"][1], "consumed": 99}]},
                r"state\['parts'\]\[1\]\['consumed'\] must be an int in \[0, 5\]",
            ),
        ]:
            with pytest.raises(ValueError, match=message):
                loader.load_state_dict(damaged)
            assert loader.state_dict() == before
