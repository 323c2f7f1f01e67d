"""A program whose main module blocks when a ``spawn`` worker imports it (issue 32, item 2):
its top level sleeps unless it runs as ``__main__``, as a top-level read of a stalled mount
would. The loader's dataset pickles to 1 MB, more than a pipe holds, so the hand-over of the
payload waits on workers that never read it.

``iter(loader)`` must fail within ``timeout`` (2 s) and a little more, naming the workers'
start-up payload, and leave no process or descriptor behind. Prints one JSON line.

    python tests/scripts/spawn_stuck_import.py
"""

from __future__ import annotations

import time

if __name__ != "__main__":
    time.sleep(600)  # a spawn worker importing this module is stuck here

import json  # noqa: E402
import os  # noqa: E402

import numpy as np  # noqa: E402

from shardloader import ShardedDataLoader  # noqa: E402

TIMEOUT_S = 2  # the hand-over never ends: any timeout shows it; a short one waits less


def main() -> None:
    from multiprocessing import resource_tracker

    import psutil

    me = psutil.Process()
    resource_tracker.ensure_running()  # spawn starts it, for good: part of the baseline
    before = set(me.children(recursive=True))
    fds_before = len(os.listdir("/proc/self/fd"))
    dataset = np.zeros((256, 1024), np.float32)  # 1 MB pickled
    loader = ShardedDataLoader(
        dataset, batch_size=4, num_workers=2, start_method="spawn", timeout=TIMEOUT_S
    )
    start = time.monotonic()
    result = {}
    try:
        next(iter(loader))
        result["outcome"] = "a batch"
    except Exception as exc:  # noqa: BLE001 - what it raised is the point
        result["outcome"] = "raised"
        result["type"] = type(exc).__name__
        result["mro"] = [c.__name__ for c in type(exc).__mro__]
        result["message"] = str(exc)
    result["seconds"] = time.monotonic() - start
    loader.close()
    deadline = time.monotonic() + 5
    while set(me.children(recursive=True)) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    result["children"] = [c.pid for c in set(me.children(recursive=True)) - before]
    result["fds_leaked"] = len(os.listdir("/proc/self/fd")) - fds_before
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
