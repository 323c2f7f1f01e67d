"""A program whose training process cannot map a new shared-memory slot (issue 22, item 8):
its address space is capped (``RLIMIT_AS``) a little above what it uses, after its workers
started (they keep the limit they were forked with), and the next batch needs a 64 MiB slot.
It prints one JSON line: what that batch raised, and whether a new epoch, with the limit
lifted, is complete and on the same worker processes.

    python tests/scripts/h3_address_space.py
"""

from __future__ import annotations

import faulthandler
import json
import resource

import numpy as np

from shardloader import ShardedDataLoader

SMALL, LARGE = 1024, 16 << 20  # float32 values a sample: 4 KiB, then 64 MiB


class SmallThenLarge:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return np.full((SMALL if i < 2 else LARGE,), i, dtype=np.float32), i


def labels(batches):
    return [int(v) for _, y in batches for v in y.asnumpy()]


def address_space() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def main() -> None:
    faulthandler.dump_traceback_later(60, exit=True)  # a hang says where, then exits
    batches = [[0], [1], [2], [3]]
    loader = ShardedDataLoader(
        SmallThenLarge(), batch_sampler=batches, num_workers=1, prefetch=1, timeout=20
    )
    it = iter(loader)
    got = labels([next(it), next(it)])
    pids = loader.worker_pids()
    limits = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (address_space() + (16 << 20), limits[1]))
    outcome = {}
    try:
        got += labels(list(it))
        outcome["rest"] = "complete"
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        resource.setrlimit(resource.RLIMIT_AS, limits)
        outcome.update(
            rest="raised",
            type=type(exc).__name__,
            mro=[c.__name__ for c in type(exc).__mro__],
            errno=getattr(exc, "errno", None),
            nbytes=getattr(exc, "nbytes", None),
            message=str(exc),
        )
    resource.setrlimit(resource.RLIMIT_AS, limits)
    del it
    outcome["again"] = labels(loader) == [0, 1, 2, 3]
    outcome["same_workers"] = loader.worker_pids() == pids
    loader.close()
    faulthandler.cancel_dump_traceback_later()
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
