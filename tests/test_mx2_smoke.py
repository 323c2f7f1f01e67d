"""Both Gluons: the smoke subset that CI runs under MXNet 2.0 (``make test-mx2-smoke``).

The tests marked ``mx2_smoke`` cover the loader against Gluon's own batches, inline, thread
and process workers (fork and spawn), a worker's error, sharded steps, per-device placement
and mid-epoch resume, in well under a minute. They run under 1.9.1 too, as part of
``make test``. Under 2.x the reference is Gluon's Python pipeline (``try_nopython=False``):
with ``try_nopython=None`` Gluon 2.x silently switches qualifying loaders to its C++
pipeline, which yields tuples and casts integer labels to float32.

The last two tests keep the two environments' pins in step.
"""

from __future__ import annotations

import json
import os
import re

import mxnet as mx
import numpy as np
import pytest
from _datasets import FailingDataset, RangeDataset
from conftest import MX2
from mxnet.gluon.data import ArrayDataset
from mxnet.gluon.data import DataLoader as GluonDataLoader

from shardloader import ShardedDataLoader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every test here is in the smoke run; each one that starts workers checks for leaks.
pytestmark = [pytest.mark.mx2_smoke, pytest.mark.timeout(120)]

BACKENDS = {
    "inline": dict(num_workers=0),
    "thread": dict(num_workers=2, thread_pool=True),
    "fork": dict(num_workers=2, start_method="fork"),
    "spawn": dict(num_workers=2, start_method="spawn"),
}
# Gluon's Python pipeline under either version (1.9.1 has no try_nopython).
GLUON_PYTHON = {"try_nopython": False} if MX2 else {}
# The array type of batches by default: 2.x turns numpy semantics on at import.
ARRAY_TYPE = mx.np.ndarray if MX2 else mx.nd.NDArray


def _device_support() -> bool:
    """Whether shardloader accepts this MXNet's device objects as ``ctx`` (2.x made
    ``mx.Context`` a deprecated function, so ``isinstance(x, mx.Context)`` raises)."""
    from shardloader._device import normalize_ctx

    try:
        normalize_ctx(mx.cpu(0))
    except TypeError:
        return False
    return True


needs_device_support = pytest.mark.xfail(
    not _device_support(),
    raises=TypeError,
    strict=True,
    reason="shardloader._device.normalize_ctx tests isinstance(ctx, mx.Context), a function "
    "in MXNet 2.x: use mx.device.Device there",
)


def _where(array) -> str:
    return str(array.device if MX2 else array.context)


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


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("last_batch", ["keep", "rollover"])
def test_same_batches_as_gluons_python_pipeline(backend, last_batch, no_leaks):
    data = _dataset()
    kwargs = dict(batch_size=5, shuffle=False, last_batch=last_batch)
    theirs = GluonDataLoader(data, **kwargs, **GLUON_PYTHON)
    length = len(theirs)  # before a rollover epoch changes it
    expected = [[described(b) for b in theirs] for _ in range(2)]
    with ShardedDataLoader(data, **kwargs, **BACKENDS[backend]) as loader:
        assert len(loader) == length
        got = [[described(b) for b in loader] for _ in range(2)]
    assert got == expected
    assert got[0][0][1][0][0] == ARRAY_TYPE.__name__  # the data field's array type


@pytest.mark.parametrize("backend", ["inline", "fork"])
def test_pin_memory_gives_pinned_arrays_of_the_default_type(backend, no_leaks):
    with ShardedDataLoader(_dataset(), batch_size=8, pin_memory=True, **BACKENDS[backend]) as ld:
        for data, label in ld:
            assert isinstance(data, ARRAY_TYPE) and isinstance(label, ARRAY_TYPE)
            assert _where(data) == _where(label) == str(mx.cpu_pinned(0))


@pytest.mark.parametrize("backend", ["thread", "fork"])
def test_a_workers_error_arrives_with_its_type_and_the_loader_goes_on(backend, no_leaks):
    with ShardedDataLoader(FailingDataset(12, bad=5), batch_size=4, **BACKENDS[backend]) as ld:
        it = iter(ld)
        assert [int(v) for v in next(it)[1].asnumpy()] == [0, 1, 2, 3]
        with pytest.raises(KeyError, match="sample 5 is broken"):
            next(it)
    with ShardedDataLoader(RangeDataset(12), batch_size=4, **BACKENDS[backend]) as ld:
        assert len(list(ld)) == 3


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


@needs_device_support
@pytest.mark.parametrize("backend", ["inline", "fork"])
def test_shard_i_is_placed_on_ctx_i(backend, no_leaks):
    ctxs = [mx.cpu(0), mx.cpu(1)]
    with ShardedDataLoader(
        RangeDataset(16), batch_size=4, num_shards=2, ctx=ctxs, **BACKENDS[backend]
    ) as loader:
        steps = list(loader)
    assert len(steps) == 2
    for step in steps:
        for i, (data, label) in enumerate(step):
            assert isinstance(data, ARRAY_TYPE)
            assert _where(data) == _where(label) == str(ctxs[i])


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
