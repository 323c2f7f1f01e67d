"""The ``mx.io.DataIter`` world: ``Module.fit`` over a loader, and a prefetching iterator.

``LoaderDataIter`` turns any re-iterable of batches (a shardloader loader, a Gluon
``DataLoader``, a list of batches) into a ``DataIter`` with ``provide_data``/``provide_label``,
fixed-size padded batches and a ``reset()`` that works at any point.

``PrefetchingIter`` is a drop-in for ``mx.io.PrefetchingIter`` that cannot hang: it runs
the wrapped iterators on one ``shardloader.prefetch.PrefetchIterator`` thread, so an
error in any of them reaches the consumer with its traceback, ``reset()`` stops the thread
before it touches the iterators, and ``close()``, a ``with`` block or garbage collection stop
the thread.
"""

from __future__ import annotations

import collections.abc
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import mxnet as mx
import numpy as np
from mxnet.io import DataBatch, DataDesc, DataIter
from mxnet.ndarray import NDArray

from ._compat import device_of
from ._engine.ipc.alloc import numpy_mode
from ._errors import ClosedIteratorError, LoaderTimeoutError
from ._validate import check_int
from .prefetch import PrefetchIterator

__all__ = ["LoaderDataIter", "PrefetchingIter"]

_DEFAULT_DATA_NAMES = ("data",)
_DEFAULT_LABEL_NAMES = ("softmax_label",)
_Descs = List[DataDesc]


def _names(value: Union[str, Sequence[str], None], default: Sequence[str], arg: str) -> List[str]:
    """Normalise a name or list of names, naming the argument in errors."""
    if value is None:
        return list(default)
    if isinstance(value, str):
        return [value]
    names = list(value)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{arg} must be a str or a list of str, got an item {name!r}")
    return names


def _as_desc(desc: Any, arg: str) -> DataDesc:
    """A ``DataDesc`` from a ``DataDesc`` or a ``(name, shape)`` pair."""
    if isinstance(desc, DataDesc):
        return desc
    if isinstance(desc, (list, tuple)) and len(desc) == 2 and isinstance(desc[0], str):
        return DataDesc(desc[0], tuple(desc[1]))
    raise TypeError(f"{arg} must hold mx.io.DataDesc objects or (name, shape) pairs, got {desc!r}")


def _batch_axis(desc: DataDesc) -> int:
    axis = DataDesc.get_batch_axis(getattr(desc, "layout", None))
    return max(axis, 0)


def _same_dtype(a: Any, b: Any) -> bool:
    return np.dtype(a) == np.dtype(b)


class _CurrentBatch(DataIter):
    """The ``DataIter`` accessors, answered from the batch the last ``next()`` returned and
    from the descriptions the subclass built."""

    _current: DataBatch
    _provide_data: _Descs
    _provide_label: _Descs

    @property
    def provide_data(self) -> _Descs:
        """The name, shape (with the full batch size), dtype and layout of each data field."""
        return self._provide_data

    @property
    def provide_label(self) -> _Descs:
        """The name, shape (with the full batch size), dtype and layout of each label field."""
        return self._provide_label

    def iter_next(self) -> bool:
        try:
            self.next()
        except StopIteration:
            return False
        return True

    def getdata(self) -> List[NDArray]:
        return self._current.data

    def getlabel(self) -> List[NDArray]:
        return self._current.label

    def getindex(self) -> Any:
        return self._current.index

    def getpad(self) -> int:
        return self._current.pad


class LoaderDataIter(_CurrentBatch):
    """An ``mx.io.DataIter`` over a re-iterable of batches, for ``Module.fit`` and friends.

    Each batch from ``loader`` is ``(data..., label...)`` as a list or tuple, a dict keyed by
    name, or a single array when there is one data field and no label. Fields may be NDArrays
    or numpy arrays. A batch shorter than ``batch_size`` (the last one, usually) is padded to
    full size as ``mx.io.NDArrayIter`` pads: ``pad`` filler rows are appended, copied from the
    start of the same batch, so the shapes ``Module`` was bound with never change.

    Parameters
    ----------
    loader : iterable
        A re-iterable of batches: ``iter(loader)`` is called once per epoch. An iterator
        (which can be read only once) is refused. Only iteration is required; ``len()``,
        ``loader.batch_size``, ``loader._dataset`` and ``close()`` on the epoch's iterator are
        used when present.
    data_names : str or list of str, default ``('data',)``
        Names of the data fields, in batch order. Taken from ``provide_data`` if that is given.
    label_names : str or list of str, default ``('softmax_label',)``
        Names of the label fields, after the data fields. ``()`` for unlabeled data.
    provide_data, provide_label : list of DataDesc, optional
        Descriptions of the fields with the full batch size. Inferred when left out (see Notes).
        Batches are cast to the dtypes given here.
    batch_size : int, optional
        The full batch size. Defaults to ``loader.batch_size``, then to the batch axis of
        ``provide_data``, then to the size of the first batch.
    dtype : str or numpy dtype or None, default ``'float32'``
        The dtype of inferred descriptions, and so of the batches handed out. ``float32``
        matches ``NDArrayIter`` and what ``SoftmaxOutput`` expects of its label; ``None``
        keeps the dtypes the loader produces.
    layout : str, default ``'NCHW'``
        The layout of inferred descriptions; its ``N`` is the batch axis.

    Notes
    -----
    Descriptions that are not given are inferred once, in the constructor:

    * If ``loader._dataset`` exists and the batch size is known (``batch_size`` or
      ``loader.batch_size``), the shapes come from ``dataset[0]`` with the batch axis
      inserted, as a default batchify would stack it. No epoch is started. A tuple sample
      gives one field per item, a dict sample one field per key, anything else one field.
    * Otherwise the first batch of the first epoch is read. That batch and its epoch are kept
      and handed out by the first ``next()``, so no work is wasted.

    Pass ``provide_data``/``provide_label`` when the batchify function changes shapes (e.g.
    padding to the longest sequence): shapes inferred from one sample cannot know that.
    Batches whose non-batch shapes differ from the descriptions are still handed out, with
    their own ``provide_data``, so ``Module`` reshapes for them.

    ``index`` in each ``DataBatch`` is the position of every row within the epoch (numpy
    ``int64``; filler rows repeat the positions they were copied from).

    Examples
    --------
    >>> import mxnet as mx, numpy as np
    >>> X, y = np.random.rand(10, 3).astype("float32"), np.arange(10) % 2
    >>> loader = mx.gluon.data.DataLoader(mx.gluon.data.ArrayDataset(X, y), batch_size=4)
    >>> it = LoaderDataIter(loader, batch_size=4)
    >>> it.provide_data
    [DataDesc[data,(4, 3),<class 'numpy.float32'>,NCHW]]
    >>> [batch.pad for batch in it]
    [0, 0, 2]
    """

    def __init__(
        self,
        loader: Any,
        data_names: Union[str, Sequence[str], None] = None,
        label_names: Union[str, Sequence[str], None] = None,
        provide_data: Optional[Sequence[Any]] = None,
        provide_label: Optional[Sequence[Any]] = None,
        batch_size: Optional[int] = None,
        dtype: Any = "float32",
        layout: str = "NCHW",
    ) -> None:
        if isinstance(loader, collections.abc.Iterator) or not isinstance(
            loader, collections.abc.Iterable
        ):
            raise TypeError(
                "loader must be re-iterable (a DataLoader, a list of batches, ...), so that "
                f"every epoch can call iter() on it; got {type(loader).__name__}"
            )
        if batch_size is not None:
            batch_size = check_int("batch_size", batch_size, 1)
        if not isinstance(layout, str) or "N" not in layout:
            raise ValueError(f"layout must be a str with an 'N' (batch) axis, got {layout!r}")
        super().__init__(batch_size or 0)
        self._loader = loader
        self._dtype = None if dtype is None else np.dtype(dtype).type
        self._layout = layout
        self._epoch: Optional[Iterator] = None
        self._pending: Any = None  # a batch read ahead to infer shapes, not handed out yet
        self._position = 0  # rows handed out in this epoch
        self._ended = False  # this epoch has raised StopIteration; reset() starts the next
        self._current: Optional[DataBatch] = None
        self._closed = False

        given_data = [_as_desc(d, "provide_data") for d in provide_data or ()]
        given_label = [_as_desc(d, "provide_label") for d in provide_label or ()]
        self._data_names = self._merge_names(data_names, given_data, provide_data, "data")
        self._label_names = self._merge_names(label_names, given_label, provide_label, "label")
        names = self._data_names + self._label_names
        if not self._data_names:
            raise ValueError("data_names must name at least one data field")
        if len(set(names)) != len(names):
            raise ValueError(f"data_names and label_names must be distinct, got {names}")

        if batch_size is None:
            batch_size = self._known_batch_size(given_data)
        needs_inference = provide_data is None or (provide_label is None and self._label_names)
        inferred: Dict[str, DataDesc] = {}
        if needs_inference:
            inferred, batch_size = self._infer(batch_size)
        self.batch_size = batch_size
        self._provide_data = given_data if provide_data is not None else None
        self._provide_label = given_label if provide_label is not None else None
        if self._provide_data is None:
            self._provide_data = [inferred[name] for name in self._data_names]
        if self._provide_label is None:
            self._provide_label = [inferred[name] for name in self._label_names]

    # -- construction helpers -------------------------------------------------------------

    @staticmethod
    def _merge_names(names: Any, given: _Descs, provided: Any, kind: str) -> List[str]:
        default = _DEFAULT_DATA_NAMES if kind == "data" else _DEFAULT_LABEL_NAMES
        if provided is None:
            return _names(names, default, f"{kind}_names")
        from_descs = [d.name for d in given]
        if names is not None and _names(names, default, f"{kind}_names") != from_descs:
            raise ValueError(
                f"{kind}_names {names!r} disagree with the names in provide_{kind} "
                f"{from_descs}; pass one or the other"
            )
        return from_descs

    def _known_batch_size(self, given_data: _Descs) -> Optional[int]:
        """The batch size from the loader or the given descriptions, without reading data."""
        size = getattr(self._loader, "batch_size", None)
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
        if given_data:
            return int(given_data[0].shape[_batch_axis(given_data[0])])
        return None

    def _infer(self, batch_size: Optional[int]):
        """Describe every field from one dataset sample, or else from the first batch."""
        dataset = getattr(self._loader, "_dataset", None)
        readable = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
        if readable and batch_size is not None and len(dataset) > 0:
            sample = dataset[0]
            fields = sample if isinstance(sample, (tuple, dict)) else [sample]
            values = self._split(fields, "sample 0 of loader._dataset")
            shapes = {n: _shape_of(v) for n, v in values.items()}
            dtypes = {n: _dtype_of(v) for n, v in values.items()}
            axis = self._layout.find("N")
            shapes = {n: s[:axis] + (batch_size,) + s[axis:] for n, s in shapes.items()}
        else:
            epoch = iter(self._loader)
            try:
                first = next(epoch)
            except StopIteration:
                raise ValueError(
                    "the loader yielded no batches, so provide_data/provide_label cannot be "
                    "inferred; pass them explicitly"
                ) from None
            self._epoch, self._pending = epoch, first
            values = self._split(first, "the first batch")
            shapes = {n: _shape_of(v) for n, v in values.items()}
            dtypes = {n: _dtype_of(v) for n, v in values.items()}
            axis = self._layout.find("N")
            if batch_size is None:
                batch_size = shapes[self._data_names[0]][axis]
            shapes = {n: s[:axis] + (batch_size,) + s[axis + 1 :] for n, s in shapes.items()}
        descs = {
            n: DataDesc(n, shapes[n], self._dtype or dtypes[n], layout=self._layout) for n in values
        }
        return descs, batch_size

    def _split(self, fields: Any, what: str) -> Dict[str, Any]:
        """Map field names to the values of one batch (or sample)."""
        names = self._data_names + self._label_names
        if isinstance(fields, dict):
            missing = [n for n in names if n not in fields]
            if missing:
                raise ValueError(
                    f"{what} is a dict without the fields {missing} (its keys: {list(fields)})"
                )
            return {n: fields[n] for n in names}
        if not isinstance(fields, (list, tuple)):
            fields = [fields]
        if len(fields) != len(names):
            raise ValueError(
                f"{what} has {len(fields)} fields but data_names + label_names name "
                f"{len(names)}: {names} (use label_names=() for unlabeled data)"
            )
        return dict(zip(names, fields))

    # -- DataIter protocol ----------------------------------------------------------------

    def next(self) -> DataBatch:
        """The next padded ``DataBatch``; ``StopIteration`` at the end of the epoch."""
        if self._closed:
            raise ClosedIteratorError("trying to advance a closed LoaderDataIter")
        if self._ended:
            raise StopIteration
        if self._epoch is None:
            self._epoch = iter(self._loader)
            self._position = 0
        if self._pending is not None:
            raw, self._pending = self._pending, None
        else:
            try:
                raw = next(self._epoch)
            except StopIteration:
                # Some loaders' iterators refuse to be advanced past their end; don't ask them.
                self._close_epoch()
                self._ended = True
                raise
        self._current = self._make_batch(raw)
        return self._current

    def reset(self) -> None:
        """Start a new epoch; at any point, closing the current epoch's iterator if it can."""
        if self._closed:
            raise ClosedIteratorError("cannot reset a closed LoaderDataIter")
        if self._pending is not None and self._position == 0:
            return  # the epoch read to infer shapes is untouched: it is a fresh epoch already
        self._close_epoch()

    def close(self) -> None:
        """Close the current epoch's iterator; then ``next()`` and ``reset()`` raise."""
        self._closed = True
        self._close_epoch()

    def __enter__(self) -> LoaderDataIter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _close_epoch(self) -> None:
        epoch, self._epoch, self._pending, self._current = self._epoch, None, None, None
        self._position = 0
        self._ended = False
        close = getattr(epoch, "close", None)
        if close is not None:
            close()

    # -- batch assembly -------------------------------------------------------------------

    def _make_batch(self, raw: Any) -> DataBatch:
        values = self._split(raw, f"batch {self._position // max(self.batch_size, 1)}")
        descs = self._provide_data + self._provide_label
        arrays = [_to_ndarray(values[d.name], d.dtype) for d in descs]
        rows = {a.shape[_batch_axis(d)] for a, d in zip(arrays, descs)}
        if len(rows) != 1:
            raise ValueError(f"the fields of a batch have different batch sizes: {sorted(rows)}")
        n = rows.pop()
        if n > self.batch_size or n == 0:
            raise ValueError(f"a batch has {n} rows; expected 1 to batch_size={self.batch_size}")
        pad = self.batch_size - n
        if pad:
            arrays = [_pad_rows(a, pad, _batch_axis(d)) for a, d in zip(arrays, descs)]
        index = self._position + np.concatenate([np.arange(n), np.arange(pad) % n])
        self._position += n
        k = len(self._provide_data)
        return DataBatch(
            data=arrays[:k],
            label=arrays[k:],
            pad=pad,
            index=index.astype(np.int64),
            provide_data=_descs_matching(self._provide_data, arrays[:k]),
            provide_label=_descs_matching(self._provide_label, arrays[k:]),
        )


def _shape_of(value: Any) -> tuple:
    return tuple(value.shape) if isinstance(value, NDArray) else np.shape(value)


def _dtype_of(value: Any) -> type:
    if isinstance(value, NDArray):
        return np.dtype(value.dtype).type
    return np.asarray(value).dtype.type


def _to_ndarray(value: Any, dtype: Any) -> NDArray:
    """An NDArray of ``dtype`` from an NDArray or anything numpy accepts (an ``mx.np.ndarray``
    under numpy semantics, the default in MXNet 2.x, as the loader's batches are)."""
    if isinstance(value, NDArray):
        return value if _same_dtype(value.dtype, dtype) else value.astype(dtype)
    array = mx.nd.array(np.asarray(value), dtype=dtype)
    return array.as_np_ndarray() if numpy_mode() else array


def _pad_rows(array: NDArray, pad: int, axis: int) -> NDArray:
    """Append ``pad`` rows along ``axis``, wrapping around from the start of the batch, with
    the operators of the array's own type (legacy ``mx.nd`` operators refuse ``mx.np``
    arrays, and the other way round)."""
    n = array.shape[axis]
    rows = mx.nd.array(np.arange(pad) % n, ctx=device_of(array), dtype="int32")
    if isinstance(array, mx.np.ndarray):
        extra = mx.np.take(array, rows.as_np_ndarray(), axis=axis)
        return mx.np.concatenate([array, extra], axis=axis)
    return mx.nd.concat(array, mx.nd.take(array, rows, axis=axis), dim=axis)


def _descs_matching(descs: _Descs, arrays: List[NDArray]) -> _Descs:
    """``descs`` if the arrays fit them, else descriptions of the arrays' real shapes."""
    if all(tuple(d.shape) == a.shape for d, a in zip(descs, arrays)):
        return descs
    return [DataDesc(d.name, a.shape, d.dtype, layout=d.layout) for d, a in zip(descs, arrays)]


# -- PrefetchingIter ----------------------------------------------------------------------


def _renamed(descs: Sequence[Any], rename: Optional[Dict[str, str]]) -> _Descs:
    out = []
    for desc in descs:
        desc = _as_desc(desc, "provide_data/provide_label")
        name = rename.get(desc.name, desc.name) if rename else desc.name
        out.append(DataDesc(name, desc.shape, desc.dtype, layout=desc.layout))
    return out


def _renames(rename: Any, count: int, arg: str) -> List[Optional[Dict[str, str]]]:
    """One rename map (or None) per iterator."""
    if rename is None:
        return [None] * count
    if isinstance(rename, dict):
        rename = [rename]
    rename = list(rename)
    if len(rename) != count or not all(r is None or isinstance(r, dict) for r in rename):
        raise ValueError(f"{arg} must be a list of {count} dicts (one per iterator), got {rename}")
    return rename


class _Wrapped:
    """What the prefetch thread needs to know about one wrapped iterator."""

    __slots__ = ("it", "data", "label", "rename_data", "rename_label", "copy")

    def __init__(self, it: DataIter, rename_data, rename_label, copy: bool) -> None:
        self.it = it
        self.rename_data, self.rename_label = rename_data, rename_label
        self.data = _renamed(it.provide_data, rename_data)
        self.label = _renamed(getattr(it, "provide_label", None) or [], rename_label)
        self.copy = copy


def _combined_batches(wrapped: List[_Wrapped]) -> Iterator[DataBatch]:
    """Thread side: one combined ``DataBatch`` per step of the wrapped iterators."""
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

    def __init__(
        self,
        data_iter: Union[DataIter, Sequence[DataIter]],
        buffer_size: int = 2,
        rename_data: Optional[Sequence[Dict[str, str]]] = None,
        rename_label: Optional[Sequence[Dict[str, str]]] = None,
        *,
        copy: Optional[bool] = None,
    ) -> None:
        iters = list(data_iter) if isinstance(data_iter, (list, tuple)) else [data_iter]
        if not iters:
            raise ValueError("data_iter must be a DataIter or a non-empty list of them")
        for i, it in enumerate(iters):
            if not (hasattr(it, "next") and hasattr(it, "reset") and hasattr(it, "provide_data")):
                raise TypeError(
                    f"data_iter[{i}] must be an mx.io.DataIter (with next, reset and "
                    f"provide_data), got {type(it).__name__}"
                )
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
        return PrefetchIterator(
            _combined_batches(self._wrapped), self._buffer_size, name="dataiter"
        )

    def next(self) -> DataBatch:
        """The next combined batch; re-raises any error from the wrapped iterators."""
        if self._closed:
            raise ClosedIteratorError("trying to advance a closed PrefetchingIter")
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
        if self._closed:
            raise ClosedIteratorError("cannot reset a closed PrefetchingIter")
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

    def __enter__(self) -> PrefetchingIter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
