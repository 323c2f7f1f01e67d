"""Both Gluons: the smoke subset that CI runs under MXNet 2.0 (``make test-mx2-smoke``).

The tests marked ``mx2_smoke`` (all of this module, and a few elsewhere: the
fork-after-training scenario of tests/test_scenarios.py, seeding with warnings as errors in
tests/test_seeding.py, 2.x's extra dtypes, shape errors and C++ batchify handles in
tests/test_batchify_versions_and_errors.py, and others) cover, in about a minute: the loader against
Gluon's own batches with inline, thread and process workers (fork and spawn); each version's
default array type and default batchify (2.x's ``Stack`` splits list samples); a worker's
error; sharded steps; placement with ``ctx=`` and 2.x's ``device=``; mid-epoch resume; the
positional order of the installed Gluon; ``try_nopython``; and 2.x's sampler and batchify
names from ``mx.gluon.data``. They run under 1.9.1 too, as part of ``make test``; the ones only one
version can run say why.

Under 2.x the reference is Gluon's Python pipeline (``try_nopython=False``): with
``try_nopython=None`` Gluon 2.x silently switches qualifying loaders to its C++ pipeline,
which yields tuples and casts values to float32. shardloader does that only when asked,
with ``try_nopython=True`` (tested here against Gluon's C++ pipeline).

The last two tests keep the two environments' pins in step.
"""

from __future__ import annotations

import json
import os
import re

import mxnet as mx
import numpy as np
import pytest
from _backends import BACKENDS
from _datasets import FailingDataset, RangeDataset
from conftest import ARRAY_TYPE, GLUON_PYTHON, MX2, requires_mx1, requires_mx2, where
from mxnet.gluon.data import ArrayDataset, SimpleDataset
from mxnet.gluon.data import DataLoader as GluonDataLoader

from shardloader import ShardedDataLoader
from shardloader.prefetch import DevicePrefetcher
from shardloader.sampler import IntervalSampler, SequentialSampler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every test here is in the smoke run; each one that starts workers checks for leaks.
pytestmark = [pytest.mark.mx2_smoke, pytest.mark.timeout(120)]


def described(batch):
    """A comparable form of a batch: containers, array types, dtypes, shapes and values."""
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, [described(b) for b in batch])
    if isinstance(batch, mx.nd.NDArray):
        return (type(batch).__name__, str(batch.dtype), batch.shape, batch.asnumpy().tolist())
    return batch


def _dataset(n=23):
    return ArrayDataset(
        np.arange(n * 3, dtype="float32").reshape(n, 3), np.arange(n, dtype="int64") % 5
    )


# ------------------------------------------------------------------ Gluon's batches


# Every backend with last_batch='keep'; 'rollover' (the sampler's, in the main process) with
# one process backend: a spawned worker spends seconds importing MXNet for the same batches.
# The spawn case starts one worker, for the same reason: two workers' batches are put in order
# the same way whatever started them, as the fork case checks.
_ONE_SPAWNED = dict(num_workers=1, start_method="spawn")


@pytest.mark.parametrize(
    "backend, last_batch",
    [pytest.param(b, "keep", id=f"keep-{b}") for b in BACKENDS]
    + [pytest.param(b, "rollover", id=f"rollover-{b}") for b in ("inline", "thread", "fork")],
)
def test_same_batches_as_gluons_python_pipeline(backend, last_batch, no_leaks):
    data = _dataset()
    kwargs = dict(batch_size=5, shuffle=False, last_batch=last_batch)
    theirs = GluonDataLoader(data, **kwargs, **GLUON_PYTHON)
    length = len(theirs)  # before a rollover epoch changes it
    expected = [[described(b) for b in theirs] for _ in range(2)]
    kind = _ONE_SPAWNED if backend == "spawn" else BACKENDS[backend]
    with ShardedDataLoader(data, **kwargs, **kind) as loader:
        assert len(loader) == length
        got = [[described(b) for b in loader] for _ in range(2)]
    assert got == expected
    assert got[0][0][1][0][0] == ARRAY_TYPE.__name__  # the data field's array type


@pytest.mark.parametrize("backend", ["inline", "fork"])
def test_list_samples_are_batched_as_each_gluon_batches_them(backend, no_leaks):
    """Gluon 1.x's default stacks a list sample into one array; 2.x's (``batchify.Stack``)
    splits it into fields, as it does a tuple. shardloader's default follows the installed
    Gluon."""
    data = SimpleDataset([[i, i * 0.5] for i in range(7)])
    expected = [described(b) for b in GluonDataLoader(data, batch_size=3, **GLUON_PYTHON)]
    with ShardedDataLoader(data, batch_size=3, **BACKENDS[backend]) as loader:
        got = [described(b) for b in loader]
    assert got == expected
    assert got[0][0] == ("list" if MX2 else ARRAY_TYPE.__name__)


@pytest.mark.parametrize("backend", ["inline", "fork"])
def test_pin_memory_gives_pinned_arrays_of_the_default_type(backend, no_leaks):
    with ShardedDataLoader(_dataset(), batch_size=8, pin_memory=True, **BACKENDS[backend]) as ld:
        for data, label in ld:
            assert isinstance(data, ARRAY_TYPE) and isinstance(label, ARRAY_TYPE)
            assert where(data) == where(label) == mx.cpu_pinned(0)


@requires_mx2("numpy semantics by default, whose Gluon Stack refuses legacy mx.nd samples")
@pytest.mark.parametrize("backend", ["inline", "fork"])
def test_legacy_ndarray_samples_become_arrays_of_the_default_type(backend, no_leaks):
    data = ArrayDataset(mx.nd.arange(12).reshape(6, 2), np.arange(6))
    with ShardedDataLoader(data, batch_size=4, **BACKENDS[backend]) as loader:
        (x, y), (x2, _) = list(loader)
    assert type(x) is type(y) is mx.np.ndarray
    assert x.asnumpy().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]] and x2.shape == (2, 2)


@pytest.mark.parametrize("backend", ["thread", "fork"])
def test_a_workers_error_arrives_with_its_type_and_the_loader_goes_on(backend, no_leaks):
    with ShardedDataLoader(FailingDataset(12, bad=5), batch_size=4, **BACKENDS[backend]) as ld:
        it = iter(ld)
        assert [int(v) for v in next(it)[1].asnumpy()] == [0, 1, 2, 3]
        with pytest.raises(KeyError, match="sample 5 is broken"):
            next(it)
    with ShardedDataLoader(RangeDataset(12), batch_size=4, **BACKENDS[backend]) as ld:
        assert len(list(ld)) == 3


# ------------------------------------------------------------------ shards and devices


@pytest.mark.parametrize("backend", ["inline", "fork"])
def test_sharded_steps_cover_the_epoch_once(backend, no_leaks):
    with ShardedDataLoader(
        RangeDataset(24), batch_size=3, num_shards=2, shuffle=True, seed=1, **BACKENDS[backend]
    ) as loader:
        steps = list(loader)
    assert len(steps) == len(loader) == 4
    ids = []
    for step in steps:
        assert isinstance(step, list) and len(step) == 2
        for data, label in step:
            assert isinstance(data, ARRAY_TYPE)
            assert data.shape == (3, 4)
            ids += [int(v) for v in label.asnumpy()]
    assert sorted(ids) == list(range(24))


@pytest.mark.parametrize("name", ["ctx", "device"])
@pytest.mark.parametrize("backend", ["inline", "fork"])
def test_shard_i_is_placed_on_device_i(backend, name, no_leaks):
    """``device=`` is MXNet 2.x's name for ``ctx=``; both work under either version."""
    devices = [mx.cpu(0), mx.cpu(1)]
    with ShardedDataLoader(
        RangeDataset(16), batch_size=4, num_shards=2, **{name: devices}, **BACKENDS[backend]
    ) as loader:
        steps = list(loader)
    assert len(steps) == 2
    for step in steps:
        for i, (data, label) in enumerate(step):
            assert isinstance(data, ARRAY_TYPE)
            assert where(data) == where(label) == devices[i]


def test_device_and_ctx_are_one_argument(no_leaks):
    with pytest.raises(ValueError, match="ctx and device are two names for one argument"):
        ShardedDataLoader(RangeDataset(4), batch_size=2, ctx=mx.cpu(0), device=mx.cpu(1))
    with pytest.raises(ValueError, match=r"num_shards=3 but device has 2 devices"):
        ShardedDataLoader(RangeDataset(8), batch_size=2, num_shards=3, device=[mx.cpu(0)] * 2)
    with pytest.raises(TypeError, match=r"device\[1\] must be an mxnet"):
        ShardedDataLoader(RangeDataset(8), batch_size=2, num_shards=2, device=[mx.cpu(), "gpu"])
    with DevicePrefetcher(device=mx.cpu(1)).prefetch([[mx.nd.ones((2,))]]) as it:
        assert [where(a) for a in next(it)] == [mx.cpu(1)]
    with pytest.raises(ValueError, match="two names for one argument"):
        DevicePrefetcher(mx.cpu(0), device=mx.cpu(1))


# ------------------------------------------------------------------ resume


def _fingerprints(loader, epochs):
    out = []
    for _ in range(epochs):
        out.append([tuple(a.asnumpy().tobytes() for a in batch) for batch in loader])
    return out


@pytest.mark.parametrize("backend", ["inline", "fork"])
def test_resume_mid_epoch_in_a_new_loader(backend, no_leaks):
    kwargs = dict(batch_size=4, shuffle=True, seed=3, **BACKENDS[backend])
    with ShardedDataLoader(RangeDataset(30), **kwargs) as loader:
        whole = _fingerprints(loader, 2)
    with ShardedDataLoader(RangeDataset(30), **kwargs) as loader:
        it = iter(loader)
        first = [tuple(a.asnumpy().tobytes() for a in next(it)) for _ in range(3)]
        state = json.loads(json.dumps(loader.state_dict()))
    assert first == whole[0][:3]
    with ShardedDataLoader(RangeDataset(30), **kwargs) as resumed:
        resumed.load_state_dict(state)
        rest = _fingerprints(resumed, 2)
    assert rest == [whole[0][3:], whole[1]]


# ------------------------------------------------------------------ Gluon's signature


def test_positional_arguments_follow_the_installed_gluon():
    # dataset, batch_size, shuffle, sampler, last_batch, batch_sampler, batchify_fn,
    # num_workers, pin_memory, pin_device_id, prefetch, thread_pool, timeout, then the 14th:
    # 1.x's auto_reload, 2.x's try_nopython.
    args = (RangeDataset(6), 3, False, None, "keep", None, None, 0, False, 0, None, False, 120)
    with ShardedDataLoader(*args, False) as loader:
        assert len(list(loader)) == 2
        assert loader._opts.auto_reload is False
        assert loader._opts.try_nopython is (False if MX2 else None)
    with ShardedDataLoader(*args, True) as loader:
        if MX2:  # try_nopython=True without workers: ignored, as in Gluon
            assert loader._opts.try_nopython is True and loader._mx_iter is None
        else:
            assert loader._opts.auto_reload is True
    # After those, 1.x's signature (and so shardloader's) has try_nopython as the 15th; 2.x's
    # has nothing more.
    more = (False,) if MX2 else (False, None)
    with ShardedDataLoader(*args, *more) as loader:
        assert len(list(loader)) == 2
    with pytest.raises(TypeError, match="positional argument"):
        ShardedDataLoader(*args, *more, None)
    with ShardedDataLoader(RangeDataset(6), batch_size=3, auto_reload=True) as loader:
        assert loader.auto_reload is True  # a keyword in both


def test_it_is_a_gluon_dataloader_down_to_its_destructor(no_leaks):
    loader = ShardedDataLoader(_dataset(), batch_size=4, num_workers=2)
    assert isinstance(loader, GluonDataLoader)
    assert len(list(loader)) == 6
    assert loader._worker_pool is None and loader._mx_iter is None
    GluonDataLoader.__del__(loader)  # Gluon's own destructor runs on it without error
    loader.close()


# ------------------------------------------------------------------ try_nopython


@requires_mx1("try_nopython=True: 2.x has a C++ pipeline")
def test_try_nopython_true_says_this_mxnet_has_no_cpp_pipeline():
    with pytest.raises(ValueError, match=f"MXNet {re.escape(mx.__version__)} does not have"):
        ShardedDataLoader(_dataset(), batch_size=4, num_workers=2, try_nopython=True)


@requires_mx2("try_nopython=True and Gluon's C++ pipeline, new in 2.x")
@pytest.mark.parametrize("kwargs", [dict(), dict(last_batch="discard"), dict(pin_memory=True)])
def test_try_nopython_true_gives_gluons_cpp_batches_where_gluon_uses_it(kwargs, no_leaks):
    data = _dataset()
    theirs = GluonDataLoader(data, batch_size=5, num_workers=2, try_nopython=True, **kwargs)
    assert theirs._mx_iter is not None
    expected = [described(b) for b in theirs]
    with ShardedDataLoader(data, batch_size=5, num_workers=2, try_nopython=True, **kwargs) as ld:
        assert ld._mx_iter is not None and len(ld) == len(theirs)
        got = [[described(b) for b in ld] for _ in range(2)]
        first = next(iter(ld))
    assert got == [expected, expected]
    assert type(first) is tuple and first[1].dtype == np.float32  # the C++ conventions
    where_expected = mx.cpu_pinned(0) if kwargs.get("pin_memory") else mx.cpu(0)
    assert where(first[0]) == where_expected


def _gluon_refusal(dataset, **kwargs):
    with pytest.raises(RuntimeError) as info:
        GluonDataLoader(dataset, num_workers=2, try_nopython=True, **kwargs)
    return str(info.value)


@requires_mx2("try_nopython=True and Gluon's C++ pipeline, new in 2.x")
@pytest.mark.parametrize(
    "case",
    [
        dict(dataset=RangeDataset(8), batch_size=4),  # a dataset without a C++ counterpart
        dict(batch_size=4, batchify_fn=lambda samples: samples),  # a Python batchify
        dict(batch_sampler=[[0, 1], [2, 3]]),  # a batch sampler that is not Gluon's
    ],
    ids=["dataset", "batchify_fn", "batch_sampler"],
)
def test_try_nopython_true_raises_gluons_error_where_gluon_does(case):
    case = dict(case)
    dataset = case.pop("dataset", _dataset())
    message = _gluon_refusal(dataset, **case)
    assert message.startswith("MXNet backend loader compatibility: [dataset - ")
    with pytest.raises(RuntimeError) as info:
        ShardedDataLoader(dataset, num_workers=2, try_nopython=True, **case)
    assert str(info.value) == message


@requires_mx2("try_nopython=True and Gluon's C++ pipeline, new in 2.x")
def test_try_nopython_true_without_workers_is_ignored_as_in_gluon(no_leaks):
    data = SimpleDataset(list(range(7)))  # no C++ counterpart: would raise with workers
    expected = [described(b) for b in GluonDataLoader(data, batch_size=3, try_nopython=True)]
    with ShardedDataLoader(data, batch_size=3, try_nopython=True) as loader:
        assert loader._mx_iter is None
        assert [described(b) for b in loader] == expected


@requires_mx2("try_nopython=True and Gluon's C++ pipeline, new in 2.x")
def test_try_nopython_true_refuses_what_the_cpp_pipeline_cannot_do(no_leaks):
    data = _dataset()
    with pytest.raises(ValueError, match=r"cannot honour seed=1, num_shards=2; drop them"):
        ShardedDataLoader(
            data, batch_size=4, num_workers=2, try_nopython=True, seed=1, num_shards=2
        )
    loader = ShardedDataLoader(data, batch_size=4, num_workers=2, try_nopython=True)
    with loader, pytest.raises(RuntimeError, match=r"state_dict\(\) needs shardloader's own"):
        loader.state_dict()
    # device= (ctx=) still places the C++ pipeline's batches.
    with ShardedDataLoader(
        data, batch_size=4, num_workers=2, try_nopython=True, device=mx.cpu(1)
    ) as loader:
        assert {where(a) for batch in loader for a in batch} == {mx.cpu(1)}


@requires_mx2("try_nopython, new in 2.x")
def test_try_nopython_none_keeps_shardloaders_workers(no_leaks):
    data = _dataset()
    assert GluonDataLoader(data, batch_size=5, num_workers=2)._mx_iter is not None  # Gluon
    with ShardedDataLoader(data, batch_size=5, num_workers=2) as loader:
        assert loader._mx_iter is None
        first = next(iter(loader))
        assert loader.worker_pids()  # shardloader's own worker processes
    assert type(first) is list and first[1].dtype == np.int64  # Gluon's Python pipeline's


# ------------------------------------------------------------------ 2.x's names


@requires_mx2("mx.gluon.data.IntervalSampler and mx.gluon.data.batchify, new in 2.x")
@pytest.mark.filterwarnings("ignore:Using Pad with NDArrays is discouraged")
def test_gluon_2x_samplers_and_batchify_functions_work_with_the_loader(no_leaks):
    from mxnet.gluon.data import IntervalSampler as GluonInterval
    from mxnet.gluon.data import batchify as gluon_batchify

    data = SimpleDataset([(np.arange(i % 4 + 1), i) for i in range(13)])
    fn = gluon_batchify.Group(gluon_batchify.Pad(val=-1), gluon_batchify.Stack())
    kwargs = dict(batch_size=4, batchify_fn=fn)
    expected = [described(b) for b in GluonDataLoader(data, sampler=GluonInterval(13, 3), **kwargs)]
    for sampler in (GluonInterval(13, 3), IntervalSampler(13, 3)):
        with ShardedDataLoader(data, sampler=sampler, num_workers=2, **kwargs) as loader:
            assert [described(b) for b in loader] == expected


def test_interval_sampler_has_gluons_order_in_either_version():
    gluon_interval = getattr(mx.gluon.data, "IntervalSampler", None)
    if gluon_interval is None:  # 1.x: in gluon.contrib
        from mxnet.gluon.contrib.data import IntervalSampler as gluon_interval
    assert list(IntervalSampler(10, 4)) == list(gluon_interval(10, 4))
    with ShardedDataLoader(RangeDataset(10), batch_size=3, sampler=IntervalSampler(10, 4)) as ld:
        assert [y.asnumpy().tolist() for _, y in ld] == [[0, 4, 8], [1, 5, 9], [2, 6, 3], [7]]
    assert isinstance(SequentialSampler(2), mx.gluon.data.Sampler)


# ------------------------------------------------------------- the two environments' pins


def _pins(name):
    with open(os.path.join(ROOT, name)) as f:
        lines = [line.split("#", 1)[0].strip() for line in f]
    return dict(line.split("==", 1) for line in lines if line)


def test_the_mx2_constraints_are_the_default_ones_but_for_mxnet():
    default, mx2 = _pins("constraints.txt"), _pins("constraints-mx2.txt")
    assert default.pop("mxnet") == "1.9.1"
    assert mx2.pop("mxnet") == "2.0.0b1"
    assert mx2 == default, "constraints-mx2.txt must pin what constraints.txt pins"


def test_the_mxnet_requirement_admits_both_pins():
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    (spec,) = [Requirement(r).specifier for r in project["dependencies"] if r.startswith("mxnet")]
    for version in ("1.9.1", "2.0.0b1"):
        assert spec.contains(version, prereleases=True), (spec, version)
    # The MXNet 2.0 environment installs test-core: gluoncv and gluon-nlp import only under 1.x.
    core = project["optional-dependencies"]["test-core"]
    assert not [r for r in core if re.match(r"gluon(cv|nlp)\b", r)]
