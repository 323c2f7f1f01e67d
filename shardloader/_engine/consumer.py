"""The last stage of an epoch: what ``iter(loader)`` returns.

It hands batches to the training loop, counts the time the loop waited for them
(``stats()``), raises a Ctrl-C that Python swallowed in a destructor (invariant 8), and
reports how far the epoch got to a ``Position`` record, which the loader reads for
``state_dict()``. It calls nothing on the loader.

It belongs to the process that made it. A child made with ``os.fork()`` inherits a copy of
it, and of the whole chain behind it: the parent's worker pipes, slots, threads and locks.
In the child, advancing that copy raises at once (``forked_error``), and closing it (or
collecting it) releases nothing: the chain is the parent's, whose epoch goes on whole. A new
``iter(loader)`` in the child starts an epoch of its own (docs/failures.md, "Forks").
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Optional

from .._errors import hide_internal_frames as _hide_internal_frames
from . import interrupts as _interrupts
from .stage import Stage
from .stats import Stats

__all__ = ["ConsumerStage", "Position", "forked_error"]


def forked_error(owner: int) -> RuntimeError:
    """The error for an epoch iterator advanced in a child of its ``owner`` process."""
    return RuntimeError(
        f"this loader iterator was created by process {owner} and inherited by process "
        f"{os.getpid()} through os.fork(): it drives the parent's epoch (its worker pipes, "
        f"shared memory and threads), so it cannot be advanced in the child. Call "
        f"iter(loader) anew in the child for an epoch of its own; the parent's epoch goes on "
        f"undisturbed."
    )


class Position:
    """Where one epoch stands: its number, the batches handed out, the batch sampler's state
    when it started and, once it ended, after it (what the next epoch starts from)."""

    __slots__ = ("epoch", "consumed", "start_state", "end_state", "ended")

    def __init__(self, epoch: int, consumed: int, start_state: Any) -> None:
        self.epoch = epoch
        self.consumed = consumed
        self.start_state = start_state
        self.end_state: Any = None
        self.ended = False

    def checkpoint(self) -> dict:
        """``{"epoch", "consumed", "sampler"}``: where a resumed run picks up."""
        if self.ended:
            return {"epoch": self.epoch + 1, "consumed": 0, "sampler": self.end_state}
        return {"epoch": self.epoch, "consumed": self.consumed, "sampler": self.start_state}


class ConsumerStage(Stage):
    """Hands an epoch's batches to one consumer at a time.

    Parameters
    ----------
    source : Stage
        The epoch's batches, already placed where they go.
    position : Position
        Updated as batches are handed out and when the epoch ends.
    stats : Stats
        The loader's counters (wait time, batches).
    end_state : callable
        The batch sampler's state, read once when the epoch ends.
    length : callable
        ``len()`` of the epoch (the loader's length).
    then : callable, optional
        Run once when the epoch ends (``auto_reload`` starts the next epoch here, as
        Gluon 1.9.1 does at the end of its iterator).
    """

    def __init__(
        self,
        source: Any,
        position: Position,
        stats: Stats,
        end_state: Callable[[], Any],
        length: Callable[[], int],
        then: Optional[Callable[[], Any]] = None,
    ) -> None:
        self._source = source
        self.position = position
        self._stats = stats
        self._end_state = end_state
        self._length = length
        self._then = then
        # One consumer at a time: two threads advancing one epoch would race on its state.
        self._busy = threading.Lock()
        self._owner = os.getpid()  # a child made with os.fork() gets a copy, not the epoch

    @property
    def epoch(self) -> int:
        return self.position.epoch

    def __next__(self) -> Any:
        # Before the lock: a thread of the parent may have held it at the fork.
        if os.getpid() != self._owner:
            raise forked_error(self._owner)
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(
                "this loader iterator is being advanced by another thread; an epoch "
                "iterator belongs to one consumer at a time (give each thread its own "
                "iter(loader), or hand the iterator over between batches)"
            )
        try:
            return super().__next__()
        except StopIteration:
            raise
        except Exception as error:
            _hide_internal_frames(error)  # raised from the user's frame, the stages left out
            raise error
        finally:
            self._busy.release()

    next = __next__

    def close(self) -> None:
        """End the epoch and release it (``Stage.close``). In a child made with
        ``os.fork()``, only mark this copy closed: what the chain holds is the parent's."""
        if os.getpid() != self._owner:
            self._closed = True
            return
        super().close()

    def cancel(self) -> None:
        if os.getpid() == self._owner:
            super().cancel()

    def _next(self) -> Any:
        if _interrupts.pending:
            _interrupts.raise_pending()
        stats = self._stats
        start = time.perf_counter()
        if stats.started is None:
            stats.started = start
        try:
            batch = next(self._source)
        except StopIteration:
            self._finish()
            raise
        if _interrupts.pending:  # swallowed while this batch was on its way: not consumed
            _interrupts.raise_pending()
        waited = time.perf_counter() - start
        stats.wait_s += waited
        if stats.first_batch_s is None:
            stats.first_batch_s = waited
        stats.batches += 1
        self.position.consumed += 1
        return batch

    def _finish(self) -> None:
        """The data ended: record where the next epoch starts, then run ``then``."""
        position = self.position
        position.end_state = self._end_state()
        position.ended = True
        self._end()
        then, self._then = self._then, None
        if then is not None:
            then()

    def __len__(self) -> int:
        return self._length()
