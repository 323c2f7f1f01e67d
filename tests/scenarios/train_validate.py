"""Scenario 1: train -> validate -> train, the most common training loop.

A train loader and a val loader are made up front, a small Conv2D net is trained for one
epoch with a gluon.Trainer, the val loader is iterated, and training goes on. The same
program then runs with Gluon's own DataLoader, and both must give the same losses, the same
validation results and the same final weights.

    python tests/scenarios/train_validate.py --workers inline|thread|process
                                             [--start-method fork|spawn|forkserver]
                                             [--num-workers N]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import Blobs, Scenario, check  # noqa: E402

BATCH = 32
# 96 images of 3x32x32 float32 are 1.2 MB, above the 1 MiB floor of shardloader's buffer pool
# (docs/design.md, invariant 10): inline and in threads, validation batches reuse the memory
# of batches MXNet has released, while the training steps before them may still be running.
VAL_BATCH = 96
EPOCHS = 2  # train, validate, train, validate
LOG_INTERVAL = 50  # batches between progress lines, as training scripts log


def train_epoch(net, trainer, loss_fn, loader, sc, label):
    """One epoch, written as most scripts write it: a function whose batch variables go
    away when it returns, logging every LOG_INTERVAL batches, so that nothing waits for
    MXNet in between and its engine is still busy with the last steps when it returns."""
    from mxnet import autograd

    losses = []
    for i, (data, target) in enumerate(loader):
        with autograd.record():
            loss = loss_fn(net(data), target)
        loss.backward()
        trainer.step(data.shape[0])
        losses.append(loss.mean())  # read at the end of the program
        if i % LOG_INTERVAL == 0:
            sc.phase(f"{label}: batch {i}: loss {_common.scalar(losses[-1]):.4f}")
    return losses


def validate(net, loss_fn, loader, keep_batches):
    total, correct, seen = 0.0, 0, 0
    for data, target in loader:
        output = net(data)
        total += _common.scalar(loss_fn(output, target).sum())
        correct += int((output.argmax(axis=1) == target).asnumpy().sum())
        seen += data.shape[0]
        if keep_batches is not None:
            keep_batches.append([data.asnumpy(), target.asnumpy()])
    return total / seen, correct / seen, seen


def run(loader_cls, kwargs, sc, label):
    import mxnet as mx
    from mxnet import gluon

    # 200 validation samples: two pooled batches and a ragged last one.
    train_ds, val_ds = (
        Blobs(192, seed=1, shape=_common.IMAGE_SHAPE),
        Blobs(200, seed=2, shape=_common.IMAGE_SHAPE),
    )
    order = np.random.default_rng(5).permutation(len(train_ds)).tolist()
    train_loader = loader_cls(train_ds, batch_size=BATCH, sampler=order, **kwargs)
    val_loader = loader_cls(val_ds, batch_size=VAL_BATCH, **kwargs)

    net = _common.conv_classifier()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    train_losses, val_results, val_batches = [], [], []
    for epoch in range(EPOCHS):
        sc.phase(f"{label}: epoch {epoch}: training")
        train_losses += train_epoch(net, trainer, loss_fn, train_loader, sc, label)
        # The first iter(val_loader) starts its workers (a fork) right now, while MXNet
        # still computes on the last training batches.
        sc.phase(f"{label}: epoch {epoch}: validating")
        loss, acc, seen = validate(net, loss_fn, val_loader, val_batches if epoch == 0 else None)
        check(seen == len(val_ds), f"{label}: validation saw {seen} of {len(val_ds)} samples")
        val_results.append((loss, acc))
        sc.phase(f"{label}: epoch {epoch}: val loss {loss:.4f} acc {acc:.3f}")
    mx.nd.waitall()
    params = _common.params_numpy(net)
    del train_loader, val_loader
    return [_common.scalar(v) for v in train_losses], val_results, val_batches, params


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument(
        "--num-workers", type=int, default=2, help="shardloader's workers (threads or processes)"
    )
    args = p.parse_args()
    name = f"train_validate[{args.workers}"
    name += f",{args.start_method}]" if args.workers == "process" else "]"
    with Scenario(name, args.start_method) as sc:
        from mxnet.gluon.data import DataLoader as GluonLoader

        from shardloader import DataLoader

        kwargs = _common.worker_kwargs(args.workers, args.start_method, args.num_workers)
        ours = run(DataLoader, kwargs, sc, "ours")
        gluon = run(GluonLoader, _common.gluon_worker_kwargs(args.workers), sc, "gluon")
        _common.close_trajectories(ours[0], gluon[0], "training losses (ours vs Gluon)")
        _common.close_trajectories(
            [v for pair in ours[1] for v in pair],
            [v for pair in gluon[1] for v in pair],
            "validation loss/accuracy (ours vs Gluon)",
        )
        _common.same_batches(ours[2], gluon[2], "validation batches (ours vs Gluon)")
        _common.compare_params(ours[3], gluon[3], "final weights (ours vs Gluon)")
        check(ours[1][-1][1] > 0.5, f"the net did not learn: val accuracy {ours[1][-1][1]}")


if __name__ == "__main__":
    main()
