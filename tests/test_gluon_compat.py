"""shardloader's loader is a Gluon ``DataLoader``: ``isinstance``, Gluon's attributes, and
MXNet's ``Estimator`` (which checks the type) all accept it."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from conftest import GLUON_PYTHON, MX2
from mxnet import gluon
from mxnet.gluon.contrib.estimator import Estimator
from mxnet.gluon.data import ArrayDataset

from shardloader import DataLoader

# Gluon's attributes in both versions, then those only one version's Gluon has.
GLUON_ATTRIBUTES = (
    "_dataset",
    "_num_workers",
    "_pin_memory",
    "_pin_device_id",
    "_thread_pool",
    "_timeout",
    "_prefetch",
) + (("_mx_iter",) if MX2 else ("auto_reload",))


def _data(n=64):
    rng = np.random.RandomState(0)
    return ArrayDataset(rng.rand(n, 4).astype("float32"), (np.arange(n) % 2).astype("float32"))


def test_it_is_a_gluon_dataloader():
    with DataLoader(_data(), batch_size=8) as loader:
        assert isinstance(loader, gluon.data.DataLoader)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"num_workers": 2, "pin_memory": True, "pin_device_id": 0, "prefetch": 3},
        {"num_workers": 2, "thread_pool": True, "timeout": 30},
    ],
)
def test_gluons_private_attributes_have_gluons_meaning(no_leaks, kwargs):
    data = _data()
    # Under 2.x, Gluon's Python pipeline: with try_nopython=None Gluon would use its C++ one,
    # and so would shardloader only with try_nopython=True (test_mx2_smoke.py).
    theirs = gluon.data.DataLoader(data, batch_size=8, **kwargs, **GLUON_PYTHON)
    with DataLoader(data, batch_size=8, **kwargs) as mine:
        for name in GLUON_ATTRIBUTES:
            assert getattr(mine, name) == getattr(theirs, name), name
        assert mine._worker_pool is None
        assert len(mine._batch_sampler) == len(theirs._batch_sampler)
        assert callable(mine._batchify_fn)
        assert mine._iter is None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_estimator_fit_and_evaluate(no_leaks, workers):
    net = gluon.nn.Dense(2)
    net.initialize(mx.init.Xavier())
    # MXNet 2.x moved the metrics to mx.gluon.metric and renamed Estimator's context=.
    metrics = mx.gluon.metric if MX2 else mx.metric
    placement = {"device": mx.cpu()} if MX2 else {"context": mx.cpu()}
    est = Estimator(
        net=net,
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        train_metrics=metrics.Accuracy(),
        trainer=gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5}),
        **placement,
    )
    train = DataLoader(_data(), batch_size=8, shuffle=True, num_workers=workers)
    val = DataLoader(_data(32), batch_size=8, num_workers=workers)
    with train, val:
        est.fit(train_data=train, val_data=val, epochs=3)
        est.evaluate(val_data=val)
    accuracy = dict(m.get() for m in est.val_metrics)
    assert any(name.endswith("accuracy") for name in accuracy), accuracy


def test_every_public_module_and_error_is_reachable_from_the_top_level():
    """docs/api.md lists these as public: each is an attribute of the package, and every
    public error derives from ShardLoaderError and is exported beside it."""
    import shardloader

    for name in ("batchify", "sampler", "prefetch", "dataiter", "recordio", "distributed"):
        assert name in shardloader.__all__ and getattr(shardloader, name).__name__.endswith(name)
    errors = [getattr(shardloader, n) for n in shardloader.__all__ if n.endswith("Error")]
    assert shardloader.RecordIOError in errors and shardloader.SharedMemoryError in errors
    assert len(errors) == 7
    assert all(issubclass(e, shardloader.ShardLoaderError) for e in errors)
