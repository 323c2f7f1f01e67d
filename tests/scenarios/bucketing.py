"""Scenario 7: gluon-nlp-style bucketing of variable-length sequences.

1. gluon-nlp's ``FixedBucketSampler`` (shuffled) as ``batch_sampler`` and gluon-nlp's
   ``batchify.Tuple(Pad(ret_length=True), Stack(), Stack())``: a small masked-mean
   classifier trains from shardloader (worker processes) and from Gluon's DataLoader; the
   batches and losses must agree.
2. The same sampler with ``num_shards=2`` (steps of two batches) through shardloader's
   ``ShardedDataLoader`` and gluon-nlp's own ``ShardedDataLoader``: the same steps.
3. shardloader's own ``FixedBucketSampler`` and ``batchify``: every batch is what gluon-nlp's
   batchify makes of the same samples, every sample is seen once per epoch, and without
   shuffling it buckets exactly as gluon-nlp's sampler does.

    python tests/scenarios/bucketing.py [--workers inline|thread|process]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import Scenario, check  # noqa: E402

N, BATCH, EPOCHS, VOCAB = 120, 8, 2, 50


class Sentences:
    """Sample i: (int32 tokens of length 3..30, int label, int index)."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(8)
        self.lengths = rng.integers(3, 31, size=n).tolist()
        self.tokens = [rng.integers(1, VOCAB, size=k).astype(np.int32) for k in self.lengths]
        self.labels = [int(t.sum() % 2) for t in self.tokens]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i):
        return self.tokens[i], self.labels[i], i


def nlp_batchify():
    import gluonnlp

    b = gluonnlp.data.batchify
    return b.Tuple(b.Pad(axis=0, pad_val=0, ret_length=True), b.Stack(), b.Stack())


def train(loader, epochs, what, sc):
    """Embedding -> mean over the valid tokens -> Dense; the sampler is shuffled from
    numpy's global RNG, seeded the same way before each epoch for every loader."""
    import mxnet as mx
    from mxnet import autograd, gluon

    embed = gluon.nn.Embedding(VOCAB, 8)
    out = gluon.nn.Dense(2, in_units=8)
    for block in (embed, out):
        block.initialize(mx.init.Constant(0.05))
    params = embed.collect_params()
    params.update(out.collect_params())
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.5})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses, batches = [], []
    for epoch in range(epochs):
        np.random.seed(100 + epoch)
        for (tokens, valid_len), label, index in loader:
            check(tokens.shape[1] == int(valid_len.max().asscalar()), f"{what}: over-padded")
            length = valid_len.astype("float32").reshape((-1, 1))
            mask = mx.nd.arange(tokens.shape[1]).reshape((1, -1)) < length
            mask = mask.astype("float32").expand_dims(axis=2)
            with autograd.record():
                pooled = (embed(tokens) * mask).sum(axis=1) / length
                loss = loss_fn(out(pooled), label.astype("float32"))
            loss.backward()
            trainer.step(tokens.shape[0])
            losses.append(float(loss.mean().asscalar()))
            batches.append(
                [tokens.asnumpy(), valid_len.asnumpy(), label.asnumpy(), index.asnumpy()]
            )
        sc.phase(f"{what}: epoch {epoch}: {len(batches)} batches, loss {losses[-1]:.4f}")
    return losses, batches


def own_sampler():
    import shardloader.sampler as ss

    lengths = Sentences(N).lengths
    return ss.FixedBucketSampler(lengths, batch_size=BATCH, num_buckets=4, shuffle=True, seed=0)


def reference_batches():
    """gluon-nlp's batchify of every batch the seeded shardloader sampler will give, keyed
    by the batch's indices. Made before the program takes its descriptor baseline: gluon-nlp's
    ``Stack`` builds its output in MXNet's cpu_shared memory, whose descriptors MXNet keeps."""
    ds, sampler, batchify = Sentences(N), own_sampler(), nlp_batchify()
    out = {}
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for indices in sampler:
            out[tuple(int(i) for i in indices)] = _common.leaves(
                batchify([ds[int(i)] for i in indices])
            )
    return out


def main() -> None:
    args = _common.parser(__doc__).parse_args()
    expected_own = reference_batches()
    with Scenario(f"bucketing[{args.workers}]", args.start_method) as sc:
        import gluonnlp
        from mxnet.gluon.data import DataLoader as GluonLoader

        import shardloader.batchify as sb
        import shardloader.sampler as ss
        from shardloader import ShardedDataLoader

        ds = Sentences(N)
        ours_kw = _common.worker_kwargs(args.workers, args.start_method)
        gluon_kw = _common.gluon_worker_kwargs(args.workers)

        # 1. gluon-nlp's sampler and batchify, shardloader against Gluon.
        def nlp_sampler(**kw):
            return gluonnlp.data.FixedBucketSampler(
                ds.lengths, batch_size=BATCH, num_buckets=4, shuffle=True, **kw
            )

        gluon_loader = GluonLoader(
            ds, batch_sampler=nlp_sampler(), batchify_fn=nlp_batchify(), **gluon_kw
        )
        theirs = train(gluon_loader, EPOCHS, "Gluon + gluon-nlp sampler", sc)
        del gluon_loader
        with ShardedDataLoader(
            ds, batch_sampler=nlp_sampler(), batchify_fn=nlp_batchify(), **ours_kw
        ) as loader:
            ours = train(loader, EPOCHS, "shardloader + gluon-nlp sampler", sc)
        _common.same_batches(ours[1], theirs[1], "gluon-nlp sampler: batches (ours vs Gluon)")
        _common.close_trajectories(ours[0], theirs[0], "gluon-nlp sampler: losses")

        # 2. Sharded steps from gluon-nlp's sampler, against gluon-nlp's ShardedDataLoader.
        def steps(loader):
            out = []
            for epoch in range(EPOCHS):
                np.random.seed(200 + epoch)
                for step in loader:
                    out.append([_common.leaves(shard) for shard in step])
            return out

        nlp_loader = gluonnlp.data.ShardedDataLoader(
            ds, batch_sampler=nlp_sampler(num_shards=2), batchify_fn=nlp_batchify(), **gluon_kw
        )
        nlp_steps = steps(nlp_loader)
        del nlp_loader
        with ShardedDataLoader(
            ds, batch_sampler=nlp_sampler(num_shards=2), batchify_fn=nlp_batchify(), **ours_kw
        ) as loader:
            our_steps = steps(loader)
        check(len(our_steps) == len(nlp_steps), f"{len(our_steps)} steps vs {len(nlp_steps)}")
        for k, (a, b) in enumerate(zip(our_steps, nlp_steps)):
            _common.same_batches(a, b, f"sharded step {k} (ours vs gluon-nlp ShardedDataLoader)")
        sc.phase(f"sharded: {len(our_steps)} steps equal gluon-nlp's")

        # 3. shardloader's own sampler and batchify.
        plain_nlp = list(
            gluonnlp.data.FixedBucketSampler(ds.lengths, batch_size=BATCH, num_buckets=4)
        )
        plain_ours = list(ss.FixedBucketSampler(ds.lengths, batch_size=BATCH, num_buckets=4))
        check(
            [list(b) for b in plain_ours] == [list(b) for b in plain_nlp],
            "unshuffled, shardloader's FixedBucketSampler buckets differently from gluon-nlp's: "
            f"first batches {plain_ours[:2]} vs {plain_nlp[:2]}",
        )
        own = sb.Tuple(sb.Pad(axis=0, pad_val=0, ret_length=True), sb.Stack(), sb.Stack())
        sampler = own_sampler()
        with ShardedDataLoader(ds, batch_sampler=sampler, batchify_fn=own, **ours_kw) as loader:
            own_run = train(loader, EPOCHS, "shardloader's own sampler and batchify", sc)
        for epoch_start in range(0, len(own_run[1]), len(sampler)):
            epoch_batches = own_run[1][epoch_start : epoch_start + len(sampler)]
            seen = sorted(int(i) for b in epoch_batches for i in b[3].ravel())
            check(seen == list(range(N)), "own sampler: an epoch did not see every sample once")
        for k, batch in enumerate(own_run[1]):
            key = tuple(int(i) for i in batch[3])
            check(key in expected_own, f"own sampler: batch {k} {key} is not one it should give")
            _common.same_batches(
                [batch], [expected_own[key]], f"own batchify batch {k} vs gluon-nlp's batchify"
            )


if __name__ == "__main__":
    main()
