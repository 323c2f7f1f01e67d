"""One kvstore worker of the distributed test; run it under ``python -m shardloader.launch``.

Each worker joins the ``dist_sync`` kvstore, reads its part of a small dataset with
:class:`shardloader.ShardedDataLoader` (``num_parts=kv.num_workers``, ``part_index=kv.rank``),
trains a ``Dense`` layer through ``gluon.Trainer(..., kvstore=kv)`` and writes
``<out_dir>/rank<rank>.json``: the sample ids it saw in each epoch, its training steps, its
losses and its final weights. Feature 0 of every sample is the sample's id, which a float32
holds exactly.

Usage: ``dist_worker.py OUT_DIR [--loader-workers K[,K1...]] [--fail-rank R --exit-code C]``.
``OUT_DIR`` defaults to ``$SHARDLOADER_DIST_OUT``. With a list of loader workers, rank ``r``
takes its ``r``-th entry (modulo its length): ``0,2`` reads inline on rank 0 and with two
worker processes on rank 1, so one run covers both. With ``--fail-rank``, that rank exits with
``--exit-code`` before its first step, while the others block in theirs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from shardloader import ShardedDataLoader
from shardloader.distributed import fail_fast, parts_from_kvstore

# With dist_sync every worker must make the same number of trainer.step calls per epoch, so
# NUM_SAMPLES is a multiple of (workers x BATCH_SIZE): 48 samples, 2 workers, 6 steps each.
NUM_SAMPLES = 48
BATCH_SIZE = 4
EPOCHS = 2
SEED = 1234
_TRUE_WEIGHTS = np.array([1.0, -2.0, 0.5], dtype=np.float32)
_TRUE_BIAS = 0.3


def make_dataset(num_samples: int = NUM_SAMPLES) -> gluon.data.ArrayDataset:
    """Samples ``([id, x0, x1, x2], y)`` of a noiseless linear problem."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, size=(num_samples, len(_TRUE_WEIGHTS))).astype(np.float32)
    ids = np.arange(num_samples, dtype=np.float32)[:, None]
    y = (x @ _TRUE_WEIGHTS + _TRUE_BIAS).astype(np.float32)[:, None]
    return gluon.data.ArrayDataset(np.concatenate([ids, x], axis=1), y)


def train(kv: mx.kv.KVStore, args: argparse.Namespace) -> dict:
    num_parts, part_index = parts_from_kvstore(kv)
    loader_workers = args.loader_workers[kv.rank % len(args.loader_workers)]
    loader = ShardedDataLoader(
        make_dataset(),
        batch_size=BATCH_SIZE,
        shuffle=True,
        seed=SEED,
        num_parts=num_parts,
        part_index=part_index,
        num_workers=loader_workers,
        last_batch="keep",
    )
    mx.random.seed(SEED)
    net = gluon.nn.Dense(1, in_units=len(_TRUE_WEIGHTS))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.2}, kvstore=kv)
    loss_fn = gluon.loss.L2Loss()

    epochs = []
    for epoch in range(EPOCHS):
        ids, losses, steps = [], [], 0
        for features, label in loader:
            ids.extend(int(i) for i in features[:, 0].asnumpy())
            if kv.rank == args.fail_rank:
                sys.exit(args.exit_code)
            with autograd.record():
                loss = loss_fn(net(features[:, 1:]), label)
            loss.backward()
            trainer.step(features.shape[0])
            losses.append(loss.mean().asnumpy().item())
            steps += 1
        epochs.append({"epoch": epoch, "ids": ids, "steps": steps, "losses": losses})
    loader.close()
    return {
        "rank": kv.rank,
        "num_workers": kv.num_workers,
        "num_parts": num_parts,
        "part_index": part_index,
        "loader_workers": loader_workers,
        "epochs": epochs,
        "weight": net.weight.data().asnumpy().ravel().tolist(),
        "bias": net.bias.data().asnumpy().item(),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=os.environ.get("SHARDLOADER_DIST_OUT"))
    parser.add_argument(
        "--loader-workers",
        type=lambda text: [int(k) for k in text.split(",")],
        default=[0],
        help="num_workers of each rank's loader: one value, or one per rank (comma-separated)",
    )
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--exit-code", type=int, default=3)
    args = parser.parse_args(argv)
    if not args.out_dir:
        parser.error("give OUT_DIR or set SHARDLOADER_DIST_OUT")

    kv = mx.kv.create("dist_sync")
    with fail_fast(kv):
        report = train(kv, args)
    path = os.path.join(args.out_dir, f"rank{kv.rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
