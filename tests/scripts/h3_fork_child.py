"""A program that forks plain ``os.fork()`` children while its loader's workers run, mid-epoch
(issue 22, item 2). Each child ends as asked: ``exit`` (``sys.exit(0)``), ``end`` (its code
simply finishes), ``raise`` (an uncaught error of its own) or ``os_exit``; its stdout and
stderr go to ``CHILD_DIR/<how>.txt``. After each child the parent finishes the epoch that was
open at the fork and runs one more, on the same worker processes; after the last it runs one
more again and prints ``OK`` with the children's exit statuses.

One child of each kind, one after another, on one loader: each must leave the workers alone
for the next epochs (and the next children) to come out whole.

    python tests/scripts/h3_fork_child.py exit,end,raise,os_exit CHILD_DIR
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _datasets import RangeDataset  # noqa: E402

from shardloader import ShardedDataLoader  # noqa: E402


def labels(batches):
    return [int(v) for _, y in batches for v in y.asnumpy()]


def main(hows, child_dir: str) -> None:
    loader = ShardedDataLoader(RangeDataset(32), batch_size=4, num_workers=2, start_method="fork")
    pids = None
    statuses = []
    for how in hows:
        it = iter(loader)
        first = [next(it), next(it)]
        pids = pids or loader.worker_pids()
        faulthandler.cancel_dump_traceback_later()  # the child must not inherit it armed
        pid = os.fork()
        if pid == 0:
            fd = os.open(
                os.path.join(child_dir, f"{how}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600
            )
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            signal.alarm(30)  # a hang at its exit ends it (faulthandler's thread is not here)
            if how == "exit":
                sys.exit(0)
            if how == "raise":
                raise RuntimeError("the child's own error")
            if how == "os_exit":
                os._exit(0)
            return  # "end": the child's code simply finishes
        # (Armed after the fork: the child has no faulthandler thread to cancel.)
        faulthandler.dump_traceback_later(60, exit=True)  # a hang says where, then exits
        _, status = os.waitpid(pid, 0)
        statuses.append(f"{how}={os.waitstatus_to_exitcode(status)}")
        got = labels(first + list(it))
        assert got == list(range(32)), f"the epoch open at the {how} fork gave {got}"
        got = labels(loader)
        assert got == list(range(32)), f"the epoch after the {how} child gave {got}"
    got = labels(loader)
    assert got == list(range(32)), f"a later epoch gave {got}"
    assert loader.worker_pids() == pids, f"workers {pids} were replaced by {loader.worker_pids()}"
    loader.close()
    faulthandler.cancel_dump_traceback_later()
    print(f"OK child statuses {' '.join(statuses)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","), sys.argv[2])
