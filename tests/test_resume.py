"""Issue 7, points 3 and 4: mid-epoch checkpoint and resume.

One contract, checked for every backend: take ``k`` batches of epoch ``e``, save
``state_dict()`` as JSON, load it into a *new* loader (any ``num_workers``) and the new
loader yields exactly the rest of epoch ``e``, byte for byte, then the following epochs as if
nothing had happened.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from _datasets import RandomAugDataset, RangeDataset

from shardloader import ShardedDataLoader
from shardloader.sampler import BatchSampler, FixedBucketSampler, RandomSampler

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")

BACKENDS = {
    "inline": dict(num_workers=0),
    "thread2": dict(num_workers=2, thread_pool=True),
    "fork1": dict(num_workers=1, start_method="fork"),
    "fork2": dict(num_workers=2, start_method="fork"),
    "fork3": dict(num_workers=3, start_method="fork"),
    "spawn2": dict(num_workers=2, start_method="spawn"),
}
EPOCHS = 3


# ---------------------------------------------------------------------------- helpers


def leaves(batch):
    """Every array of a batch (a tuple of fields, or a list of shards), as numpy."""
    if isinstance(batch, (list, tuple)):
        return [leaf for item in batch for leaf in leaves(item)]
    return [batch.asnumpy() if hasattr(batch, "asnumpy") else np.asarray(batch)]


def fingerprint(batch):
    """A batch, down to its bytes: equal fingerprints mean byte-identical batches."""
    return tuple((a.dtype.str, a.shape, a.tobytes()) for a in leaves(batch))


_references: dict = {}


def uninterrupted(make, epochs=EPOCHS, **backend):
    """The batches of ``epochs`` epochs in one go (cached for inline loading: seeding every
    sample costs MXNet about a millisecond)."""
    key = getattr(make, "key", None)
    if key is not None and not backend and (key, epochs) in _references:
        return _references[key, epochs]
    with make(**backend) as loader:
        batches = [[fingerprint(b) for b in loader] for _ in range(epochs)]
    if key is not None and not backend:
        _references[key, epochs] = batches
    return batches


def take_and_save(make, epoch, k, **backend):
    """Run ``epoch`` full epochs and ``k`` batches of the next; return those batches and the
    state, after a JSON round trip."""
    with make(**backend) as loader:
        before = [[fingerprint(b) for b in loader] for _ in range(epoch)]
        it = iter(loader)
        before.append([fingerprint(next(it)) for _ in range(k)])
        state = json.loads(json.dumps(loader.state_dict()))
    return before, state


def resume(make, state, epochs, **backend):
    """A new loader, given ``state``: what its next ``epochs`` iterations yield."""
    with make(**backend) as loader:
        loader.load_state_dict(state)
        return [[fingerprint(b) for b in loader] for _ in range(epochs)]


def check_resume(make, epoch, k, before_backend, after_backend, epochs=EPOCHS):
    reference = uninterrupted(make, epochs)
    assert k <= len(reference[epoch])
    before, state = take_and_save(make, epoch, k, **before_backend)
    assert before[:epoch] == reference[:epoch]
    assert before[epoch] == reference[epoch][:k]
    assert state["epoch"] == epoch and state["consumed"] == k
    after = resume(make, state, epochs - epoch, **after_backend)
    assert after[0] == reference[epoch][k:], "the rest of the interrupted epoch differs"
    assert after[1:] == reference[epoch + 1 :], "the epochs after the resume differ"


def ranges(n=23, batch_size=4, last_batch="keep", seed=5):
    def make(**backend):
        return ShardedDataLoader(
            RangeDataset(n),
            batch_size=batch_size,
            shuffle=True,
            seed=seed,
            last_batch=last_batch,
            **backend,
        )

    make.key = ("ranges", n, batch_size, last_batch, seed)
    return make


def augmented(n=22, last_batch="keep"):
    def make(**backend):
        return ShardedDataLoader(
            RandomAugDataset(n),
            batch_size=4,
            shuffle=True,
            seed=9,
            last_batch=last_batch,
            **backend,
        )

    make.key = ("augmented", n, last_batch)
    return make


# ------------------------------------------------------------------ resume: inline first


# (epoch, k): the start, the middle and the end of an epoch. With 23 samples in batches of
# 4, 'rollover' carries 3 samples into epoch 1 and 2 into epoch 2, so stops in epoch 1 cut
# an epoch that begins with another epoch's samples.
STOPS = [(0, 0), (0, 2), (0, 5), (1, 0), (1, 1), (1, 4), (2, 3)]


@pytest.mark.parametrize("last_batch", ["keep", "discard", "rollover"])
@pytest.mark.parametrize("epoch,k", STOPS)
def test_resume_yields_the_rest_then_the_next_epochs(last_batch, epoch, k):
    make = ranges(last_batch=last_batch)
    if k > len(uninterrupted(make)[epoch]):
        pytest.skip("the epoch is shorter")
    check_resume(make, epoch, k, BACKENDS["inline"], BACKENDS["inline"])


@pytest.mark.parametrize(
    "before,after,last_batch",
    [
        ("inline", "fork2", "rollover"),
        ("fork2", "inline", "keep"),
        ("fork2", "inline", "rollover"),
        ("thread2", "fork3", "rollover"),
        ("fork3", "thread2", "keep"),
        ("fork1", "fork2", "discard"),
        ("fork2", "spawn2", "rollover"),
    ],
)
def test_resume_with_other_workers(before, after, last_batch):
    check_resume(ranges(last_batch=last_batch), 1, 2, BACKENDS[before], BACKENDS[after])


@pytest.mark.parametrize(
    "before,after", [("inline", "fork2"), ("fork3", "thread2"), ("thread2", "inline")]
)
@pytest.mark.parametrize("last_batch", ["discard", "rollover"])
def test_resume_reproduces_per_sample_randomness(before, after, last_batch):
    check_resume(augmented(last_batch=last_batch), 1, 3, BACKENDS[before], BACKENDS[after])


def test_resume_with_a_bucket_sampler():
    lengths = [1 + (5 * i) % 11 for i in range(40)]

    def make(**backend):
        sampler = FixedBucketSampler(lengths, 3, num_buckets=4, shuffle=True, seed=3)
        return ShardedDataLoader(RangeDataset(40), batch_sampler=sampler, seed=3, **backend)

    check_resume(make, 1, 5, BACKENDS["fork2"], BACKENDS["inline"])


def test_resume_with_sharded_steps():
    def make(**backend):
        return ShardedDataLoader(
            RandomAugDataset(30), batch_size=3, shuffle=True, seed=2, num_shards=2, **backend
        )

    check_resume(make, 0, 2, BACKENDS["fork2"], BACKENDS["thread2"])


@pytest.mark.parametrize(
    "extra",
    [dict(auto_reload=True), dict(pin_memory=True), dict(ctx="cpu1")],
    ids=["auto_reload", "pin_memory", "ctx"],
)
def test_resume_with_loading_ahead(extra):
    """auto_reload starts an epoch before iter(); pin_memory and ctx copy batches ahead on a
    thread. None of the batches loaded ahead may count as taken."""
    import mxnet as mx

    if extra.get("ctx") == "cpu1":
        extra = dict(ctx=mx.cpu(1))
    make = ranges(last_batch="rollover")
    reference = uninterrupted(make)
    before, state = take_and_save(make, 1, 1, **BACKENDS["fork2"], **extra)
    assert before[1] == reference[1][:1]
    assert (state["epoch"], state["consumed"]) == (1, 1)
    after = resume(make, state, 2, **BACKENDS["fork2"], **extra)
    assert after == [reference[1][1:], reference[2]]


def test_resume_of_one_part_in_distributed_training():
    def make(**backend):
        return ShardedDataLoader(
            RangeDataset(37),
            batch_size=3,
            shuffle=True,
            seed=2,
            num_parts=3,
            part_index=1,
            last_batch="rollover",
            **backend,
        )

    check_resume(make, 1, 2, BACKENDS["fork2"], BACKENDS["thread2"])


def test_a_set_epoch_loop_resumes_in_the_middle_of_the_epoch():
    """``for epoch in range(start, n): loader.set_epoch(epoch); for batch in loader: ...``
    must still start with the rest of the checkpointed epoch."""
    make = ranges(last_batch="rollover")
    reference = uninterrupted(make)
    _, state = take_and_save(make, 1, 2, **BACKENDS["fork2"])
    got = []
    with make(**BACKENDS["fork2"]) as loader:
        loader.load_state_dict(state)
        for epoch in range(state["epoch"], EPOCHS):
            loader.set_epoch(epoch)
            got.append([fingerprint(b) for b in loader])
    assert got == [reference[1][2:], reference[2]]


def test_state_after_a_finished_epoch_starts_the_next_one():
    make = ranges(last_batch="rollover")
    reference = uninterrupted(make)
    with make(**BACKENDS["fork2"]) as loader:
        assert [fingerprint(b) for b in loader] == reference[0]
        state = json.loads(json.dumps(loader.state_dict()))
    assert (state["epoch"], state["consumed"]) == (1, 0)
    assert resume(make, state, 2) == reference[1:]


def test_state_of_a_fresh_loader_starts_at_epoch_zero():
    make = ranges()
    with make() as loader:
        state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (0, 0)
    assert resume(make, state, EPOCHS, **BACKENDS["fork2"]) == uninterrupted(make)


def test_a_resumed_loader_can_be_checkpointed_again():
    make = ranges(last_batch="rollover")
    reference = uninterrupted(make, 4)
    _, state = take_and_save(make, 1, 1)
    with make(**BACKENDS["fork2"]) as loader:
        loader.load_state_dict(state)
        it = iter(loader)
        got = [fingerprint(next(it)) for _ in range(2)]
        state = json.loads(json.dumps(loader.state_dict()))
    assert got == reference[1][1:3]
    assert (state["epoch"], state["consumed"]) == (1, 3)
    assert resume(make, state, 3, **BACKENDS["thread2"]) == [reference[1][3:]] + reference[2:]


def test_resume_at_the_end_of_an_epoch_without_stop_iteration():
    """All batches taken but the epoch not yet seen to end: nothing is left of it."""
    make = ranges(last_batch="rollover")
    reference = uninterrupted(make)
    _, state = take_and_save(make, 1, len(reference[1]), **BACKENDS["fork2"])
    assert resume(make, state, 2) == [[], reference[2]]


class _EveryOtherBatch:
    """A user batch sampler with no set_epoch or state_dict: deterministic batches."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter([[i, i + 1] for i in range(0, self.n - 1, 2)][::-1])

    def __len__(self):
        return len(range(0, self.n - 1, 2))


@pytest.mark.parametrize("kind", ["gluon sampler", "user batch sampler"])
def test_a_sampler_without_state_dict_is_resumed_by_skipping(kind):
    from mxnet.gluon.data.sampler import SequentialSampler as GluonSequential

    def make(**backend):
        if kind == "gluon sampler":
            return ShardedDataLoader(
                RandomAugDataset(15), batch_size=4, sampler=GluonSequential(15), seed=4, **backend
            )
        return ShardedDataLoader(
            RandomAugDataset(15), batch_sampler=_EveryOtherBatch(15), seed=4, **backend
        )

    check_resume(make, 1, 2, BACKENDS["fork2"], BACKENDS["inline"])


# --------------------------------------------------------------- resume in a new process


def test_resume_in_a_new_process(tmp_path):
    n, loader_kwargs = 26, dict(batch_size=4, shuffle=True, seed=13, last_batch="rollover")

    def make(**backend):
        return ShardedDataLoader(RandomAugDataset(n), **loader_kwargs, **backend)

    reference = uninterrupted(make)
    _, state = take_and_save(make, 1, 2, **BACKENDS["thread2"])
    (tmp_path / "state.json").write_text(json.dumps(state))
    config = {
        "dataset": "RandomAugDataset",
        "dataset_args": [n],
        "loader": dict(loader_kwargs, num_workers=2),
        "state": str(tmp_path / "state.json"),
        "epochs": 2,
        "out": str(tmp_path / "rest.npz"),
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    script = os.path.join(SCRIPTS, "resume_child.py")
    done = subprocess.run(
        [sys.executable, script, str(tmp_path / "config.json")],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(tmp_path / "rest.npz") as saved:
        got = [[], []]
        for key in sorted(saved.files):
            epoch, batch, _ = (int(part[1:]) for part in key.split("_"))
            assert batch == len(got[epoch]), "batches are numbered without gaps"
            got[epoch].append(((saved[key].dtype.str, saved[key].shape, saved[key].tobytes()),))
    assert got == [reference[1][2:], reference[2]]


# ---------------------------------------------------------------------- the state itself


def test_prefetched_batches_are_not_counted():
    make = ranges(n=200, batch_size=2)
    reference = uninterrupted(make, 1)
    with make(num_workers=2, prefetch=8) as loader:
        it = iter(loader)
        assert fingerprint(next(it)) == reference[0][0]
        time.sleep(0.5)  # let the workers fill the prefetch window
        state = json.loads(json.dumps(loader.state_dict()))
    assert state["consumed"] == 1
    assert resume(make, state, 1, num_workers=2, prefetch=8) == [reference[0][1:]]


@pytest.mark.parametrize("backend", ["thread2", "fork2"])
def test_consumed_counts_what_the_user_took(backend):
    with ranges(n=40)(**BACKENDS[backend], prefetch=6) as loader:
        it = iter(loader)
        for k in range(1, 5):
            next(it)
            assert loader.state_dict()["consumed"] == k


def test_state_is_small_and_json_ready():
    lengths = [1 + i % 50 for i in range(10_000)]
    makers = {
        # Seeds on the samplers, not the loader: per-sample seeding of 10k samples would
        # cost seconds of MXNet engine time, and the state is the same size either way.
        "shuffle": lambda: ShardedDataLoader(
            RangeDataset(10_000),
            batch_size=32,
            sampler=RandomSampler(10_000, seed=1),
            last_batch="rollover",
        ),
        "bucket": lambda: ShardedDataLoader(
            RangeDataset(10_000),
            batch_sampler=FixedBucketSampler(lengths, 32, shuffle=True, seed=1),
        ),
    }
    for name, make in makers.items():
        with make() as loader:
            for _ in loader:  # a whole epoch, so that rollover has a carry
                pass
            it = iter(loader)
            for _ in range(5):
                next(it)
            text = json.dumps(loader.state_dict())
        assert len(text) < 2000, f"{name}: {len(text)} characters"
        assert json.loads(text)["consumed"] == 5


def test_state_does_not_depend_on_the_workers():
    states = []
    for backend in ["inline", "thread2", "fork1", "fork3"]:
        _, state = take_and_save(ranges(last_batch="rollover"), 1, 2, **BACKENDS[backend])
        states.append(state)
    assert all(s == states[0] for s in states[1:])


# ------------------------------------------------------------------- incompatible states


def _state(**kwargs):
    kwargs = kwargs or dict(batch_size=4, shuffle=True, seed=5)
    with ShardedDataLoader(RangeDataset(20), **kwargs) as loader:
        it = iter(loader)
        next(it)
        return json.loads(json.dumps(loader.state_dict()))


def _batches(seed=5):
    return BatchSampler(RandomSampler(20, seed=seed), 4, "keep")


def _buckets(seed=5):
    return FixedBucketSampler(range(1, 21), 4, num_buckets=2, shuffle=True, seed=seed)


SHUFFLED = dict(batch_size=4, shuffle=True, seed=5)
INCOMPATIBLE = {  # what the state was saved with, then the loader that must refuse it
    "dataset_len": lambda: (SHUFFLED, RangeDataset(21), SHUFFLED, "dataset_len|length"),
    "batch_size": lambda: (SHUFFLED, RangeDataset(20), dict(SHUFFLED, batch_size=5), "batch_size"),
    "seed": lambda: (SHUFFLED, RangeDataset(20), dict(SHUFFLED, seed=6), "seed"),
    "sampler_type": lambda: (
        dict(batch_sampler=_batches(), seed=5),
        RangeDataset(20),
        dict(batch_sampler=_buckets(), seed=5),
        "(?i)sampler",
    ),
    "shuffle": lambda: (SHUFFLED, RangeDataset(20), dict(SHUFFLED, shuffle=False), "(?i)sampler"),
    "last_batch": lambda: (
        SHUFFLED,
        RangeDataset(20),
        dict(SHUFFLED, last_batch="discard"),
        "last_batch",
    ),
}


@pytest.mark.parametrize("case", list(INCOMPATIBLE))
def test_incompatible_state_is_refused_when_loaded(case):
    saved_with, dataset, kwargs, field = INCOMPATIBLE[case]()
    state = _state(**saved_with)
    with ShardedDataLoader(dataset, **kwargs) as loader:
        reference = [fingerprint(b) for b in loader]
        loader.set_epoch(0)
        with pytest.raises(ValueError, match=field):
            loader.load_state_dict(state)
        # A refused state changes nothing: the loader goes on from where it was.
        assert [fingerprint(b) for b in loader] == reference


@pytest.mark.parametrize("state", [None, [], {}, {"version": 999}, {"version": True}, "epoch 3"])
def test_a_state_that_is_not_a_loader_state_is_refused(state):
    with ShardedDataLoader(RangeDataset(8), batch_size=2) as loader, pytest.raises(
        ValueError, match="state"
    ):
        loader.load_state_dict(state)


# ---------------------------------------------------------------- malformed states


def _rollover_loader(**backend):
    return ShardedDataLoader(
        RangeDataset(22), batch_size=4, shuffle=True, seed=5, last_batch="rollover", **backend
    )


def _valid_state():
    """A state in epoch 1 (which opens with 2 samples carried over from epoch 0), 2 batches
    in, of 6."""
    with _rollover_loader() as loader:
        list(loader)
        it = iter(loader)
        next(it), next(it)
        return json.loads(json.dumps(loader.state_dict()))


def _with(state, path, value):
    """A deep copy of ``state`` with the field at ``path`` set to ``value`` (or deleted)."""
    state = json.loads(json.dumps(state))
    *parents, last = path
    target = state
    for key in parents:
        target = target[key]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return state


_DELETE = object()
MALFORMED = {  # (path, value, what the message must say)
    "consumed_negative": (
        ["consumed"],
        -3,
        r"state\['consumed'\] must be a non-negative int, got -3",
    ),
    "consumed_str": (
        ["consumed"],
        "2",
        r"state\['consumed'\] must be a non-negative int, got '2' \(str\)",
    ),
    "consumed_float": (
        ["consumed"],
        2.0,
        r"state\['consumed'\] must be a non-negative int, got 2.0",
    ),
    "consumed_bool": (
        ["consumed"],
        True,
        r"state\['consumed'\] must be a non-negative int, got True",
    ),
    "consumed_past_the_epoch": (
        ["consumed"],
        10**6,
        r"state\['consumed'\] must be an int in \[0, 6\], the number of batches of epoch 1, "
        r"got 1000000",
    ),
    "consumed_one_past_the_epoch": (["consumed"], 7, r"in \[0, 6\].*got 7"),
    "epoch_str": (["epoch"], "1", r"state\['epoch'\] must be a non-negative int, got '1' \(str\)"),
    "epoch_none": (["epoch"], None, r"state\['epoch'\] must be a non-negative int, got None"),
    "epoch_other_than_the_samplers": (["epoch"], 2, r"state\['sampler'\]\['epoch'\] must be 2"),
    "missing_consumed": (["consumed"], _DELETE, r"lacks the field\(s\) \['consumed'\]"),
    "missing_sampler": (["sampler"], _DELETE, r"lacks the field\(s\) \['sampler'\]"),
    "missing_epoch": (["epoch"], _DELETE, r"lacks the field\(s\) \['epoch'\]"),
    "sampler_none": (["sampler"], None, r"state\['sampler'\] must be the state_dict\(\)"),
    "sampler_missing_carry": (["sampler", "carry"], _DELETE, r"missing 'carry'"),
    "sampler_offset": (["sampler", "offset"], 1, r"state\['sampler'\]\['offset'\] must be 0"),
    "carry_of_strings": (["sampler", "carry"], ["7"], r"'carry'\] must be a list of indices"),
    "carry_out_of_range": (["sampler", "carry"], [3, 22], r"carries index 22 into epoch 1"),
    "carry_too_long": (["sampler", "carry"], [0, 1, 2, 3], r"carry'\] holds 4 items"),
    "inner_seed_str": (
        ["sampler", "sampler", "seed"],
        "5",
        r"RandomSampler state_dict\['seed'\] must be an int, got '5'",
    ),
    "inner_seed_none": (["sampler", "sampler", "seed"], None, r"'seed'\] must be an int"),
    "inner_offset": (["sampler", "sampler", "offset"], 3, r"\['sampler'\]\['offset'\] must be 0"),
    "inner_length": (["sampler", "sampler", "length"], 21, r"length is 21 in the state but 22"),
    "seed_float": (["seed"], 5.0, r"seed is 5.0 in the state but 5 here"),
    "batch_size_bool": (["batch_size"], True, r"batch_size is True in the state but 4 here"),
}


def test_a_malformed_state_is_refused_naming_the_field_and_changes_nothing():
    valid = _valid_state()
    for case, (path, value, message) in MALFORMED.items():
        bad = _with(valid, path, value)
        with _rollover_loader() as loader, _rollover_loader() as control:
            for each in (loader, control):  # the same history: an epoch and one batch
                list(each)
                next(iter(each))
            before = loader.state_dict()
            try:
                loader.load_state_dict(bad)
            except ValueError as exc:
                assert re.search(message, str(exc)), f"{case}: {exc}"
            else:
                pytest.fail(f"{case}: the state was accepted")
            assert loader.state_dict() == before, case
            for _ in range(2):
                assert [fingerprint(b) for b in loader] == [fingerprint(b) for b in control], case


def test_a_refused_state_does_not_change_the_shuffle_seed():
    """The wrapped sampler's seed is loaded before the field that fails is checked: nothing
    may be applied, in the loader or in the sampler itself."""
    bad = _with(_with(_valid_state(), ["sampler", "sampler", "seed"], 99), ["sampler", "offset"], 9)
    with _rollover_loader() as loader, _rollover_loader() as control:
        list(loader), list(control)
        with pytest.raises(ValueError, match=r"offset"):
            loader.load_state_dict(bad)
        for _ in range(2):
            assert [fingerprint(b) for b in loader] == [fingerprint(b) for b in control]
    sampler, twin = (BatchSampler(RandomSampler(22, seed=5), 4, "rollover") for _ in range(2))
    list(sampler), list(twin)
    before = sampler.state_dict()
    with pytest.raises(ValueError, match=r"offset 9 is past the end of the epoch"):
        sampler.load_state_dict(bad["sampler"])
    assert sampler.state_dict() == before
    assert [list(sampler) for _ in range(2)] == [list(twin) for _ in range(2)]


def test_a_refused_state_leaves_an_epoch_in_progress_alone():
    good = _valid_state()
    make = ranges(n=22, last_batch="rollover")
    reference = uninterrupted(make, 2)
    with _rollover_loader(**BACKENDS["fork2"]) as loader:
        it = iter(loader)
        taken = [fingerprint(next(it)) for _ in range(2)]
        with pytest.raises(ValueError, match="consumed"):
            loader.load_state_dict(_with(good, ["consumed"], 99))
        taken += [fingerprint(b) for b in it]
        assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (1, 0)
        assert taken == reference[0]
        assert [fingerprint(b) for b in loader] == reference[1]


@pytest.mark.parametrize("consumed", [0, 3, 6])
def test_any_consumed_count_within_the_epoch_is_accepted(consumed):
    make = ranges(n=22, last_batch="rollover")
    reference = uninterrupted(make)
    state = _with(_valid_state(), ["consumed"], consumed)
    assert resume(make, state, 2) == [reference[1][consumed:], reference[2]]


def test_the_state_of_a_loader_over_an_empty_dataset_resumes():
    def make(**backend):
        return ShardedDataLoader(RangeDataset(0), batch_size=4, shuffle=True, seed=1, **backend)

    with make() as loader:
        list(loader)
        state = json.loads(json.dumps(loader.state_dict()))
    assert resume(make, state, 2, **BACKENDS["fork2"]) == [[], []]
    with make() as loader, pytest.raises(ValueError, match=r"in \[0, 0\].*got 1"):
        loader.load_state_dict(_with(state, ["consumed"], 1))


# ----------------------------------------------------------------- inside a training loop


def test_training_resumed_in_a_fresh_process_ends_with_the_same_weights(tmp_path):
    import mxnet as mx

    script = os.path.join(SCRIPTS, "train_resume.py")

    def start(mode):
        return subprocess.Popen(
            [sys.executable, script, mode, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def finish(proc):
        out, err = proc.communicate(timeout=90)
        return proc.returncode, err

    full, crash = start("full"), start("crash")
    code, err = finish(crash)
    assert code == 3, f"the crashing run should die at its checkpoint: {err[-3000:]}"
    code, err = finish(full)
    assert code == 0, err[-3000:]
    code, err = finish(start("resume"))
    assert code == 0, err[-3000:]

    state = json.loads((tmp_path / "ckpt.loader.json").read_text())
    assert (state["epoch"], state["consumed"]) == (1, 6)
    full = mx.nd.load(str(tmp_path / "full.params"))
    resumed = mx.nd.load(str(tmp_path / "resumed.params"))
    checkpoint = mx.nd.load(str(tmp_path / "ckpt.params"))
    assert sorted(full) == sorted(resumed)
    for name in full:
        assert np.array_equal(full[name].asnumpy(), resumed[name].asnumpy()), name
        assert not np.array_equal(full[name].asnumpy(), checkpoint[name].asnumpy()), name


@pytest.mark.timeout(60)
@pytest.mark.parametrize("after_an_epoch", [False, True])
def test_a_checkpoint_after_set_epoch_resumes_at_that_epoch(after_an_epoch):
    # set_epoch(e) says where the next iter() starts; a state_dict() taken before that iter()
    # must say so too, or a job restored from it would rerun the epoch before.
    loader = ShardedDataLoader(RangeDataset(20), batch_size=3, shuffle=True, seed=4)
    if after_an_epoch:
        list(loader)
    loader.set_epoch(5)
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (5, 0)
    expected = ShardedDataLoader(RangeDataset(20), batch_size=3, shuffle=True, seed=4)
    expected.set_epoch(5)
    resumed = ShardedDataLoader(RangeDataset(20), batch_size=3, shuffle=True, seed=4)
    resumed.load_state_dict(json.loads(json.dumps(state)))

    def labels(epoch_loader):
        return [batch[1].asnumpy().tolist() for batch in epoch_loader]

    for _ in range(2):  # epoch 5, then 6
        assert labels(resumed) == labels(expected)
    # An epoch in progress is what a checkpoint describes, whatever the next iter() will run.
    it = iter(loader)
    next(it)
    loader.set_epoch(9)
    assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (5, 1)
    it.close()
