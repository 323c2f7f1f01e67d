"""Every timing constant of the data path, in one place, each with its unit in its name.

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

__all__ = ["EPOCH_POLL_S", "PREFETCH_JOIN_S", "PREFETCH_POLL_S", "TINY_BATCH_S"]
