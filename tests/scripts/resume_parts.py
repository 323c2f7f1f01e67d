"""One machine of a data-parallel job that is stopped and resumed on another number of machines.

    python resume_parts.py (--parts P --rank R | --kvstore) --log LOG [--state FILE ...]
                           [--epoch E] (--stop-after K [K ...] --save FILE | --finish)

Builds machine R's loader of P (``num_parts=P, part_index=R``, two worker processes, a
shuffled dataset whose samples are their own indices) and trains a toy model on it. Without
``--state`` it starts epoch E; with ``--state`` it merges the given states (every machine's of
the previous job, in any order: each machine merges them all) and resumes from that job state.
With ``--stop-after K`` it takes K batches, saves its loader's state to ``--save`` and exits, as
a preempted job would after its checkpoint. With ``--finish`` it runs to the end of the epoch
and then one more epoch. Every batch it takes is appended to LOG as a JSON line
``{"epoch": e, "samples": [...]}``. At the end it checks that the loader left no process
behind.

The dataset and loader arguments are fixed here (N, BATCH_SIZE, SEED) so that every machine
builds the same loader; tests/test_multihost.py reads them.

With ``--kvstore`` it is a worker of a ``dist_sync`` job (started by ``python -m
shardloader.launch``): P and R are ``kv.num_workers`` and ``kv.rank``, as in a user's training
script, ``{rank}`` in LOG and ``--save`` stands for R, and with several ``--stop-after`` counts
machine R takes the R-th.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import sys

import numpy as np

from shardloader import DataLoader
from shardloader.distributed import merge_states

N, BATCH_SIZE, SEED = 103, 4, 11


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--kvstore", action="store_true")
    parser.add_argument("--log", required=True)
    parser.add_argument("--state", nargs="*", default=[])
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--stop-after", type=int, nargs="+")
    parser.add_argument("--save")
    parser.add_argument("--finish", action="store_true")
    args = parser.parse_args(argv)
    if args.finish == (args.stop_after is not None and args.save is not None):
        parser.error("give either --stop-after K --save FILE, or --finish")
    if args.kvstore == (args.parts is not None and args.rank is not None):
        parser.error("give either --parts P --rank R, or --kvstore")
    if args.kvstore:
        import mxnet as mx

        kv = mx.kv.create("dist_sync")
        args.parts, args.rank = kv.num_workers, kv.rank
    stop_after = None
    if args.stop_after is not None:
        stop_after = args.stop_after[args.rank % len(args.stop_after)]
    log_path = args.log.format(rank=args.rank)
    save_path = args.save.format(rank=args.rank) if args.save else None

    loader = DataLoader(
        np.arange(N, dtype="float32"),
        batch_size=BATCH_SIZE,
        shuffle=True,
        seed=SEED,
        num_workers=2,
        num_parts=args.parts,
        part_index=args.rank,
    )
    weight = 0.0
    with loader, open(log_path, "a") as log:
        if args.state:
            states = []
            for path in args.state:
                with open(path) as f:
                    states.append(json.load(f))
            job = merge_states(states)
            loader.load_state_dict(job)
            epoch = job["epoch"]
        else:
            loader.set_epoch(args.epoch)
            epoch = args.epoch
        for _ in range(2 if args.finish else 1):
            # islice asks for no batch beyond the K-th: the state counts exactly those.
            for batch in itertools.islice(loader, stop_after):
                values = batch.asnumpy()
                weight += 0.01 * (float(values.mean()) - weight)  # the "training"
                samples = [int(v) for v in values.tolist()]
                log.write(json.dumps({"epoch": epoch, "samples": samples}) + "\n")
                log.flush()
            epoch += 1
        if save_path:
            with open(save_path, "w") as f:
                json.dump(loader.state_dict(), f)
    left = multiprocessing.active_children()
    if left:
        print(f"processes left behind: {left}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
