"""A dist_sync worker that trains epoch after epoch until it is stopped (tests/test_multihost.py).

Usage: ``multihost_forever.py OUT_DIR``. Reads its part with process loader workers, and after
its first step writes ``OUT_DIR/ready-<DMLC_NODE_HOST>``; then the test pulls a host away
mid-epoch or signals the launcher.
"""

import os
import sys

import mxnet as mx
from mxnet import autograd, gluon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dist_worker  # noqa: E402

from shardloader import ShardedDataLoader  # noqa: E402
from shardloader.distributed import fail_fast, parts_from_kvstore  # noqa: E402


def main() -> None:
    out_dir = sys.argv[1]
    kv = mx.kv.create("dist_sync")
    with fail_fast(kv):
        num_parts, part_index = parts_from_kvstore(kv)
        loader = ShardedDataLoader(
            dist_worker.make_dataset(4096),
            batch_size=4,
            shuffle=True,
            seed=1,
            num_parts=num_parts,
            part_index=part_index,
            num_workers=2,
        )
        net = gluon.nn.Dense(1, in_units=3)
        net.initialize(mx.init.Xavier())
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv)
        loss_fn = gluon.loss.L2Loss()
        ready = os.path.join(out_dir, "ready-" + os.environ["DMLC_NODE_HOST"])
        while True:
            for features, label in loader:
                with autograd.record():
                    loss = loss_fn(net(features[:, 1:]), label)
                loss.backward()
                trainer.step(features.shape[0])
                if ready:
                    open(ready, "w").close()
                    ready = ""


if __name__ == "__main__":
    main()
