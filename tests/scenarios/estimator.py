"""Scenario 5: ``Estimator.fit`` and ``Estimator.evaluate`` (mxnet.gluon.contrib.estimator).

A small Conv2D classifier is trained with Gluon's Estimator for two epochs, validating after
each, then evaluated, with shardloader's loaders (two worker processes by default); then the
same with Gluon's own loaders. The training and validation metrics of every epoch and the
final weights must agree.

    python tests/scenarios/estimator.py [--workers inline|thread|process]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
from _common import Blobs, Scenario, check  # noqa: E402

BATCH, EPOCHS = 16, 2


def run(loader_cls, kwargs, sc, what):
    import mxnet as mx
    from mxnet import gluon
    from mxnet.gluon.contrib.estimator import Estimator
    from mxnet.gluon.contrib.estimator.event_handler import EpochEnd

    train_loader = loader_cls(Blobs(88, seed=1), batch_size=BATCH, **kwargs)  # ragged: 8
    val_loader = loader_cls(Blobs(40, seed=2), batch_size=BATCH, **kwargs)

    net = _common.small_convnet()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9})
    # MXNet 2.x moved the metrics to mx.gluon.metric and renamed Estimator's context=.
    metric = mx.gluon.metric if _common.mxnet_2() else mx.metric
    est = Estimator(
        net=net,
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        train_metrics=metric.Accuracy(),
        val_metrics=metric.Accuracy(),
        trainer=trainer,
        **{"device" if _common.mxnet_2() else "context": mx.cpu()},
    )
    history = []

    class Record(EpochEnd):
        def epoch_end(self, estimator, *args, **kwargs):
            values = [m.get() for m in estimator.train_metrics + estimator.val_metrics]
            history.append([v for _, v in values])
            sc.phase(f"{what}: epoch end: {values}")

    est.fit(train_data=train_loader, val_data=val_loader, epochs=EPOCHS, event_handlers=[Record()])
    est.evaluate(val_data=val_loader)
    final = [v for _, v in (m.get() for m in est.val_metrics)]
    sc.phase(f"{what}: evaluate: {final}")
    params = _common.params_numpy(net)
    for loader in (train_loader, val_loader):
        if hasattr(loader, "close"):
            loader.close()
    return history, final, params


def main() -> None:
    args = _common.parser(__doc__).parse_args()
    with Scenario(f"estimator[{args.workers}]", args.start_method) as sc:
        from mxnet.gluon.data import DataLoader as GluonLoader

        from shardloader import DataLoader

        theirs = run(GluonLoader, _common.gluon_worker_kwargs(args.workers), sc, "Gluon")
        ours = run(
            DataLoader, _common.worker_kwargs(args.workers, args.start_method), sc, "shardloader"
        )
        check(len(ours[0]) == EPOCHS, f"{len(ours[0])} epochs recorded, expected {EPOCHS}")
        _common.close_trajectories(
            [v for epoch in ours[0] for v in epoch],
            [v for epoch in theirs[0] for v in epoch],
            "metrics per epoch (ours vs Gluon)",
        )
        _common.close_trajectories(ours[1], theirs[1], "evaluate() metrics (ours vs Gluon)")
        _common.compare_params(ours[2], theirs[2], "final weights (ours vs Gluon)")
        check(ours[1][-1] > 0.8, f"the net did not learn: val accuracy {ours[1]}")


if __name__ == "__main__":
    main()
