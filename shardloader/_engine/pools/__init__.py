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

from .base import Pool
from .process import ProcessPool
from .thread import ThreadPool

__all__ = ["Pool", "ProcessPool", "ThreadPool"]
