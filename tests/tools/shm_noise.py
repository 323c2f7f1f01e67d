"""Take shared memory and give it back, over and over, as a browser or a second training job
does: the test suite's leak check must not mistake it for a leak of the suite's own.

Run it beside the suite, from the repository root::

    .venv/bin/python tests/tools/shm_noise.py &   # 512 MB for 20 s, none for 20 s, until stopped
    make test
    kill %1

``--mb``, ``--hold-s``, ``--free-s`` and ``--cycles`` change the pattern. ``--pid-file PATH``
writes the process id to ``PATH`` once the first block is taken (its pages touched, so they
count in ``Shmem`` of ``/proc/meminfo``); ``--detach`` runs it as a process of its own, not
a child of the caller. SIGTERM, SIGINT and the end of the cycles give the memory back.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from multiprocessing import shared_memory

import numpy as np


def _take(megabytes: int) -> shared_memory.SharedMemory:
    block = shared_memory.SharedMemory(create=True, size=megabytes << 20)
    pages = np.ndarray((block.size,), dtype=np.uint8, buffer=block.buf)
    pages.fill(1)  # touched: the pages exist, not just the name
    del pages  # no view may outlive the block, or close() fails
    return block


def _give_back(block: shared_memory.SharedMemory) -> None:
    block.close()
    block.unlink()


class _Stop:
    """Set by SIGTERM or SIGINT; the loop checks it between short sleeps, so a signal never
    lands in the middle of taking or giving back the memory."""

    requested = False

    @classmethod
    def handler(cls, signum, frame) -> None:
        cls.requested = True

    @classmethod
    def wait(cls, seconds: float) -> bool:
        """Sleep up to ``seconds``; whether a stop was requested."""
        deadline = time.monotonic() + seconds
        while not cls.requested and time.monotonic() < deadline:
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
        return cls.requested


def _detach() -> None:
    """Become a process of its own (parent: init), so the caller's children don't list it."""
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=512, help="shared memory to take (MB)")
    parser.add_argument("--hold-s", type=float, default=20.0, help="seconds to hold it")
    parser.add_argument("--free-s", type=float, default=20.0, help="seconds without it")
    parser.add_argument("--cycles", type=int, default=0, help="how many times (0: until stopped)")
    parser.add_argument("--pid-file", help="write the pid here once the memory is taken")
    parser.add_argument("--detach", action="store_true", help="run apart from the caller")
    args = parser.parse_args(argv)
    if args.detach:
        _detach()
    signal.signal(signal.SIGTERM, _Stop.handler)
    signal.signal(signal.SIGINT, _Stop.handler)
    cycle = 0
    while (args.cycles == 0 or cycle < args.cycles) and not _Stop.requested:
        block = _take(args.mb)
        try:
            if cycle == 0 and args.pid_file:
                tmp = f"{args.pid_file}.tmp"
                with open(tmp, "x") as f:
                    f.write(str(os.getpid()))
                os.replace(tmp, args.pid_file)  # whole, or not there
            print(f"shm_noise: holding {args.mb} MB for {args.hold_s:g} s", flush=True)
            _Stop.wait(args.hold_s)
        finally:
            _give_back(block)
        print(f"shm_noise: free for {args.free_s:g} s", flush=True)
        cycle += 1
        if args.cycles == 0 or cycle < args.cycles:
            _Stop.wait(args.free_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
