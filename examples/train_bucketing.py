"""Multi-device Gluon training on bucketed variable-length sequences with shardloader.

    python examples/train_bucketing.py --epochs 3

Every step trains one data-parallel update on two devices. There are no GPUs on this machine,
so ``mx.cpu(0)`` and ``mx.cpu(1)`` stand in for ``mx.gpu(0)`` and ``mx.gpu(1)``: they are
distinct MXNet contexts, and the code runs unchanged with ``--gpus 2`` on a machine that has
them. What each part shows:

``SequenceSumDataset``
    A synthetic task, generated deterministically from ``--seed``: sequences of random tokens
    of length 4 to 64, labelled 1 when the tokens' sum is above ``length x mean token``. A
    dataset is anything with ``__len__`` and ``__getitem__``; each sample is
    ``(int32 tokens, label)``.

``FixedBucketSampler(lengths, batch_size, num_shards=2, shuffle=True, seed=...)``
    Puts sequences of similar length in the same batch and yields *steps*: lists of two
    batches, one per device. Each batch comes from one bucket, so the two shards of a step
    have different lengths. The shuffle is a function of ``(seed, epoch)``, so a run is
    reproducible. ``last_group="discard"`` drops a last step with a single batch, because
    every device must get a shard in every step: ``Trainer`` sums the gradients of all the
    contexts.

``batchify.Tuple(batchify.Pad(ret_length=True), batchify.Stack())``
    Runs once per shard: it pads each shard only to *its own* longest sequence and also
    returns the valid lengths. The script prints how many padding tokens that is, next to
    what padding every shard to the longest sequence of the whole step (what
    ``split_and_load`` on one big padded batch gives) would have cost.

``ShardedDataLoader(..., batch_sampler=..., num_workers=2, ctx=[ctx0, ctx1])``
    Two worker processes load and pad the shards; a background thread copies shard ``i`` to
    ``ctx[i]`` while the previous step trains, so every array the loop receives is already on
    its device: no ``split_and_load``, no ``as_in_context``.

``MeanPoolClassifier``
    An embedding, mean pooling over the valid positions (``SequenceMask`` with the lengths
    from ``Pad``) and two dense layers. ``net.initialize(init, ctxs)`` keeps a copy of the
    parameters on every device. It is written for both Gluons: MXNet 1.x calls
    ``hybrid_forward(F, ...)``, MXNet 2.x calls ``forward(...)`` on ``mx.np`` arrays.

The training loop
    Each shard's forward and backward run on its own context, then one ``trainer.step``
    sums the gradients across the devices and updates every copy. The mean loss of each
    epoch is printed as ``epoch N loss X`` and goes down.
"""

from __future__ import annotations

import argparse
import time
from typing import List, Tuple

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

from shardloader import ShardedDataLoader, batchify
from shardloader.sampler import FixedBucketSampler

VOCAB = 50  # tokens are 1..VOCAB-1; 0 is the padding value
MXNET_2 = int(mx.__version__.split(".")[0]) >= 2


class SequenceSumDataset:
    """Sample ``i`` is ``(tokens, label)``: int32 tokens in ``[1, VOCAB)`` and label 1 when
    their sum is above ``len(tokens) * VOCAB / 2`` (the mean token), else 0."""

    def __init__(self, num_samples: int, min_len: int = 4, max_len: int = 64, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.lengths = rng.integers(min_len, max_len + 1, size=num_samples)
        self.sequences = [rng.integers(1, VOCAB, size=n).astype(np.int32) for n in self.lengths]
        self.labels = [np.float32(seq.sum() > len(seq) * VOCAB / 2) for seq in self.sequences]

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, i: int) -> Tuple[np.ndarray, np.float32]:
        return self.sequences[i], self.labels[i]


class MeanPoolClassifier(gluon.HybridBlock):
    """Embedding, mean over the valid positions, a hidden layer and one logit."""

    def __init__(self, vocab: int, dim: int = 32, hidden: int = 32, **kwargs) -> None:
        super().__init__(**kwargs)
        self.embed = nn.Embedding(vocab, dim)
        self.hidden = nn.Dense(hidden, activation="relu", flatten=False)
        self.out = nn.Dense(1, flatten=False)

    if MXNET_2:

        def forward(self, tokens, lengths):
            emb = self.embed(tokens)  # (batch, time, dim)
            lengths = lengths.astype("float32")
            # Zero every position at or past each sample's length (axis 1 is time).
            masked = mx.npx.sequence_mask(
                emb, sequence_length=lengths, use_sequence_length=True, axis=1
            )
            pooled = masked.sum(axis=1) / lengths.reshape(-1, 1)
            return self.out(self.hidden(pooled)).reshape(-1)

    else:

        def hybrid_forward(self, F, tokens, lengths):
            emb = self.embed(tokens)  # (batch, time, dim)
            lengths = F.cast(lengths, "float32")
            # SequenceMask wants time first: zero every position at or past each length.
            masked = F.SequenceMask(
                F.transpose(emb, axes=(1, 0, 2)), sequence_length=lengths, use_sequence_length=True
            )
            pooled = F.broadcast_div(F.sum(masked, axis=0), F.expand_dims(lengths, axis=1))
            return F.reshape(self.out(self.hidden(pooled)), shape=(-1,))


def padding_tokens(step) -> Tuple[int, int]:
    """Padding in a step: as loaded (each shard to its own longest sequence), and as it would
    be if every shard were padded to the longest sequence of the whole step."""
    widest = max(tokens.shape[1] for (tokens, _), _ in step)
    per_shard = across = 0
    for (tokens, lengths), _ in step:
        valid = int(lengths.asnumpy().sum())
        per_shard += tokens.size - valid
        across += tokens.shape[0] * widest - valid
    return per_shard, across


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2000, help="dataset size")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per shard")
    parser.add_argument("--buckets", type=int, default=6)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes")
    parser.add_argument("--gpus", type=int, default=0, help="use mx.gpu(0..N-1) if > 0")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def contexts(gpus: int) -> List[mx.Context]:
    if gpus > 0:
        return [mx.gpu(i) for i in range(gpus)]
    return [mx.cpu(0), mx.cpu(1)]  # stand-ins for two GPUs


def main(argv=None) -> List[float]:
    args = parse_args(argv)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    ctxs = contexts(args.gpus)

    dataset = SequenceSumDataset(args.samples, seed=args.seed)
    sampler = FixedBucketSampler(
        dataset.lengths.tolist(),
        args.batch_size,
        num_buckets=args.buckets,
        shuffle=True,
        num_shards=len(ctxs),
        last_group="discard",  # every device gets a shard in every step
        seed=args.seed,
    )
    print(sampler.stats())
    loader = ShardedDataLoader(
        dataset,
        batch_sampler=sampler,
        batchify_fn=batchify.Tuple(batchify.Pad(pad_val=0, ret_length=True), batchify.Stack()),
        num_workers=args.workers,
        ctx=ctxs,  # shard i of every step arrives on ctxs[i]
    )

    net = MeanPoolClassifier(VOCAB)
    net.initialize(mx.init.Xavier(), ctxs)  # one copy of the parameters per device
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": args.lr})
    loss_fn = gluon.loss.SigmoidBinaryCrossEntropyLoss()

    epoch_losses = []
    with loader:
        for epoch in range(args.epochs):
            start = time.perf_counter()
            total_loss, total_samples, correct = 0.0, 0, 0
            padded = {"per_shard": 0, "across": 0}
            for step in loader:
                # Each shard runs forward and backward on the device it arrived on.
                with autograd.record():
                    outputs = [net(tokens, lengths) for (tokens, lengths), _ in step]
                    losses = [loss_fn(out, label) for out, (_, label) in zip(outputs, step)]
                autograd.backward(losses)
                batch_size = sum(label.shape[0] for _, label in step)
                trainer.step(batch_size)  # sums the gradients of all devices, updates all copies

                total_loss += sum(loss.sum().asnumpy().item() for loss in losses)
                total_samples += batch_size
                for out, (_, label) in zip(outputs, step):
                    correct += int(((out > 0) == label).asnumpy().sum())
                per_shard, across = padding_tokens(step)
                padded["per_shard"] += per_shard
                padded["across"] += across
            mean_loss = total_loss / total_samples
            epoch_losses.append(mean_loss)
            print(
                f"epoch {epoch + 1} loss {mean_loss:.4f} accuracy {correct / total_samples:.3f} "
                f"samples {total_samples} padding tokens {padded['per_shard']} per shard "
                f"(vs {padded['across']} padded across devices) "
                f"{time.perf_counter() - start:.1f}s"
            )
        stall = loader.stats()["data_stall"]
    print(f"the training loop waited for data {stall:.0%} of the time")
    return epoch_losses


if __name__ == "__main__":
    main()
