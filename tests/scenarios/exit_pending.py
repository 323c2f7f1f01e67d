"""Scenario 11: a training script that simply ends after its last step.

Many training scripts end right after the last ``trainer.step``, or after printing the loss,
which waits only for the forward passes: MXNet's engine is then still running the last
backward pass, which reads the last batch (the first Dense layer's weight gradient), while
the interpreter shuts down. The
script neither closes its loaders nor calls ``mx.nd.waitall()``. It must exit with status 0,
as it does with Gluon's DataLoader (which this program runs first, the same way).

    python tests/scenarios/exit_pending.py --workers process|thread|inline
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import Scenario  # noqa: E402

N, BATCH, EPOCHS = 512, 128, 2


class Images:
    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.random((n, 3, 32, 32), dtype=np.float32)
        self.y = (np.arange(n) % 4).astype(np.float32)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def train(loader, sc, what):
    """An MLP on the flattened images; the loss is summed as an NDArray and printed once, at
    the end of training, which waits for the forward passes but not the last backward."""
    import mxnet as mx
    from mxnet import autograd, gluon

    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(1024, activation="relu"), gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    total = _common.array(np.zeros(1, "float32"))  # the default array type, as the batches
    for _ in range(EPOCHS):
        for data, label in loader:
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(data.shape[0])
            total += loss.sum()
    sc.phase(f"{what}: {EPOCHS} epochs queued")
    return net


if __name__ == "__main__":
    # Top-level code, as in most training scripts: the loaders are module globals and live
    # until the interpreter shuts down.
    args = _common.parser(__doc__).parse_args()
    sc = Scenario(f"exit_pending[{args.workers}]", args.start_method)
    with sc:
        from mxnet.gluon.data import DataLoader as GluonLoader

        from shardloader import DataLoader

        gluon_loader = GluonLoader(
            Images(N), batch_size=BATCH, **_common.gluon_worker_kwargs(args.workers)
        )
        train(gluon_loader, sc, "Gluon")
        loader = DataLoader(
            Images(N), batch_size=BATCH, **_common.worker_kwargs(args.workers, args.start_method)
        )
        train(loader, sc, "shardloader")
        # The script ends here, as scripts do: the loaders are left open, and the engine is
        # still computing the last steps. (No leak check in this process: it would wait for
        # the work to finish. The driver checks that no process outlives the program.)
        sc.skip_leak_check = True
