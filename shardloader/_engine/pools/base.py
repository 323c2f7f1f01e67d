"""The ``Pool`` protocol both pools implement (``process.ProcessPool``,
``thread.ThreadPool``), and what both use: fresh seed material, and whether the interpreter
is shutting down. See the package's docstring for the shutdown protocol."""

from __future__ import annotations

import os
import sys
from typing import Any, List, Optional, Protocol, Tuple

from ..batch import FirstBatchTurn
from ..protocol import Result, Task, WorkerLost

__all__ = ["Pool", "fresh_entropy", "finalizing"]


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
        """Hand ``task`` to a worker and return: it never waits for the work itself, nor for
        a worker to be free. A process pool writes the task into the least-loaded worker's
        pipe under the pool's lock (a short wait when a pipe is full); a thread pool puts
        it on an unbounded queue."""

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

    def first_batch_turn(self) -> Optional[FirstBatchTurn]:
        """The batch that holds up every other one now, its ``batch`` an ``(iter_id, seq)``:
        threads sharing a dataset make their first batch one at a time (lazy set-up), and
        none in parallel before it is done. None when there is none (always for processes,
        which share nothing)."""

    def close(self) -> None:
        """The shutdown protocol above; idempotent."""


def fresh_entropy() -> int:
    """Seed material for workers when the user gave no seed: distinct on every call."""
    return int.from_bytes(os.urandom(7), "little")


def finalizing() -> bool:
    return sys.is_finalizing()
