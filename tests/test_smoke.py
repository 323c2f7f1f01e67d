"""Does this install work? ``make test-smoke``: a few end-to-end checks under the default
MXNet 1.9.1 set-up, in well under a minute.

Each test drives the real loader as a training script would: inline, thread and process
workers against Gluon's own ``DataLoader`` batch for batch, an error raised in a worker
process, sharded steps placed on two CPU contexts (stand-ins for two GPUs), and a mid-epoch
resume from a checkpoint that went through JSON. The whole suite (``make test``) covers the
same ground in depth; these are the tests marked ``smoke``.
"""

from __future__ import annotations

import json

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon.data import ArrayDataset
from mxnet.gluon.data import DataLoader as GluonDataLoader

from shardloader import ShardedDataLoader

pytestmark = [pytest.mark.smoke, pytest.mark.timeout(60)]

WORKERS = {
    "inline": dict(num_workers=0),
    "thread": dict(num_workers=2, thread_pool=True),
    "process": dict(num_workers=2),
}


def _dataset(n: int = 30) -> ArrayDataset:
    features = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
    return ArrayDataset(features, np.arange(n, dtype=np.int64))


class _Broken:
    """Sample ``bad`` raises; the others are their index."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.bad:
            raise ValueError(f"sample {i} is broken")
        return np.float32(i)


def _arrays(batches):
    return [[a.asnumpy().tolist() for a in batch] for batch in batches]


@pytest.mark.parametrize("workers", list(WORKERS))
def test_the_same_batches_as_gluons_loader(workers, no_leaks):
    data = _dataset()
    expected = _arrays(GluonDataLoader(data, batch_size=7, last_batch="keep"))
    with ShardedDataLoader(data, batch_size=7, last_batch="keep", **WORKERS[workers]) as loader:
        for _ in range(2):  # a second epoch reuses the workers
            batches = list(loader)
            assert all(isinstance(a, mx.nd.NDArray) for batch in batches for a in batch)
            assert _arrays(batches) == expected


def test_a_workers_error_reaches_the_loop_and_the_loader_goes_on(no_leaks):
    with ShardedDataLoader(_Broken(12, bad=5), batch_size=4, num_workers=2) as loader:
        it = iter(loader)
        assert next(it).asnumpy().tolist() == [0, 1, 2, 3]
        with pytest.raises(ValueError, match="sample 5 is broken"):
            next(it)
        # The workers survive their sample's error: the next epoch starts as usual.
        assert next(iter(loader)).asnumpy().tolist() == [0, 1, 2, 3]


def test_sharded_steps_on_two_cpu_contexts(no_leaks):
    devices = [mx.cpu(0), mx.cpu(1)]
    with ShardedDataLoader(
        _dataset(24), batch_size=3, num_shards=2, ctx=devices, shuffle=True, seed=1, num_workers=2
    ) as loader:
        steps = list(loader)
    assert len(steps) == 4
    seen = []
    for step in steps:
        assert len(step) == 2
        for device, (data, label) in zip(devices, step):
            assert data.context == label.context == device
            assert data.shape == (3, 4)
            seen += label.asnumpy().tolist()
    assert sorted(seen) == list(range(24))


def test_resume_mid_epoch_from_a_json_checkpoint(no_leaks):
    kwargs = dict(batch_size=4, shuffle=True, seed=3, num_workers=2)
    with ShardedDataLoader(_dataset(), **kwargs) as loader:
        whole = [_arrays(loader) for _ in range(2)]
    with ShardedDataLoader(_dataset(), **kwargs) as loader:
        it = iter(loader)
        first = _arrays(next(it) for _ in range(3))
        state = json.loads(json.dumps(loader.state_dict()))
    assert first == whole[0][:3]
    with ShardedDataLoader(_dataset(), **kwargs) as resumed:
        resumed.load_state_dict(state)
        rest = [_arrays(resumed) for _ in range(2)]
    assert rest == [whole[0][3:], whole[1]]
