"""A program whose ``os.fork()`` child calls ``next()`` on the epoch iterator it inherited
(issue 32, item 1), for each kind of loading named: ``process`` (2 forked workers), ``thread``
(2 thread workers) and ``inline``.

For each kind the parent takes batch 0 of an epoch and forks. The child calls ``next(it)``
and must get, at once, an error naming the fork and ``iter(loader)``; it then closes and
drops that iterator, runs one whole epoch of its own with ``iter(loader)``, writes what it
saw to ``CHILD_DIR/<kind>.json`` and exits with ``sys.exit(0)``. The parent then finishes
its epoch (it must be whole, in order), runs one more on the same workers, and prints one
JSON line per kind.

    python tests/scripts/fork_inherited.py process,thread,inline CHILD_DIR
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _datasets import RangeDataset  # noqa: E402

from shardloader import ShardedDataLoader  # noqa: E402


def labels(batches):
    return [int(v) for _, y in batches for v in y.asnumpy()]


def child(loader, it, path: str) -> None:
    signal.alarm(30)  # a hang ends the child (faulthandler's thread is not here)
    seen = {}
    start = time.monotonic()
    try:
        next(it)
        seen["next"] = "returned a batch"
    except Exception as exc:  # noqa: BLE001 - what it raised is the point
        seen["next"] = f"{type(exc).__name__}: {exc}"
    seen["next_s"] = time.monotonic() - start
    it.close()  # the parent's chain: nothing of it may be released here
    del it
    gc.collect()
    seen["own_epoch"] = labels(loader)  # an epoch of the child's own
    with open(path, "w") as f:
        json.dump(seen, f)
    loader.close()
    sys.exit(0)


def main(kinds, child_dir: str) -> None:
    for kind in kinds:
        loader = ShardedDataLoader(
            RangeDataset(32),
            batch_size=4,
            num_workers=0 if kind == "inline" else 2,
            thread_pool=kind == "thread",
            start_method="fork",
            timeout=20,
        )
        it = iter(loader)
        first = [next(it)]
        pids = loader.worker_pids()
        faulthandler.cancel_dump_traceback_later()  # the child must not inherit it armed
        pid = os.fork()
        if pid == 0:
            child(loader, it, os.path.join(child_dir, f"{kind}.json"))
        faulthandler.dump_traceback_later(60, exit=True)  # a hang says where, then exits
        _, status = os.waitpid(pid, 0)
        result = {"kind": kind, "child_status": os.waitstatus_to_exitcode(status)}
        try:
            result["epoch"] = labels(first + list(it))
            result["next_epoch"] = labels(loader)
            result["same_workers"] = loader.worker_pids() == pids
        except Exception as exc:  # noqa: BLE001 - reported to the test
            result["error"] = f"{type(exc).__name__}: {exc}"
        loader.close()
        faulthandler.cancel_dump_traceback_later()
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","), sys.argv[2])
