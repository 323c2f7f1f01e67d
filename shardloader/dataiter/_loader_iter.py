"""``LoaderDataIter``: a re-iterable of batches as an ``mx.io.DataIter`` for ``Module.fit``."""

from __future__ import annotations

import collections.abc
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from mxnet.io import DataBatch, DataDesc

from .._validate import check_int
from ._arrays import (
    _as_desc,
    _batch_axis,
    _Descs,
    _descs_matching,
    _dtype_of,
    _pad_rows,
    _shape_of,
    _to_ndarray,
)
from ._base import _CurrentBatch

_DEFAULT_DATA_NAMES = ("data",)
_DEFAULT_LABEL_NAMES = ("softmax_label",)
_Names = Union[str, Sequence[str], None]


def _names(value: _Names, default: Sequence[str], arg: str) -> List[str]:
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


def _merge_names(names: _Names, given: _Descs, provided: Any, kind: str) -> List[str]:
    """The names of the ``kind`` (``'data'`` or ``'label'``) fields: ``names``, or the names in
    ``provide_<kind>`` when that is given (``names`` must then agree with them)."""
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


def _check_reiterable(loader: Any) -> None:
    if isinstance(loader, collections.abc.Iterator) or not isinstance(
        loader, collections.abc.Iterable
    ):
        raise TypeError(
            "loader must be re-iterable (a DataLoader, a list of batches, ...), so that "
            f"every epoch can call iter() on it; got {type(loader).__name__}"
        )


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

    _kind = "LoaderDataIter"

    def __init__(
        self,
        loader: Any,
        data_names: _Names = None,
        label_names: _Names = None,
        provide_data: Optional[Sequence[Any]] = None,
        provide_label: Optional[Sequence[Any]] = None,
        batch_size: Optional[int] = None,
        dtype: Any = "float32",
        layout: str = "NCHW",
    ) -> None:
        _check_reiterable(loader)
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
        self._describe(data_names, label_names, provide_data, provide_label, batch_size)

    # -- construction helpers -------------------------------------------------------------

    def _describe(
        self,
        data_names: _Names,
        label_names: _Names,
        provide_data: Optional[Sequence[Any]],
        provide_label: Optional[Sequence[Any]],
        batch_size: Optional[int],
    ) -> None:
        """Set the field names, ``batch_size``, ``provide_data`` and ``provide_label``."""
        given_data = [_as_desc(d, "provide_data") for d in provide_data or ()]
        given_label = [_as_desc(d, "provide_label") for d in provide_label or ()]
        self._data_names = _merge_names(data_names, given_data, provide_data, "data")
        self._label_names = _merge_names(label_names, given_label, provide_label, "label")
        names = self._data_names + self._label_names
        if not self._data_names:
            raise ValueError("data_names must name at least one data field")
        if len(set(names)) != len(names):
            raise ValueError(f"data_names and label_names must be distinct, got {names}")

        if batch_size is None:
            batch_size = self._known_batch_size(given_data)
        inferred: Dict[str, DataDesc] = {}
        if provide_data is None or (provide_label is None and self._label_names):
            inferred, batch_size = self._infer(batch_size)
        assert batch_size is not None  # given_data is not empty when provide_data is given
        self.batch_size: int = batch_size
        if provide_data is None:
            given_data = [inferred[name] for name in self._data_names]
        if provide_label is None:
            given_label = [inferred[name] for name in self._label_names]
        self._provide_data, self._provide_label = given_data, given_label

    def _known_batch_size(self, given_data: _Descs) -> Optional[int]:
        """The batch size from the loader or the given descriptions, without reading data."""
        size = getattr(self._loader, "batch_size", None)
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
        if given_data:
            return int(given_data[0].shape[_batch_axis(given_data[0])])
        return None

    def _infer(self, batch_size: Optional[int]) -> Tuple[Dict[str, DataDesc], int]:
        """Describe every field from one dataset sample, or else from the first batch."""
        axis = self._layout.find("N")
        # Gluon's DataLoader and shardloader's keep the dataset there; neither has a public
        # attribute for it.
        dataset = getattr(self._loader, "_dataset", None)
        readable = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
        if readable and dataset is not None and batch_size is not None and len(dataset) > 0:
            sample = dataset[0]
            fields = sample if isinstance(sample, (tuple, dict)) else [sample]
            values = self._split(fields, "sample 0 of loader._dataset")
            shapes = {n: _shape_of(v) for n, v in values.items()}
            shapes = {n: s[:axis] + (batch_size,) + s[axis:] for n, s in shapes.items()}
        else:
            values = self._split(self._read_first_batch(), "the first batch")
            shapes = {n: _shape_of(v) for n, v in values.items()}
            if batch_size is None:
                batch_size = shapes[self._data_names[0]][axis]
            shapes = {n: s[:axis] + (batch_size,) + s[axis + 1 :] for n, s in shapes.items()}
        dtypes = {n: _dtype_of(v) for n, v in values.items()}
        descs = {
            n: DataDesc(n, shapes[n], self._dtype or dtypes[n], layout=self._layout) for n in values
        }
        return descs, batch_size

    def _read_first_batch(self) -> Any:
        """Start the first epoch and read its first batch, kept for the first ``next()``."""
        epoch = iter(self._loader)
        try:
            first = next(epoch)
        except StopIteration:
            raise ValueError(
                "the loader yielded no batches, so provide_data/provide_label cannot be "
                "inferred; pass them explicitly"
            ) from None
        self._epoch, self._pending = epoch, first
        return first

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
        self._check_open("trying to advance")
        if self._ended:
            raise StopIteration
        epoch = self._open_epoch()
        if self._pending is not None:
            raw, self._pending = self._pending, None
        else:
            try:
                raw = next(epoch)
            except StopIteration:
                # Some loaders' iterators refuse to be advanced past their end; don't ask them.
                self._close_epoch()
                self._ended = True
                raise
        self._current = self._make_batch(raw)
        return self._current

    def start_epoch(self) -> None:
        """Start the epoch ``next()`` will read (``iter(loader)``) now, on this thread.

        ``next()`` does it by itself; ``PrefetchingIter`` calls this on the thread that made
        it, before its own thread reads, so that a loader's worker processes are forked here
        and not beside the caller's MXNet work (see docs/dataiter.md). Nothing happens if the
        epoch is already started or has ended."""
        self._check_open("cannot start an epoch")
        if not self._ended:
            self._open_epoch()

    def _open_epoch(self) -> Iterator:
        if self._epoch is None:
            self._epoch = iter(self._loader)
            self._position = 0
        return self._epoch

    def reset(self) -> None:
        """Start a new epoch; at any point, closing the current epoch's iterator if it can."""
        self._check_open("cannot reset")
        if self._pending is not None and self._position == 0:
            return  # the epoch read to infer shapes is untouched: it is a fresh epoch already
        self._close_epoch()

    def close(self) -> None:
        """Close the current epoch's iterator; then ``next()`` and ``reset()`` raise."""
        self._closed = True
        self._close_epoch()

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
