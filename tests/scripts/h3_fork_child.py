"""A program that forks a plain ``os.fork()`` child while its loader's workers run, mid-epoch
(issue 22, item 2). The child ends as asked: ``exit`` (``sys.exit(0)``), ``end`` (its code
simply finishes), ``raise`` (an uncaught error of its own) or ``os_exit``; its stdout and
stderr go to CHILD_OUTPUT. The parent then finishes the epoch and runs two more, on the same
worker processes, and prints ``OK`` with the child's exit status.

    python tests/scripts/h3_fork_child.py exit|end|raise|os_exit CHILD_OUTPUT
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


def main(how: str, child_output: str) -> None:
    loader = ShardedDataLoader(RangeDataset(32), batch_size=4, num_workers=2, start_method="fork")
    it = iter(loader)
    first = [next(it), next(it)]
    pids = loader.worker_pids()
    pid = os.fork()
    if pid == 0:
        fd = os.open(child_output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
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
    got = labels(first + list(it))
    assert got == list(range(32)), f"the epoch open at the fork gave {got}"
    for _ in range(2):
        got = labels(loader)
        assert got == list(range(32)), f"a later epoch gave {got}"
    assert loader.worker_pids() == pids, f"workers {pids} were replaced by {loader.worker_pids()}"
    loader.close()
    faulthandler.cancel_dump_traceback_later()
    print(f"OK child status {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
