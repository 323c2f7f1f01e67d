"""Scenario 9: the program forks after training on shardloader's batches.

A small Conv2D net trains for an epoch on shardloader's batches (worker processes, or
inline), in a function that does not wait for MXNet, with the loader left open. Right after
it, the program does what many training scripts do: it evaluates with Gluon's own
``DataLoader(num_workers=2)`` (which forks its workers); after another epoch it computes
something with a ``multiprocessing.Pool(2)``. Both must work (no hang in ``fork``) and give
the right answers, and training with shardloader must go on afterwards.

    python tests/scenarios/fork_after.py --workers process|inline|thread
"""

from __future__ import annotations

import multiprocessing
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import Blobs, Scenario, check  # noqa: E402


def pool_task(i):
    """Runs in a Pool worker: numpy only."""
    a = np.arange(i + 1, dtype=np.float64)
    return float((a * a).sum()), os.getpid()


def epoch(net, trainer, loader):
    """One epoch in a function, without waiting for MXNet at any step: when it returns, its
    batches are gone from Python while MXNet may still be computing on them."""
    from mxnet import autograd, gluon

    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses = []
    for data, target in loader:
        with autograd.record():
            loss = loss_fn(net(data), target)
        loss.backward()
        trainer.step(data.shape[0])
        losses.append(loss.mean())  # kept as NDArrays: read later
    return losses


def mean(losses):
    return _common.scalar(sum(losses)) / len(losses)


def main() -> None:
    args = _common.parser(__doc__).parse_args()
    with Scenario(f"fork_after[{args.workers}]", args.start_method) as sc:
        from mxnet import gluon
        from mxnet.gluon.data import DataLoader as GluonLoader

        from shardloader import DataLoader

        shape = _common.IMAGE_SHAPE
        train_ds, val_ds = Blobs(192, seed=1, shape=shape), Blobs(40, seed=2, shape=shape)
        net = _common.conv_classifier()
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
        loader = DataLoader(
            train_ds,
            batch_size=16,
            shuffle=True,
            seed=0,
            **_common.worker_kwargs(args.workers, args.start_method),
        )
        first = epoch(net, trainer, loader)
        sc.phase("epoch 0 with shardloader: queued")

        # Gluon's DataLoader forks two workers right away, while MXNet may still be
        # computing on batches of the epoch that just ended (Python has dropped them).
        sc.phase("Gluon DataLoader(num_workers=2): starting")
        gluon_loader = GluonLoader(val_ds, batch_size=16, num_workers=2)
        got = [[d.asnumpy(), t.asnumpy()] for d, t in gluon_loader]
        want = [[val_ds.images[i : i + 16], val_ds.labels[i : i + 16]] for i in range(0, 40, 16)]
        _common.same_batches(got, want, "Gluon's batches after training")
        correct = sum(
            int((net(mx_array(d)).argmax(axis=1) == mx_array(t)).asnumpy().sum()) for d, t in got
        )
        sc.phase(f"Gluon DataLoader: {len(got)} batches, {correct}/40 correct")
        del gluon_loader

        second = epoch(net, trainer, loader)
        sc.phase("epoch 1 with shardloader: queued")
        # A Pool forks two processes, again while MXNet may still be busy.
        sc.phase("multiprocessing.Pool(2): starting")
        with multiprocessing.get_context("fork").Pool(2) as pool:
            results = pool.map(pool_task, range(16))
        del pool  # a terminated Pool keeps its pipes open until it is collected
        check(
            [r[0] for r in results] == [float((np.arange(i + 1.0) ** 2).sum()) for i in range(16)],
            f"Pool results are wrong: {results}",
        )
        check(all(pid != os.getpid() for _, pid in results), "Pool ran the tasks in-process")
        sc.phase(f"Pool: 16 tasks on {len({pid for _, pid in results})} processes")

        first, second = mean(first), mean(second)
        sc.phase(f"mean loss with shardloader: epoch 0 {first:.4f}, epoch 1 {second:.4f}")
        check(second < first, f"training did not go on: loss {first:.4f} then {second:.4f}")
        # The loader still works after the forks.
        third = mean(epoch(net, trainer, loader))
        sc.phase(f"epoch 2 with shardloader: mean loss {third:.4f}")
        loader.close()


def mx_array(a):
    return _common.array(a)


if __name__ == "__main__":
    main()
