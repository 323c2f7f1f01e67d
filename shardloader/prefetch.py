"""Prefetch any iterable on a background thread: ``Prefetcher`` and ``DevicePrefetcher``.

``prefetch(iterable)`` returns a ``PrefetchIterator`` that owns exactly one daemon thread.
The thread starts pulling from the source at once (warm start), so the first items are ready
by the time the training loop asks for them. Stages compose, because a
``PrefetchIterator`` is itself an iterable with ``close()``::

    raw -> Prefetcher -> DevicePrefetcher -> consumer

The protocol, in one place
--------------------------
Back-pressure
    A semaphore holds ``buffer_size`` slots. The thread takes a slot before it pulls an item
    and the consumer gives it back when it takes the item, so at most ``buffer_size`` items
    have been pulled from the source and not yet handed out. (For C++ data iterators, which
    recycle their output buffers, this bound is what keeps handed-out batches intact.)
Ending
    After the last item the thread puts a private sentinel (``_END``) on the queue. A source
    exception is caught on the thread, wrapped in a private ``_Raised`` record and re-raised in
    the consumer, at the position where it happened, as the original exception object with
    its original traceback. Either way the iterator is then finished: ``next()`` raises
    ``StopIteration``. The thread closes its source (if the source has ``close()``) before it
    exits, because it is the only thread that ever touches the source.
Never blocking forever
    Every wait on the queue or on a slot lasts at most ``PREFETCH_POLL_S`` and then re-checks
    the stop event (thread side) or whether the thread is still alive (consumer side). A
    thread that died without a sentinel becomes a ``shardloader.WorkerError``.
Shutdown
    ``close()``, the end of the data, and garbage collection all run ``_shutdown`` through one
    ``weakref.finalize``, so it runs at most once: set the stop event, wake the thread, ask a
    source that can be cancelled (a loader's epoch: ``cancel()``) to stop waiting for its next
    item, drop buffered items (their memory is released now, not when the iterator is
    collected), join with ``PREFETCH_JOIN_S``, and drain once more. The thread holds the
    queue, the event, the semaphore and the source, never the iterator object, so an
    iterator that is dropped without ``close()`` is collected and its thread stops. Joins
    are skipped while the interpreter is finalizing. After ``close()``, ``next()`` raises
    ``shardloader.ClosedIteratorError``.
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
import warnings
import weakref
from functools import partial
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from ._compat import DeviceType
from ._engine import device as _device
from ._engine import timing
from ._engine.stage import Stage
from ._engine.stage import cancel as _cancel
from ._errors import WorkerError
from ._validate import check_int

__all__ = ["Prefetcher", "DevicePrefetcher", "PrefetchIterator"]

_thread_ids = itertools.count()


class _End:
    """The type of the end-of-data sentinel; never exposed to users."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<end of prefetched data>"


_END = _End()


class _Raised:
    """A source exception on its way from the thread to the consumer."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _wait_for_slot(slots: threading.Semaphore, stop: threading.Event) -> bool:
    """Take a free slot; False if the iterator was stopped meanwhile."""
    while not slots.acquire(timeout=timing.PREFETCH_POLL_S):
        if stop.is_set():
            return False
    return not stop.is_set()


def _close_source(source: Any, outcome: Any) -> Any:
    """Close the source if it can be closed; an error there becomes the outcome if none yet."""
    close = getattr(source, "close", None)
    if close is None:
        return outcome
    try:
        close()
    except BaseException as exc:
        if outcome is _END:
            return _Raised(exc)
        warnings.warn(
            f"closing the source of a prefetch thread raised {exc!r}", RuntimeWarning, stacklevel=1
        )
    return outcome


def _produce(
    source: Any,
    items: queue.SimpleQueue,
    slots: threading.Semaphore,
    stop: threading.Event,
    transform: Optional[Callable[[Any], Any]],
) -> None:
    """Thread body: pull, transform and enqueue items until the end, an error or a stop."""
    outcome: Any = _END
    item = None
    try:
        while True:
            if not _wait_for_slot(slots, stop):
                outcome = None
                break
            try:
                item = next(source)
            except StopIteration:
                break
            if stop.is_set():
                outcome = None
                break
            if transform is not None:
                item = transform(item)
            items.put(item)
            item = None  # don't keep the last batch alive after the consumer drops it
    except BaseException as exc:
        outcome = _Raised(exc)
    item = None
    outcome = _close_source(source, outcome)
    if outcome is not None:
        items.put(outcome)


def _raisable(exc: BaseException) -> BaseException:
    """The exception to raise in the consumer: the source's own, traceback and all."""
    if isinstance(exc, StopIteration):
        # PEP 479: a StopIteration from a transform must not pass for the end of the data.
        error = RuntimeError("the prefetch source raised StopIteration")
        error.__cause__ = exc
        return error
    return exc


def _drain(items: queue.SimpleQueue) -> None:
    """Drop everything buffered so the memory of prefetched items is released now."""
    while True:
        try:
            items.get_nowait()
        except queue.Empty:
            return


def _shutdown(
    items: queue.SimpleQueue,
    slots: threading.Semaphore,
    stop: threading.Event,
    thread: threading.Thread,
    source: Any,
) -> bool:
    """Stop, drain, join (bounded) and drain again; True if the thread has ended."""
    stop.set()
    slots.release()  # wake a thread waiting for a free slot right away
    _cancel(source)  # and one waiting inside a loader epoch's next()
    _drain(items)
    if sys.is_finalizing() or thread is threading.current_thread():
        return not thread.is_alive()
    thread.join(timing.PREFETCH_JOIN_S)
    _drain(items)
    if thread.is_alive():
        warnings.warn(
            f"prefetch thread {thread.name} did not stop within {timing.PREFETCH_JOIN_S} s; it "
            "is still inside its source's next() and will exit as soon as that returns",
            RuntimeWarning,
            stacklevel=1,
        )
        return False
    return True


class PrefetchIterator(Stage):
    """An iterator over ``iterable`` whose items are pulled ahead on one background thread.

    Made by ``Prefetcher.prefetch`` and ``DevicePrefetcher.prefetch``. The thread
    starts in the constructor. The iterator owns the source: the thread closes it (if it has
    ``close()``) when it stops. It follows the contract of every stage of a loader's epoch
    (``close()``, ``closed``, ``with``, ``cancel()``).

    Parameters
    ----------
    iterable : iterable
        The source. ``iter()`` is called on it here, in the calling thread.
    buffer_size : int
        The most items pulled ahead of the consumer.
    transform : callable, optional
        Applied to each item on the background thread before it is queued.
    name : str
        Part of the thread's name, for debugging.
    """

    def __init__(
        self,
        iterable: Iterable,
        buffer_size: int = 2,
        transform: Optional[Callable[[Any], Any]] = None,
        name: str = "prefetch",
    ) -> None:
        buffer_size = check_int("buffer_size", buffer_size, 1)
        source = iter(iterable)
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._slots = threading.Semaphore(buffer_size)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_produce,
            args=(source, self._items, self._slots, self._stop, transform),
            name=f"shardloader-{name}-{next(_thread_ids)}",
            daemon=True,
        )
        self._thread.start()
        # Only the thread touches the source (it closes it, too); here it is only cancelled.
        self._upstream = source
        self._finalizer = weakref.finalize(
            self, _shutdown, self._items, self._slots, self._stop, self._thread, source
        )

    def _next(self) -> Any:
        item = self._take()
        if item is _END:
            raise StopIteration  # the stage ends (Stage.__next__)
        if type(item) is _Raised:
            self._end()
            exc, item = item.exc, None
            try:
                raise _raisable(exc)
            finally:
                del exc  # break the frame <-> traceback cycle
        self._slots.release()
        return item

    def _take(self) -> Any:
        """The next queued object, waiting in short slices while the thread is alive."""
        while True:
            try:
                return self._items.get(timeout=timing.PREFETCH_POLL_S)
            except queue.Empty:
                pass
            if not self._thread.is_alive():
                try:
                    return self._items.get_nowait()
                except queue.Empty:
                    self._end()
                    raise WorkerError(
                        f"prefetch thread {self._thread.name} ended without delivering an item, "
                        "an error or the end of the data"
                    ) from None

    def _release(self) -> None:
        self._finalizer()  # stop, drain, join: see the module docstring

    def cancel(self) -> None:
        """Ask a source blocked in ``next()`` to give up (the stage contract's ``cancel``)."""
        _cancel(self._upstream)

    @property
    def running(self) -> bool:
        """Whether the background thread is still alive."""
        return self._thread.is_alive()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "finished" if self._ended else "running"
        return f"<PrefetchIterator {self._thread.name} {state}>"


class Prefetcher:
    """Run any iterable on a background thread, ``buffer_size`` items ahead.

    Parameters
    ----------
    buffer_size : int, default 2
        The most items pulled from the source and not yet taken by the consumer.

    Examples
    --------
    >>> with Prefetcher(buffer_size=2).prefetch(range(5)) as it:
    ...     list(it)
    [0, 1, 2, 3, 4]
    """

    def __init__(self, buffer_size: int = 2) -> None:
        self.buffer_size = check_int("buffer_size", buffer_size, 1)

    def prefetch(self, iterable: Iterable) -> PrefetchIterator:
        """Start a thread pulling from ``iterable`` now and return an iterator over its items."""
        return PrefetchIterator(iterable, self.buffer_size, name="prefetch")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(buffer_size={self.buffer_size})"


def _place_and_wait(item: Any, ctx: DeviceType) -> Any:
    placed = _device.place(item, ctx)
    _device.wait_to_read(placed)
    return placed


def _place_shards_and_wait(step: Any, ctxs: Sequence[DeviceType]) -> Any:
    placed = _device.place_shards(step, ctxs)
    _device.wait_to_read(placed)
    return placed


class DevicePrefetcher(Prefetcher):
    """Copy items to a device on a background thread, so they arrive ready to use.

    Parameters
    ----------
    ctx : Context or list of Context
        One context: the whole item (any nested structure of NDArrays) is copied there. A
        list of contexts: every item must be a list with one batch per shard, and shard ``i``
        is copied to ``ctx[i]``. ``mx.cpu_pinned(i)`` gives page-locked host memory.
    buffer_size : int, default 2
        The most items copied ahead of the consumer.
    device : Device or list of Device, keyword-only
        MXNet 2.x's name for ``ctx``; give one of the two.

    Notes
    -----
    The thread waits for each copy to finish (``wait_to_read``) before it hands the item
    out, so the consumer never waits on a copy. numpy leaves are left where they are.

    Examples
    --------
    >>> import mxnet as mx
    >>> steps = [[mx.nd.ones((2,)), mx.nd.zeros((2,))] for _ in range(3)]
    >>> with DevicePrefetcher([mx.cpu(0), mx.cpu(1)]).prefetch(steps) as it:
    ...     [[shard.context for shard in step] for step in it][0]
    [cpu(0), cpu(1)]
    """

    def __init__(
        self,
        ctx: Union[DeviceType, Sequence[DeviceType], None] = None,
        buffer_size: int = 2,
        *,
        device: Union[DeviceType, Sequence[DeviceType], None] = None,
    ) -> None:
        super().__init__(buffer_size)
        value, name = _device.device_argument(ctx, device)
        if value is None:
            raise TypeError(
                f"DevicePrefetcher needs a {name}: an mxnet device such as mx.gpu(0), or a list "
                "of them, one per shard (ctx= and device= are both accepted); got neither"
            )
        self.ctx = _device.normalize_ctx(value, name)

    def prefetch(self, iterable: Iterable) -> PrefetchIterator:
        """Start copying items of ``iterable`` to the context(s) now; return an iterator."""
        if isinstance(self.ctx, list):
            transform = partial(_place_shards_and_wait, ctxs=list(self.ctx))
        else:
            transform = partial(_place_and_wait, ctx=self.ctx)
        return PrefetchIterator(iterable, self.buffer_size, transform=transform, name="device")

    def __repr__(self) -> str:
        return f"DevicePrefetcher(ctx={self.ctx!r}, buffer_size={self.buffer_size})"
