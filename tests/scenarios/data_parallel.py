"""Scenario 2: data-parallel training with a gluon.Trainer on two contexts.

``ShardedDataLoader(num_shards=2, ctx=[mx.cpu(0), mx.cpu(1)])`` feeds a net initialised on
both contexts; each step's shards go through the net on their own context and
``trainer.step`` sums the gradients. The dataset (70 samples, 8 per shard) leaves a ragged
tail. The final weights must equal those of a one-device replay of the very same steps
(every step's samples concatenated into one batch on cpu(0)), and those of Gluon's recipe
(one DataLoader batch of 16, ``split_and_load`` over both contexts).

    python tests/scenarios/data_parallel.py --last-batch keep|discard|rollover
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import IndexedVectors, Scenario, check  # noqa: E402

N, PER_SHARD, EPOCHS = 70, 8, 2
OPTIMIZER = ("sgd", {"learning_rate": 0.05, "momentum": 0.9})


def make_net(ctx):
    import mxnet as mx
    from mxnet import gluon

    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(8, activation="tanh", in_units=6), gluon.nn.Dense(1, in_units=8))
    net.initialize(mx.init.Zero(), ctx)  # positional: 2.x calls it device
    _common.set_params_from_seed(net, 3)
    return net


def train_sharded(ds, order, last_batch, sc):
    import mxnet as mx
    from mxnet import autograd, gluon

    from shardloader import ShardedDataLoader

    ctx = [mx.cpu(0), mx.cpu(1)]
    net = make_net(ctx)
    trainer = gluon.Trainer(net.collect_params(), *OPTIMIZER)
    loss_fn = gluon.loss.L2Loss()
    steps = []  # per step: the sample indices of each shard
    with ShardedDataLoader(
        ds,
        batch_size=PER_SHARD,
        sampler=order,
        last_batch=last_batch,
        num_shards=len(ctx),
        ctx=ctx,
        num_workers=2,
    ) as loader:
        for epoch in range(EPOCHS):
            for step in loader:
                check(
                    [_common.device_of(x) for x, _, _ in step] == ctx[: len(step)],
                    f"epoch {epoch} step {len(steps)}: shards on "
                    f"{[_common.device_of(x) for x, _, _ in step]}, expected {ctx}",
                )
                with autograd.record():
                    losses = [loss_fn(net(x), y) for x, y, _ in step]
                autograd.backward(losses)
                trainer.step(sum(y.shape[0] for _, y, _ in step))
                steps.append([idx.asnumpy().astype(int).tolist() for _, _, idx in step])
            sc.phase(f"sharded: epoch {epoch}: {len(steps)} steps so far")
    mx.nd.waitall()
    per_ctx = [_common.params_numpy(net, c) for c in ctx]
    return steps, per_ctx


def replay_one_device(ds, steps):
    """The same steps, each as one batch on cpu(0)."""
    import mxnet as mx
    from mxnet import autograd, gluon

    net = make_net(mx.cpu(0))
    trainer = gluon.Trainer(net.collect_params(), *OPTIMIZER)
    loss_fn = gluon.loss.L2Loss()
    for step in steps:
        idx = [i for shard in step for i in shard]
        x, y = _common.array(ds.x[idx]), _common.array(ds.y[idx])
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(len(idx))
    return _common.params_numpy(net)


def train_gluon_split_and_load(ds, order, last_batch):
    """Gluon's recipe: one batch of PER_SHARD * 2 samples, split over the contexts."""
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.gluon.data import DataLoader

    ctx = [mx.cpu(0), mx.cpu(1)]
    net = make_net(ctx)
    trainer = gluon.Trainer(net.collect_params(), *OPTIMIZER)
    loss_fn = gluon.loss.L2Loss()
    loader = DataLoader(
        ds,
        batch_size=PER_SHARD * 2,
        sampler=order,
        last_batch=last_batch,
        **_common.gluon_worker_kwargs("process"),
    )
    for _ in range(EPOCHS):
        for x, y, _ in loader:
            xs = gluon.utils.split_and_load(x, ctx, even_split=False)
            ys = gluon.utils.split_and_load(y, ctx, even_split=False)
            with autograd.record():
                losses = [loss_fn(net(a), b) for a, b in zip(xs, ys)]
            autograd.backward(losses)
            trainer.step(x.shape[0])
    mx.nd.waitall()
    del loader
    return _common.params_numpy(net, ctx[0])


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--last-batch", choices=["keep", "discard", "rollover"], default="keep")
    args = p.parse_args()
    with Scenario(f"data_parallel[{args.last_batch}]") as sc:
        ds = IndexedVectors(N)
        order = np.random.default_rng(11).permutation(N).tolist()
        steps, per_ctx = train_sharded(ds, order, args.last_batch, sc)

        # What was trained on: the whole dataset once per epoch for 'keep'.
        seen = sorted(i for step in steps for shard in step for i in shard)
        if args.last_batch == "keep":
            check(
                seen == sorted(list(range(N)) * EPOCHS),
                f"'keep': the epochs did not cover every sample exactly once: {len(seen)} "
                f"samples seen for {N * EPOCHS}",
            )
        short = [(k, [len(s) for s in step]) for k, step in enumerate(steps) if len(step) < 2]
        sc.phase(f"{len(steps)} steps; shard sizes of the last: {[len(s) for s in steps[-1]]}")

        # The two copies of the weights must agree with each other...
        _common.compare_params(per_ctx[0], per_ctx[1], "weights on cpu(0) vs cpu(1)", tol=1e-6)
        # ...and with a one-device replay of the same steps.
        replay = replay_one_device(ds, steps)
        try:
            _common.compare_params(
                per_ctx[0], replay, "sharded weights vs a one-device replay", tol=1e-5
            )
        except _common.ScenarioFailure as exc:
            if short:
                raise _common.ScenarioFailure(
                    f"{exc}. The loader yielded steps with fewer shards than the 2 contexts "
                    f"(step, shard sizes): {short}: the context without a shard kept its "
                    f"previous gradient, and trainer.step summed it in"
                ) from None
            raise
        if args.last_batch != "rollover":  # Gluon's rollover makes different batches
            gluon_weights = train_gluon_split_and_load(ds, order, args.last_batch)
            _common.compare_params(
                per_ctx[0], gluon_weights, "sharded weights vs Gluon's split_and_load", tol=1e-5
            )


if __name__ == "__main__":
    main()
