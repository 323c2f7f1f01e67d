"""Worker pools: processes (``process.ProcessPool``) or threads (``thread.ThreadPool``),
behind one protocol, ``Pool``. The epoch above them (``router``, ``epoch``) never learns
which kind it drives.

Shutdown protocol (docs/design.md, "Ownership and shutdown"): one ordered, idempotent
``close()``, also run by ``weakref.finalize`` on garbage collection and at interpreter exit:
set the stop flag; ask every worker to exit; join each with a timeout; terminate, then kill,
whatever is left; close every pipe; unmap every shared-memory slot not still held by a batch
the user kept. Joins are skipped while the interpreter is finalizing.

Nothing here blocks indefinitely: every wait has a timeout, after which the caller checks
its own stop conditions and whether workers are alive (invariant 3).

A pool that has lost a worker it did not replace reports itself ``closed``, so the loader
never keeps a pool with fewer workers than it asked for (or none at all): the next epoch
starts a fresh one.
"""

from __future__ import annotations

import os
import sys
from typing import Any, List, Protocol, Tuple

from ..protocol import Result, Task, WorkerLost

__all__ = ["Pool", "ProcessPool", "ThreadPool"]


class Pool(Protocol):
    """What an epoch needs of a pool."""

    kind: str  # "process" or "thread", for messages
    num_workers: int

    @property
    def closed(self) -> bool:
        """Closed, or short of a worker: it cannot serve another epoch."""

    @property
    def can_restart(self) -> bool:
        """Whether ``restart`` may replace a dead worker."""

    @property
    def bytes_delivered(self) -> int:
        """Bytes this pool has handed over through shared memory (0 for threads)."""

    def submit(self, task: Task) -> None:
        """Queue ``task`` for a worker; never blocks."""

    def poll(self, timeout: float) -> Tuple[List[Result], List[WorkerLost]]:
        """Wait up to ``timeout`` seconds for results or worker deaths. A pool keeps only
        which batches each worker owes, as ``(iter_id, seq)``: a ``WorkerLost`` names those
        (the router's registry has their indices)."""

    def restart(self, worker_id: int) -> None:
        """Replace a worker that died."""

    def materialize(self, result: Result) -> Any:
        """The batch of an ok result, as the user gets it."""

    def discard(self, result: Result) -> None:
        """Drop a result nobody will read, freeing its memory."""

    def pids(self) -> List[int]:
        """The worker processes' pids (none for threads)."""

    def close(self) -> None:
        """The shutdown protocol above; idempotent."""


def fresh_entropy() -> int:
    """Seed material for workers when the user gave no seed: distinct on every call."""
    return int.from_bytes(os.urandom(7), "little")


def finalizing() -> bool:
    return sys.is_finalizing()


from .process import ProcessPool  # noqa: E402 - the submodules use the names above
from .thread import ThreadPool  # noqa: E402
