"""Scenario 3: a numpy-mode program (``mx.npx.set_np()``).

In numpy mode Gluon's DataLoader returns ``mx.np.ndarray`` batches, and numpy-mode blocks
expect them. The program trains a small numpy-mode net from shardloader and from Gluon's
loader, plain, with ``pin_memory=True`` and with ``ctx=mx.cpu(1)`` (Gluon: ``as_in_context``),
and checks that the batches have Gluon's type, context and values and that the losses agree.

    python tests/scenarios/numpy_mode.py --workers inline|thread|process
                                         [--start-method fork|spawn|forkserver]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import Scenario, check  # noqa: E402

N, BATCH = 60, 16  # a ragged last batch of 12


def make_data():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(N, 5)).astype("float32")
    y = (x @ rng.normal(size=(5,)).astype("float32")).astype("float32")
    return x, y


def train(loader, place, ctx, what):
    """One epoch of a numpy-mode Dense net; returns (losses, batches as numpy)."""
    import mxnet as mx
    from mxnet import autograd, gluon

    net = gluon.nn.Dense(1, in_units=5)
    net.initialize(mx.init.Constant(0.1), ctx)  # positional: 2.x calls it device
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    loss_fn = gluon.loss.L2Loss()
    losses, batches = [], []
    for b, (x, y) in enumerate(loader):
        for name, arr in (("data", x), ("label", y)):
            check(
                isinstance(arr, mx.np.ndarray),
                f"{what}: batch {b} {name} is {type(arr).__module__}.{type(arr).__name__}, "
                f"not mx.np.ndarray (Gluon's loader gives mx.np.ndarray in numpy mode)",
            )
            where = _common.device_of(arr)
            check(where == place, f"{what}: batch {b} {name} is on {where}, expected {place}")
        x, y = _common.to_device(x, ctx), _common.to_device(y, ctx)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
        losses.append(float(loss.mean().item()))
        batches.append([x.asnumpy(), y.asnumpy()])
    return losses, batches


def main() -> None:
    args = _common.parser(__doc__).parse_args()
    name = f"numpy_mode[{args.workers}]"
    with Scenario(name, args.start_method) as sc:
        import mxnet as mx
        from mxnet.gluon.data import ArrayDataset
        from mxnet.gluon.data import DataLoader as GluonLoader

        from shardloader import DataLoader

        mx.npx.set_np()
        x, y = make_data()
        dataset = ArrayDataset(x, y)
        ours_kw = _common.worker_kwargs(args.workers, args.start_method)
        gluon_kw = _common.gluon_worker_kwargs(args.workers)

        variants = [
            ("plain", {}, {}, mx.cpu(0), mx.cpu(0)),
            (
                "pin_memory",
                {"pin_memory": True},
                {"pin_memory": True},
                mx.cpu_pinned(0),
                mx.cpu(0),
            ),
            ("ctx=cpu(1)", {"ctx": mx.cpu(1)}, {}, mx.cpu(1), mx.cpu(1)),
        ]
        failures = []
        for label, ours_extra, gluon_extra, place, net_ctx in variants:
            sc.phase(f"{label}: Gluon")
            gluon_loader = GluonLoader(dataset, batch_size=BATCH, **gluon_kw, **gluon_extra)
            # Gluon has no ctx=; its users call as_in_context, which train() does.
            # Its worker threads and processes return cpu_shared(0) batches.
            if gluon_extra:
                gluon_place = mx.cpu_pinned(0)
            else:
                shared = type(mx.cpu())("cpu_shared", 0)  # mx.Context in 1.x, mx.Device in 2.x
                gluon_place = mx.cpu(0) if args.workers == "inline" else shared
            theirs = train(gluon_loader, gluon_place, net_ctx, f"Gluon {label}")
            del gluon_loader
            sc.phase(f"{label}: shardloader")
            try:
                with DataLoader(dataset, batch_size=BATCH, **ours_kw, **ours_extra) as loader:
                    ours = train(loader, place, net_ctx, f"shardloader {label}")
                _common.same_batches(ours[1], theirs[1], f"{label}: batches (ours vs Gluon)")
                _common.close_trajectories(ours[0], theirs[0], f"{label}: losses", tol=1e-5)
            except _common.ScenarioFailure as exc:
                sc.phase(f"{label}: FAILED: {exc}")
                failures.append(str(exc))
        check(not failures, " | ".join(failures))


if __name__ == "__main__":
    main()
