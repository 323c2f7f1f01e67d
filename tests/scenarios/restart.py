"""Scenario 8: a worker SIGKILLed in the middle of training, ``on_worker_death='restart'``.

The training loop kills one of shardloader's worker processes (as the OOM killer would) in
the middle of the first epoch and the other in the middle of the second. With
``on_worker_death='restart'`` training must go on: every batch arrives exactly once, in
order, and the final weights equal those of the same training run on Gluon's DataLoader,
where nothing was killed.

    python tests/scenarios/restart.py [--start-method fork|spawn|forkserver]
"""

from __future__ import annotations

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import IndexedVectors, Scenario, check  # noqa: E402

N, BATCH, EPOCHS = 96, 8, 2
KILL_AT = {(0, 4): 0, (1, 7): 1}  # (epoch, step) -> which worker to kill


class SlowVectors(IndexedVectors):
    """Loading takes a little time, so that batches are in flight when a worker dies."""

    def __getitem__(self, i):
        time.sleep(0.002)
        return super().__getitem__(i)


def train(loader, sc, what, kill=False):
    import mxnet as mx
    from mxnet import autograd, gluon

    net = gluon.nn.Dense(1, in_units=6)
    net.initialize(mx.init.Constant(0.0))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    loss_fn = gluon.loss.L2Loss()
    seen, killed = [], []
    for epoch in range(EPOCHS):
        for step, (x, y, idx) in enumerate(loader):
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(x.shape[0])
            seen.append(idx.asnumpy().astype(int).tolist())
            if kill and (epoch, step) in KILL_AT:
                pids = loader.worker_pids()
                check(len(pids) == 2, f"{what}: expected 2 worker pids, got {pids}")
                victim = pids[KILL_AT[(epoch, step)]]
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)
                sc.phase(f"{what}: epoch {epoch} step {step}: SIGKILLed worker {victim}")
        sc.phase(f"{what}: epoch {epoch} done, {len(seen)} batches")
    mx.nd.waitall()
    return seen, killed, _common.params_numpy(net)


def main() -> None:
    args = _common.parser(__doc__).parse_args()
    with Scenario(f"restart[{args.start_method}]", args.start_method) as sc:
        from mxnet.gluon.data import DataLoader as GluonLoader

        from shardloader import DataLoader

        ds = SlowVectors(N)
        order = np.random.default_rng(3).permutation(N).tolist()
        expected = [order[i : i + BATCH] for i in range(0, N, BATCH)] * EPOCHS

        with DataLoader(
            ds,
            batch_size=BATCH,
            sampler=order,
            num_workers=2,
            start_method=args.start_method,
            on_worker_death="restart",
        ) as loader:
            seen, killed, ours = train(loader, sc, "shardloader", kill=True)
            survivors = loader.worker_pids()
        check(len(killed) == len(KILL_AT), f"killed {killed}, planned {len(KILL_AT)} kills")
        check(
            not set(killed) & set(survivors),
            f"killed workers {killed} still listed: {survivors}",
        )
        check(
            seen == expected,
            "the batches after the restarts are not every batch once, in order: "
            f"{len(seen)} batches, first difference at "
            f"{next((k for k, (a, b) in enumerate(zip(seen, expected)) if a != b), None)}",
        )
        gluon_loader = GluonLoader(ds, batch_size=BATCH, sampler=order, num_workers=2)
        gluon_seen, _, theirs = train(gluon_loader, sc, "Gluon")
        del gluon_loader
        check(gluon_seen == expected, "Gluon's batches are not in the sampler's order")
        _common.compare_params(ours, theirs, "final weights (ours, with kills, vs Gluon)")


if __name__ == "__main__":
    main()
