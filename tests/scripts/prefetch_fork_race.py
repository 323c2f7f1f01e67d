"""PrefetchingIter over LoaderDataIter over a loader with a fork worker, while this (the
caller's) thread runs MXNet operations right after making the iterator, as Module.fit binds
and initialises its module after its data iterators are made.

Each round makes a new loader, so each round forks a worker. Forked from the prefetch thread
while this thread was inside MXNet, the worker or this process hung in MXNet's engine (its
fork handlers stop and restart the engine): tests/test_dataiter.py runs this with a deadline.

    python tests/scripts/prefetch_fork_race.py ROUNDS WATCHDOG_S
"""

from __future__ import annotations

import faulthandler
import sys

import mxnet as mx
import numpy as np

from shardloader import DataLoader
from shardloader.dataiter import LoaderDataIter, PrefetchingIter


class Rows:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        return np.full((4,), i, "float32"), np.float32(i % 2)


def main() -> None:
    rounds, watchdog = int(sys.argv[1]), float(sys.argv[2])
    faulthandler.dump_traceback_later(watchdog, exit=True)  # a hang prints where it is
    for r in range(rounds):
        loader = DataLoader(Rows(), batch_size=4, num_workers=1)
        it = PrefetchingIter(LoaderDataIter(loader, batch_size=4))
        a = mx.nd.zeros((16,))
        for _ in range(300):
            a = a + 1
        assert a.asnumpy()[0] == 300
        rows = [b.data[0].asnumpy()[:, 0].tolist() for b in it]
        assert rows == [[0, 1, 2, 3], [4, 5, 6, 7]], (r, rows)
        it.close()
        loader.close()
    print(f"OK {rounds} rounds", flush=True)


if __name__ == "__main__":
    main()
