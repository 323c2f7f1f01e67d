"""Scenario 4: ``Module.fit`` with ``eval_data``, fed by loaders through DataIter adapters.

A symbolic MLP is trained with ``mx.mod.Module.fit`` for several epochs, validating after
each, from ``shardloader.dataiter.LoaderDataIter`` over shardloader's DataLoader (two
worker processes), or from ``PrefetchingIter(LoaderDataIter(loader))``. The same program
then trains from Gluon's DataLoader through the same adapters; the validation accuracy of
every epoch, the batches seen and the final weights must agree.

    python tests/scenarios/module_fit.py --iter loader|prefetching [--epochs 3]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import Scenario, check  # noqa: E402

BATCH = 32


class Clusters:
    """Three Gaussian clusters in 4-d: (features, class)."""

    def __init__(self, n: int, seed: int) -> None:
        centres = np.random.default_rng(99).normal(size=(3, 4)) * 3
        rng = np.random.default_rng(seed)
        self.y = rng.integers(0, 3, size=n)
        self.x = (centres[self.y] + rng.normal(size=(n, 4))).astype("float32")

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], np.float32(self.y[i])


def symbol():
    import mxnet as mx

    net = mx.sym.Variable("data")
    net = mx.sym.FullyConnected(net, num_hidden=16, name="fc1")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.FullyConnected(net, num_hidden=3, name="fc2")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def initial_params():
    import mxnet as mx

    rng = np.random.default_rng(7)
    shapes = {"fc1_weight": (16, 4), "fc1_bias": (16,), "fc2_weight": (3, 16), "fc2_bias": (3,)}
    return {k: mx.nd.array(rng.normal(scale=0.3, size=s)) for k, s in shapes.items()}


def fit(loader_cls, kwargs, prefetching, epochs, sc, what):
    import mxnet as mx

    from shardloader.dataiter import LoaderDataIter, PrefetchingIter

    train_loader = loader_cls(Clusters(150, 1), batch_size=BATCH, **kwargs)  # 22 left over
    val_loader = loader_cls(Clusters(50, 2), batch_size=BATCH, **kwargs)
    train = LoaderDataIter(train_loader, batch_size=BATCH)
    val = LoaderDataIter(val_loader, batch_size=BATCH)
    if prefetching:
        train, val = PrefetchingIter(train), PrefetchingIter(val)

    batches = []  # (epoch, nbatch) of every training batch
    val_acc = []

    def on_batch(param):
        batches.append((param.epoch, param.nbatch))

    def on_eval(param):
        val_acc.append(dict(param.eval_metric.get_name_value())["accuracy"])
        sc.phase(f"{what}: epoch {param.epoch}: val accuracy {val_acc[-1]:.3f}")

    mod = mx.mod.Module(symbol(), context=mx.cpu())
    mod.fit(
        train,
        eval_data=val,
        eval_metric="acc",
        num_epoch=epochs,
        optimizer="sgd",
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        arg_params=initial_params(),
        aux_params={},
        batch_end_callback=on_batch,
        eval_end_callback=on_eval,
    )
    score = dict(mod.score(val, "acc"))["accuracy"]
    arg_params, _ = mod.get_params()
    params = {k: v.asnumpy() for k, v in sorted(arg_params.items())}
    for it in (train, val):
        it.close()
    for loader in (train_loader, val_loader):
        if hasattr(loader, "close"):
            loader.close()
    return batches, val_acc, score, params


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--iter", choices=["loader", "prefetching"], default="loader")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    with Scenario(f"module_fit[{args.iter}]", args.start_method) as sc:
        from mxnet.gluon.data import DataLoader as GluonLoader

        from shardloader import DataLoader

        prefetching = args.iter == "prefetching"
        ours_kw = _common.worker_kwargs(args.workers, args.start_method)
        gluon_kw = _common.gluon_worker_kwargs(args.workers)
        ours = fit(DataLoader, ours_kw, prefetching, args.epochs, sc, "shardloader")
        theirs = fit(GluonLoader, gluon_kw, prefetching, args.epochs, sc, "Gluon")
        expected = [(e, b) for e in range(args.epochs) for b in range(5)]
        check(ours[0] == expected, f"training batches (epoch, nbatch): {ours[0]}")
        check(theirs[0] == expected, f"Gluon training batches (epoch, nbatch): {theirs[0]}")
        _common.close_trajectories(ours[1], theirs[1], "val accuracy per epoch (ours vs Gluon)")
        _common.close_trajectories([ours[2]], [theirs[2]], "final score (ours vs Gluon)")
        _common.compare_params(ours[3], theirs[3], "final weights (ours vs Gluon)")
        check(ours[2] > 0.8, f"the model did not learn: final val accuracy {ours[2]}")


if __name__ == "__main__":
    main()
