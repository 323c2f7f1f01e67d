"""A program that runs out of file descriptors mid-epoch, while its loader's workers still
send new shared-memory slots (issue 22, item 1), then frees them and loads again.

Each batch is larger than the one before, so every batch arrives in a new slot whose
descriptor must be received. After the first batch the program fills its descriptor table
(a low ``RLIMIT_NOFILE``, then ``/dev/null`` opened until ``EMFILE``), leaving FREE free, and
reads on. It prints one JSON line: what the rest of the epoch raised (or that it finished),
how long that took, and whether a new epoch, with descriptors free again, is complete and on
the same worker processes.

    python tests/scripts/h3_fd_limit.py FREE
"""

from __future__ import annotations

import errno
import faulthandler
import json
import os
import resource
import sys
import time

import numpy as np

from shardloader import ShardedDataLoader

WIDTH = 8192  # 32 KiB a sample
BATCHES = [list(range(k * (k + 1) // 2, (k + 1) * (k + 2) // 2)) for k in range(12)]


class Wide:
    def __len__(self):
        return BATCHES[-1][-1] + 1

    def __getitem__(self, i):
        return np.full((WIDTH,), i, dtype=np.float32), i


def labels(batches):
    return [int(v) for _, y in batches for v in y.asnumpy()]


def fill_descriptors(free: int):
    """Open /dev/null until the descriptor limit, then close ``free`` of them again."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
    held = []
    while True:
        try:
            held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE, exc
            break
    for _ in range(free):
        os.close(held.pop())
    return held, (soft, hard)


def main(free: int) -> None:
    faulthandler.dump_traceback_later(60, exit=True)  # a hang says where, then exits
    loader = ShardedDataLoader(
        Wide(), batch_sampler=BATCHES, num_workers=2, start_method="fork", prefetch=1, timeout=20
    )
    it = iter(loader)
    got = labels([next(it)])
    pids = loader.worker_pids()
    held, limits = fill_descriptors(free)
    start = time.monotonic()
    outcome = {}
    try:
        got += labels(list(it))
        outcome["rest"] = "complete" if got == list(range(len(Wide()))) else f"wrong: {got}"
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        outcome.update(
            rest="raised",
            type=type(exc).__name__,
            mro=[c.__name__ for c in type(exc).__mro__],
            errno=getattr(exc, "errno", None),
            message=str(exc),
        )
    outcome["seconds"] = time.monotonic() - start
    for fd in held:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    del it
    outcome["again"] = labels(loader) == list(range(len(Wide())))
    outcome["same_workers"] = loader.worker_pids() == pids
    outcome["limit"] = limits[0]
    loader.close()
    faulthandler.cancel_dump_traceback_later()
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
