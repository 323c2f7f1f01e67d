"""Every timing constant of the data path, in one place, each with its unit in its name.

Modules read them as ``timing.NAME`` when they wait, not at import, so a test can lower one
with ``monkeypatch.setattr(timing, NAME, ...)``. (The launcher's own intervals are not the
data path, and stay in ``shardloader.launch``.)

A wait anywhere on the data path is bounded by one of these (docs/design.md, invariant 3):
after it, the waiting code re-checks its stop conditions, its deadline and whether the
workers it waits for are alive.
"""

from __future__ import annotations

# --- the consumer side (epoch, router, prefetch)
# Longest single wait on a worker pool before an epoch re-checks its deadline, whether it
# was cancelled (a placement thread being stopped) and the workers' health. It also bounds
# how long stopping a placement thread waits for the batch it was waiting on.
EPOCH_POLL_S = 0.1
# Longest single wait of a prefetch thread (for a free slot) or of its consumer (for an
# item) before re-checking the stop event or whether the thread is alive.
PREFETCH_POLL_S = 0.05
# How long closing a prefetch stage waits for its thread to finish the item it is pulling.
PREFETCH_JOIN_S = 5.0
# Batches cheaper than this (worker time) are sent several to a task, so the per-message
# cost of waking a worker and reading its reply is shared between them.
TINY_BATCH_S = 0.0005

# --- the pools (pools.process, pools.thread): their shutdown
# How long a worker is given to exit after being asked to (STOP, or a thread's None).
JOIN_TIMEOUT_S = 2.0
# How long after SIGTERM (or SIGKILL) a worker process is waited for before moving on.
TERMINATE_TIMEOUT_S = 1.0

# --- the workers (worker, lifeline)
# How often an idle worker process checks that its parent is still alive (it may have been
# reparented with no signal: the parent-death signal is not always armed).
WORKER_PARENT_CHECK_S = 0.5
# How often an idle thread worker re-checks its pool's stop flag.
THREAD_WORKER_POLL_S = 0.1
# How often a worker's lifeline checks on the main process where no pidfd can be had.
LIFELINE_POLL_S = 0.5

# --- shared memory (ipc.lease): MXNet's releases of arrays over slots
# How often the background reaper checks outstanding leases (a slot goes home this late
# at most when the consumer is not reading batches).
REAP_INTERVAL_S = 0.02
# How long the background reaper waits with no lease before its thread exits.
REAPER_LINGER_S = 1.0

__all__ = [
    "EPOCH_POLL_S",
    "JOIN_TIMEOUT_S",
    "LIFELINE_POLL_S",
    "PREFETCH_JOIN_S",
    "PREFETCH_POLL_S",
    "REAPER_LINGER_S",
    "REAP_INTERVAL_S",
    "TERMINATE_TIMEOUT_S",
    "THREAD_WORKER_POLL_S",
    "TINY_BATCH_S",
    "WORKER_PARENT_CHECK_S",
]
