"""Scenario 6: gluoncv-style detection batches.

Samples are (image, boxes) with a different number of boxes per image, batched with gluoncv's
own ``Tuple(Stack(), Pad(pad_val=-1))`` (``gluoncv.data.batchify``), as gluoncv's detection
training scripts do. The program trains a toy box regressor on them with shardloader (inline,
threads, worker processes) and with Gluon's DataLoader, and checks that the batches and the
losses are the same; then it checks that shardloader's own ``batchify.Tuple(Stack(),
Pad(pad_val=-1))`` gives gluoncv's batches.

    python tests/scenarios/detection.py [--start-method fork|spawn|forkserver]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import Scenario, check  # noqa: E402

N, BATCH, EPOCHS = 50, 8, 2


class BoxDataset:
    """Image i is a (3, 16, 16) float32 array; it has 1 + (7 * i) % 6 boxes, each
    [x0, y0, x1, y1, class] in float32."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(21)
        self.images = rng.random((n, 3, 16, 16), dtype=np.float32)
        self.boxes = []
        for i in range(n):
            k = 1 + (7 * i) % 6
            corners = np.sort(rng.random((k, 2, 2), dtype=np.float32) * 16, axis=1)
            cls = rng.integers(0, 3, size=(k, 1)).astype(np.float32)
            self.boxes.append(np.concatenate([corners.reshape(k, 4), cls], axis=1))

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.boxes[i]


def train(loader, what, sc):
    """A toy detector: predict one box per image; the loss is the mean distance to the
    image's real (unpadded) boxes."""
    import mxnet as mx
    from mxnet import autograd, gluon

    net = gluon.nn.Dense(4, in_units=3 * 16 * 16)
    net.initialize(mx.init.Constant(0.01))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.001})
    losses, batches = [], []
    for epoch in range(EPOCHS):
        for images, boxes in loader:
            check(boxes.ndim == 3 and boxes.shape[2] == 5, f"{what}: boxes {boxes.shape}")
            valid = (boxes[:, :, 4] >= 0).astype("float32")  # Pad(pad_val=-1) marks padding
            with autograd.record():
                pred = net(images).expand_dims(axis=1)  # (B, 1, 4)
                dist = ((boxes[:, :, :4] - pred) ** 2).sum(axis=2)
                loss = (dist * valid).sum() / valid.sum()
            loss.backward()
            trainer.step(1)
            losses.append(float(loss.asscalar()))
            batches.append([images.asnumpy(), boxes.asnumpy()])
        sc.phase(f"{what}: epoch {epoch}: loss {losses[-1]:.3f}")
    return losses, batches


def main() -> None:
    args = _common.parser(__doc__).parse_args()
    with Scenario("detection", args.start_method) as sc:
        from gluoncv.data.batchify import Pad, Stack, Tuple
        from mxnet.gluon.data import DataLoader as GluonLoader

        import shardloader.batchify as sb
        from shardloader import DataLoader

        dataset = BoxDataset(N)
        order = np.random.default_rng(2).permutation(N).tolist()
        gcv = Tuple(Stack(), Pad(pad_val=-1))

        gluon_loader = GluonLoader(
            dataset, batch_size=BATCH, sampler=order, batchify_fn=gcv, num_workers=2
        )
        reference = train(gluon_loader, "Gluon, 2 processes", sc)
        del gluon_loader
        counts = sorted({b[1].shape[1] for b in reference[1]})
        sc.phase(f"Gluon: {len(reference[1])} batches, padded box counts {counts}")
        check(len(counts) > 1, f"the batches should pad to different box counts: {counts}")

        for workers in ("inline", "thread", "process"):
            kwargs = _common.worker_kwargs(workers, args.start_method)
            with DataLoader(
                dataset, batch_size=BATCH, sampler=order, batchify_fn=gcv, **kwargs
            ) as loader:
                ours = train(loader, f"shardloader {workers}", sc)
            _common.same_batches(ours[1], reference[1], f"{workers}: batches (ours vs Gluon)")
            _common.close_trajectories(ours[0], reference[0], f"{workers}: losses", tol=1e-5)

        # shardloader's own batchify functions give gluoncv's batches.
        own = sb.Tuple(sb.Stack(), sb.Pad(pad_val=-1))
        with DataLoader(
            dataset, batch_size=BATCH, sampler=order, batchify_fn=own, num_workers=2
        ) as loader:
            ours = [[a.asnumpy(), b.asnumpy()] for a, b in loader]
        _common.same_batches(
            ours, reference[1][: len(ours)], "shardloader.batchify vs gluoncv.data.batchify"
        )


if __name__ == "__main__":
    main()
