"""``PrefetchingIter``: ``mx.io.PrefetchingIter`` on a ``shardloader.prefetch`` thread."""

from __future__ import annotations

import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import mxnet as mx
from mxnet.io import DataBatch, DataIter

from .._errors import LoaderTimeoutError
from .._validate import check_int
from ..prefetch import PrefetchIterator
from ._arrays import _batch_axis, _renamed
from ._base import _CurrentBatch
from ._loader_iter import LoaderDataIter

_Rename = Optional[Dict[str, str]]


def _renames(rename: Any, count: int, arg: str) -> List[_Rename]:
    """One rename map (or None) per iterator."""
    if rename is None:
        return [None] * count
    if isinstance(rename, dict):
        rename = [rename]
    rename = list(rename)
    if len(rename) != count or not all(r is None or isinstance(r, dict) for r in rename):
        raise ValueError(f"{arg} must be a list of {count} dicts (one per iterator), got {rename}")
    return rename


def _check_iters(data_iter: Union[DataIter, Sequence[DataIter]]) -> List[DataIter]:
    """The iterator(s) to wrap, as a non-empty list of ``DataIter``-like objects."""
    iters = list(data_iter) if isinstance(data_iter, (list, tuple)) else [data_iter]
    if not iters:
        raise ValueError("data_iter must be a DataIter or a non-empty list of them")
    for i, it in enumerate(iters):
        if not (hasattr(it, "next") and hasattr(it, "reset") and hasattr(it, "provide_data")):
            raise TypeError(
                f"data_iter[{i}] must be an mx.io.DataIter (with next, reset and "
                f"provide_data), got {type(it).__name__}"
            )
    return iters


class _Wrapped:
    """What the prefetch thread needs to know about one wrapped iterator."""

    __slots__ = ("it", "data", "label", "rename_data", "rename_label", "copy")

    def __init__(self, it: DataIter, rename_data: _Rename, rename_label: _Rename, copy: bool):
        self.it = it
        self.rename_data, self.rename_label = rename_data, rename_label
        self.data = _renamed(it.provide_data, rename_data)
        self.label = _renamed(getattr(it, "provide_label", None) or [], rename_label)
        self.copy = copy


def _start_epochs(wrapped: List[_Wrapped]) -> Optional[Exception]:
    """Caller side, before the thread starts: start each ``LoaderDataIter``'s epoch here.

    A loader with worker processes forks them when its epoch starts. Forked from the
    prefetch thread, they could be forked while the caller's thread is inside MXNet (binding
    a module, an update), and MXNet's own fork handlers (they stop and restart its engine)
    then lose an operation or hand the worker a lock held for ever: the training process or
    the worker hangs. Started here, the fork happens while the caller is in this call. An
    error is returned, for the thread to raise at its position (before the first batch)."""
    try:
        for w in wrapped:
            if isinstance(w.it, LoaderDataIter):
                w.it.start_epoch()
    except Exception as exc:
        return exc
    return None


def _combined_batches(
    wrapped: List[_Wrapped], failed: Optional[Exception] = None
) -> Iterator[DataBatch]:
    """Thread side: one combined ``DataBatch`` per step of the wrapped iterators (``failed``:
    the error of ``_start_epochs``, raised first)."""
    if failed is not None:
        raise failed
    step = 0
    while True:
        batches = []
        for w in wrapped:
            try:
                batches.append(w.it.next())
            except StopIteration:
                batches.append(None)
        ended = [b is None for b in batches]
        if all(ended):
            return
        if any(ended):
            raise ValueError(
                f"the wrapped iterators have different lengths: iterator(s) "
                f"{[i for i, e in enumerate(ended) if e]} ended at batch {step}, the others did not"
            )
        yield _combine(wrapped, batches, step)
        step += 1


def _combine(wrapped: List[_Wrapped], batches: List[DataBatch], step: int) -> DataBatch:
    data, label, data_descs, label_descs = [], [], [], []
    for w, b in zip(wrapped, batches):
        if b.pad != batches[0].pad:
            raise ValueError(
                f"the wrapped iterators disagree on the pad of batch {step}: "
                f"{[x.pad for x in batches]}"
            )
        arrays, labels = list(b.data), list(b.label or [])
        if w.copy:  # C++ iterators recycle their output buffers a few batches later
            arrays, labels = [a.copy() for a in arrays], [a.copy() for a in labels]
        data += arrays
        label += labels
        data_descs += w.data if b.provide_data is None else _renamed(b.provide_data, w.rename_data)
        label_descs += (
            w.label if b.provide_label is None else _renamed(b.provide_label, w.rename_label)
        )
    first = batches[0]
    return DataBatch(
        data,
        label,
        pad=first.pad,
        index=first.index,
        bucket_key=first.bucket_key,
        provide_data=data_descs,
        provide_label=label_descs,
    )


class PrefetchingIter(_CurrentBatch):
    """Prefetch one or more ``DataIter`` s on a background thread, safely.

    A drop-in for ``mx.io.PrefetchingIter``: several iterators are read in lock step and
    combined into one ``DataBatch`` (their data lists joined, then their label lists; ``pad``
    and ``index`` from the first). Unlike MXNet's, it never hangs and never races:

    * loading starts in the constructor;
    * the epoch of each wrapped ``LoaderDataIter`` starts on the calling thread (in the
      constructor and in ``reset()``), so a loader's worker processes are never forked from
      the prefetch thread while the caller is inside MXNet (see docs/dataiter.md);
    * any exception raised by a wrapped iterator is re-raised by ``next()`` with its
      traceback, after the batches before it; ``next()`` then raises ``StopIteration``
      until ``reset()``;
    * ``reset()`` at any point stops the thread, drops prefetched batches, resets the wrapped
      iterators and starts again;
    * ``close()``, a ``with`` block or garbage collection stop the thread.

    Parameters
    ----------
    data_iter : DataIter or list of DataIter
        The iterator(s) to read. All must yield the same number of batches with equal pads.
    buffer_size : int, default 2
        The most combined batches read ahead of the consumer.
    rename_data, rename_label : list of dict, optional
        One ``{old_name: new_name}`` map per iterator (a single dict for a single iterator);
        names not in a map are kept.
    copy : bool, optional
        Copy every batch's arrays on the thread. The default copies for C++-backed iterators
        (``mx.io.MXDataIter``: ``ImageRecordIter``, ``CSVIter``, ...), which overwrite a
        batch's memory a few ``next()`` calls later, and not for Python iterators.

    Examples
    --------
    >>> import mxnet as mx
    >>> a = mx.io.NDArrayIter(mx.nd.ones((8, 2)), batch_size=4)
    >>> b = mx.io.NDArrayIter(mx.nd.zeros((8, 3)), batch_size=4)
    >>> with PrefetchingIter([a, b], rename_data=[{"data": "a"}, {"data": "b"}]) as it:
    ...     [d.name for d in it.provide_data], sum(1 for _ in it)
    (['a', 'b'], 2)
    """

    _kind = "PrefetchingIter"

    def __init__(
        self,
        data_iter: Union[DataIter, Sequence[DataIter]],
        buffer_size: int = 2,
        rename_data: Optional[Sequence[Dict[str, str]]] = None,
        rename_label: Optional[Sequence[Dict[str, str]]] = None,
        *,
        copy: Optional[bool] = None,
    ) -> None:
        iters = _check_iters(data_iter)
        self._buffer_size = check_int("buffer_size", buffer_size, 1)
        self.iters = iters
        self._wrapped = [
            _Wrapped(it, rd, rl, isinstance(it, mx.io.MXDataIter) if copy is None else copy)
            for it, rd, rl in zip(
                iters,
                _renames(rename_data, len(iters), "rename_data"),
                _renames(rename_label, len(iters), "rename_label"),
            )
        ]
        self._provide_data = [d for w in self._wrapped for d in w.data]
        self._provide_label = [d for w in self._wrapped for d in w.label]
        first = iters[0]
        size = (
            getattr(first, "batch_size", 0)
            or self._provide_data[0].shape[_batch_axis(self._provide_data[0])]
        )
        super().__init__(size)
        self._current: Optional[DataBatch] = None
        self._closed = False
        self._prefetched = self._start()

    def _start(self) -> PrefetchIterator:
        failed = _start_epochs(self._wrapped)
        return PrefetchIterator(
            _combined_batches(self._wrapped, failed), self._buffer_size, name="dataiter"
        )

    def next(self) -> DataBatch:
        """The next combined batch; re-raises any error from the wrapped iterators."""
        self._check_open("trying to advance")
        self._current = next(self._prefetched)
        return self._current

    def reset(self) -> None:
        """Stop the thread, drop what it read, reset the wrapped iterators and restart.

        Raises
        ------
        LoaderTimeoutError
            If the thread is still inside a wrapped iterator's ``next()`` after
            ``close()`` waited for it (seconds); resetting then would race with it.
        """
        self._check_open("cannot reset")
        start = time.monotonic()
        self._prefetched.close()
        if self._prefetched.running:
            elapsed = time.monotonic() - start
            raise LoaderTimeoutError(
                f"PrefetchingIter.reset(): the prefetch thread is still inside a wrapped "
                f"iterator's next() after {elapsed:.1f} s, so the iterators cannot be reset "
                "safely; call reset() again once it returns",
                elapsed=elapsed,
            )
        self._current = None
        for it in self.iters:
            it.reset()
        self._prefetched = self._start()

    def close(self) -> None:
        """Stop the thread and drop prefetched batches; idempotent."""
        self._closed = True
        self._prefetched.close()
