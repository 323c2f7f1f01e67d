"""The contract every stage of an epoch follows (docs/design.md, "The data path").

An epoch is a chain of stages, each pulling from the one before it by calling it and taking
a return value: ``InlineEpoch`` or ``PooledEpoch`` (the source), then an optional placement
stage, then the consumer stage that ``iter(loader)`` returns. Every stage:

* yields items from ``__next__``; at the end of the data, or after an error that ends the
  epoch, it *ends*: it releases what it holds, closes its source, and from then on raises
  ``StopIteration``;
* has an idempotent ``close()`` that ends it the same way, so closing the last stage closes
  the whole chain;
* reports ``closed``; advancing a stage after ``close()`` raises ``ClosedIteratorError``
  with one message, whichever stage it is;
* is a context manager (``with`` closes it);
* may have ``cancel()``: safe from any thread, it asks a stage blocked in ``__next__`` on
  another thread to give up within ``timing.EPOCH_POLL_S`` (a placement thread being
  stopped). It changes nothing else; the thread that owns the stage still closes it.
"""

from __future__ import annotations

from typing import Any

from .._errors import ClosedIteratorError

__all__ = ["CLOSED_MESSAGE", "Stage", "cancel", "close"]

CLOSED_MESSAGE = "Trying to advance a closed iterator"


def close(stage: Any) -> None:
    """Close ``stage`` if it can be closed (a user's iterator may not be)."""
    closer = getattr(stage, "close", None)
    if closer is not None:
        closer()


def cancel(stage: Any) -> None:
    """Ask ``stage`` to stop waiting, from any thread, if it supports that."""
    canceller = getattr(stage, "cancel", None)
    if canceller is not None:
        canceller()


class Stage:
    """Base of the epoch's stages: ``__next__`` runs ``_next`` until the stage is closed.

    Subclasses implement ``_next()`` and, if they hold anything, ``_release()``; the source
    (if any) is closed after ``_release()``.
    """

    _source: Any = None
    _closed = False  # close() was called
    _ended = False  # released: the data ended, an error ended it, or close()

    def __iter__(self) -> Stage:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise ClosedIteratorError(CLOSED_MESSAGE)
        if self._ended:
            raise StopIteration
        try:
            return self._next()
        except StopIteration:
            self._end()
            raise

    def _next(self) -> Any:
        raise NotImplementedError

    def _release(self) -> None:
        """Free what this stage holds (buffered batches, routes); runs once, when it ends."""

    def _end(self) -> None:
        """Release what this stage holds, then close its source; runs once."""
        if self._ended:
            return
        self._ended = True
        try:
            self._release()
        finally:
            close(self._source)

    def close(self) -> None:
        """End this stage and its sources; advancing it afterwards raises
        ``ClosedIteratorError``. Idempotent. A ``__next__`` waiting on another thread is
        cancelled first: it raises ``ClosedIteratorError`` at its next check instead of
        waiting again, so it cannot keep the locks that releasing the stage needs (it
        would otherwise hold the router's lock between two short waits, and a close from
        another thread could wait for the next batch)."""
        self._closed = True
        self.cancel()
        self._end()

    def cancel(self) -> None:
        """Ask a ``__next__`` blocked on another thread to give up; passed down the chain."""
        cancel(self._source)

    @property
    def ended(self) -> bool:
        """Whether this stage has ended (its data ran out, an error ended it, or close())."""
        return self._ended

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
