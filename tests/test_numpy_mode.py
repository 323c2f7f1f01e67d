"""Under ``npx.set_np()`` batches are ``mx.np.ndarray``, as Gluon's are, in every mode."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from _backends import backends
from conftest import GLUON_PYTHON, where
from mxnet import autograd, gluon
from mxnet.gluon.data import ArrayDataset

from shardloader import DataLoader
from shardloader._engine.ipc.alloc import numpy_flags, set_numpy_flags
from shardloader.batchify import Pad, Stack, Tuple

MODES = backends("inline", "thread", "process")  # Gluon takes them too


@pytest.fixture
def np_mode():
    """Numpy semantics on for the test, then as they were: off under 1.x, on under 2.x,
    which turns them on at import."""
    before = numpy_flags()
    mx.npx.set_np()
    try:
        yield
    finally:
        set_numpy_flags(before)


def _dataset(n=24):
    x = np.random.RandomState(0).rand(n, 3, 4, 4).astype("float32")
    return ArrayDataset(x, np.arange(n) % 5)


def _legacy_batchify(samples):
    xs, ys = zip(*samples)
    return mx.nd.array(np.stack(xs)), mx.nd.array(ys)


def _describe(batch):
    return [(type(a), a.dtype, a.shape) for a in batch]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("pin_memory", [False, True])
def test_batches_have_gluons_array_type(np_mode, no_leaks, mode, pin_memory):
    data = _dataset()
    kwargs = dict(batch_size=8, pin_memory=pin_memory, **MODES[mode])
    reference = gluon.data.DataLoader(data, **kwargs, **GLUON_PYTHON)
    expected = list(reference)
    del reference  # terminates Gluon's worker pool
    with DataLoader(data, **kwargs) as loader:
        got = list(loader)
    assert len(got) == len(expected) == 3
    for mine, theirs in zip(got, expected):
        assert type(mine) is type(theirs)
        assert _describe(mine) == _describe(theirs)
        for a, b in zip(mine, theirs):
            assert isinstance(a, mx.np.ndarray)
            if pin_memory:
                assert where(a) == where(b)  # else Gluon's workers say cpu_shared
            np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(MODES))
def test_ctx_placement_and_sharded_steps_keep_numpy_arrays(np_mode, no_leaks, mode):
    data = _dataset(32)
    ctx = [mx.cpu(0), mx.cpu(1)]
    with DataLoader(data, batch_size=4, num_shards=2, ctx=ctx, **MODES[mode]) as loader:
        steps = list(loader)
    assert len(steps) == 4
    for step in steps:
        for shard, device in zip(step, ctx):
            for array in shard:
                assert isinstance(array, mx.np.ndarray)
                assert where(array) == device
    with DataLoader(data, batch_size=8, ctx=mx.cpu(1), **MODES[mode]) as loader:
        x, y = next(iter(loader))
    assert isinstance(x, mx.np.ndarray) and where(x) == mx.cpu(1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(MODES))
def test_a_user_batchify_that_returns_ndarrays_keeps_its_type(np_mode, no_leaks, mode):
    """Gluon passes a user's legacy NDArrays through unchanged, in numpy mode too."""
    data = _dataset()
    kwargs = dict(batch_size=8, batchify_fn=_legacy_batchify, **MODES[mode])
    reference = gluon.data.DataLoader(data, **kwargs, **GLUON_PYTHON)
    theirs = next(iter(reference))
    del reference
    with DataLoader(data, **kwargs) as loader:
        mine = next(iter(loader))
    assert [type(a) for a in mine] == [type(a) for a in theirs] == [mx.nd.NDArray] * 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(MODES))
def test_shardloaders_batchify_functions_follow_numpy_mode(np_mode, no_leaks, mode):
    lengths = [3, 5, 2, 4, 6, 1, 2, 3]
    data = [(np.ones(n, "float32"), n) for n in lengths]
    fn = Tuple(Pad(pad_val=-1), Stack())
    with DataLoader(data, batch_size=4, batchify_fn=fn, **MODES[mode]) as loader:
        for padded, n in loader:
            assert isinstance(padded, mx.np.ndarray) and isinstance(n, mx.np.ndarray)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(MODES))
def test_a_numpy_mode_net_trains_on_the_batches(np_mode, no_leaks, mode):
    data = _dataset(64)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu"), gluon.nn.Dense(5))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses = []
    with DataLoader(data, batch_size=16, shuffle=True, seed=0, **MODES[mode]) as loader:
        for _ in range(8):
            total = 0.0
            for x, y in loader:
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                trainer.step(x.shape[0])
                total += float(loss.mean())
            losses.append(total)
    assert losses[-1] < losses[0]


def test_legacy_mode_is_untouched_by_a_numpy_mode_loader(no_leaks):
    """Workers take the mode from when the loader was made; the caller's mode stays."""
    before = numpy_flags()  # legacy under 1.x, numpy under 2.x: restored for later tests
    try:
        mx.npx.set_np()
        loader = DataLoader(_dataset(), batch_size=8, num_workers=2, thread_pool=True)
        mx.npx.reset_np()
        with loader:
            x, _ = next(iter(loader))
        assert isinstance(x, mx.np.ndarray)
        assert not mx.util.is_np_array()
    finally:
        set_numpy_flags(before)
