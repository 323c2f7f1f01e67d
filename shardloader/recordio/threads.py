"""``thread_safe``: Gluon's own record datasets, given one file handle per thread."""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional

import mxnet as mx
from mxnet.gluon.data import dataset as _gluon_dataset

from .reader import RecordDataset


class _ThreadRecordIO(mx.recordio.MXIndexedRecordIO):
    """A read-only ``MXIndexedRecordIO`` that shares an already parsed index instead of
    reading the ``.idx`` file again."""

    def __init__(
        self, idx_path: str, uri: str, idx: Dict[Any, int], keys: list, key_type: type
    ) -> None:
        self.idx_path = idx_path
        self.key_type = key_type
        self.fidx = None
        self._shared = (idx, keys)
        mx.recordio.MXRecordIO.__init__(self, uri, "r")  # opens, through open() below

    def open(self) -> None:
        mx.recordio.MXRecordIO.open(self)
        self.idx, self.keys = self._shared

    def close(self) -> None:
        mx.recordio.MXRecordIO.close(self)


class _PerThreadRecordIO:
    """Stands in for the ``MXIndexedRecordIO`` of a Gluon record dataset: each thread reads
    through its own handle, so one thread's seek cannot move another thread's read.

    The index (``keys`` and ``idx``) is the original handle's, shared read-only. Any other
    attribute is the calling thread's handle's.
    """

    def __init__(self, record: mx.recordio.MXIndexedRecordIO) -> None:
        uri = record.uri.value if hasattr(record.uri, "value") else record.uri
        self.uri = uri.decode("utf-8") if isinstance(uri, bytes) else str(uri)
        self.idx_path = record.idx_path
        self.idx = record.idx
        self.keys = record.keys
        self.key_type = record.key_type
        self._local = threading.local()

    def _handle(self) -> _ThreadRecordIO:
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self._local.handle = _ThreadRecordIO(
                self.idx_path, self.uri, self.idx, self.keys, self.key_type
            )
        return handle

    def read_idx(self, key: Any) -> Optional[bytes]:
        return self._handle().read_idx(key)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_local":
            raise AttributeError(name)
        return getattr(self._handle(), name)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_local"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()


# Gluon's vision.ImageRecordDataset is a RecordFileDataset.
_GLUON_RECORD_TYPES = (_gluon_dataset.RecordFileDataset,)


def _refuse(dataset: Any, where: str, why: str) -> TypeError:
    return TypeError(
        f"{where} is a {type(dataset).__name__}, a Gluon record dataset whose one file handle "
        f"threads would share, and shardloader cannot give it one handle per thread: {why}. "
        f"Use shardloader.recordio.RecordDataset or shardloader.recordio.ImageRecordDataset, "
        f"which any number of threads can read, or worker processes (thread_pool=False)"
    )


def _per_thread_copy(dataset: Any, where: str) -> Any:
    """A shallow copy of a Gluon record dataset whose record handle is per thread."""
    record = getattr(dataset, "_record", None)
    if not isinstance(record, mx.recordio.MXIndexedRecordIO):
        raise _refuse(
            dataset, where, f"its _record is a {type(record).__name__}, not an MXIndexedRecordIO"
        )
    if record.flag != "r":
        raise _refuse(dataset, where, f"its record file is open with flag {record.flag!r}")
    if not hasattr(dataset, "__dict__") or hasattr(type(dataset), "__slots__"):
        raise _refuse(dataset, where, "it cannot be copied attribute by attribute")
    copy = object.__new__(type(dataset))
    copy.__dict__.update(dataset.__dict__)
    copy._record = _PerThreadRecordIO(record)
    return copy


# Gluon's dataset wrappers and the attribute that holds what they wrap.
_WRAPPERS = (
    (_gluon_dataset._LazyTransformDataset, "_data"),  # transform, transform_first
    (_gluon_dataset._SampledDataset, "_dataset"),  # shard, take, sample
    (_gluon_dataset._FilteredDataset, "_dataset"),  # filter
    (_gluon_dataset.SimpleDataset, "_data"),
)


def _with(wrapper: Any, attribute: str, value: Any) -> Any:
    copy = object.__new__(type(wrapper))
    copy.__dict__.update(wrapper.__dict__)
    setattr(copy, attribute, value)
    return copy


def _safe(dataset: Any, where: str, done: Dict[int, Any]) -> Any:
    """``dataset``, or a copy with each Gluon record dataset in it given per-thread handles."""
    if id(dataset) in done:
        return done[id(dataset)]
    result = dataset
    if isinstance(dataset, RecordDataset):
        pass  # ours: threads read it with pread
    elif isinstance(dataset, _GLUON_RECORD_TYPES):
        result = _per_thread_copy(dataset, where)
    elif type(dataset) is _gluon_dataset.ArrayDataset:
        parts = [_safe(part, f"{where}._data[{i}]", done) for i, part in enumerate(dataset._data)]
        if any(new is not old for new, old in zip(parts, dataset._data)):
            result = _with(dataset, "_data", parts)
    else:
        for wrapper_type, attribute in _WRAPPERS:
            if type(dataset) is wrapper_type:
                inner = getattr(dataset, attribute)
                safe_inner = _safe(inner, f"{where}.{attribute}", done)
                if safe_inner is not inner:
                    result = _with(dataset, attribute, safe_inner)
                break
        else:
            _refuse_hidden(dataset, where)
    done[id(dataset)] = result
    return result


def _refuse_hidden(dataset: Any, where: str) -> None:
    """Refuse a dataset of another kind that holds a Gluon record dataset in an attribute."""
    attributes = getattr(dataset, "__dict__", None)
    if not isinstance(attributes, dict):
        return
    for name, value in attributes.items():
        # A short list or tuple may hold datasets; a long one holds samples.
        values = value if isinstance(value, (list, tuple)) and len(value) <= 64 else (value,)
        for item in values:
            if isinstance(item, _GLUON_RECORD_TYPES):
                raise _refuse(
                    item,
                    f"{where}.{name}",
                    f"it sits inside a {type(dataset).__name__}, which shardloader does not know "
                    f"how to copy",
                )


def thread_safe(dataset: Any) -> Any:
    """``dataset``, made safe to read from many threads at once if it holds Gluon's own record
    datasets.

    Gluon's ``RecordFileDataset`` and ``vision.ImageRecordDataset`` read through one
    ``MXIndexedRecordIO`` handle, a seek followed by a read on one stream, so threads that
    share it now and then get each other's records, without any error. This function finds
    such datasets, also inside ``transform``, ``transform_first``, ``shard``, ``take``,
    ``sample``, ``filter``, ``SimpleDataset`` and ``ArrayDataset``, and returns a shallow
    copy of the whole chain in which each of them reads through one handle per thread. Their
    samples are unchanged: Gluon's own ``__getitem__`` runs, on the same bytes.
    ``ShardedDataLoader`` applies it by itself for thread workers, and for loaders that load
    in the calling thread (``num_workers=0``), which several threads may iterate at once
    (there, through ``inline_safe``).

    Anything else, this package's ``RecordDataset`` and ``ImageRecordDataset`` included,
    comes back as the very same object.

    Raises
    ------
    TypeError
        For a Gluon record dataset this function cannot give per-thread handles, such as one
        held by a dataset class it does not know. The message names where it is.
    """
    return _safe(dataset, "dataset", {})


class _OneReaderAtATime:
    """A dataset whose reads take turns: each ``__getitem__`` holds one lock."""

    def __init__(self, dataset: Any) -> None:
        self._dataset = dataset
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, idx: Any) -> Any:
        with self._lock:
            return self._dataset[idx]


def inline_safe(dataset: Any) -> Any:
    """``dataset``, made safe for a loader that loads in its callers' threads: per-thread
    handles where ``thread_safe`` can give them; where it cannot (a Gluon record dataset
    inside a class it does not know), the same object with its reads taking turns under one
    lock, so threads iterating one loader at once still get their own records."""
    try:
        return thread_safe(dataset)
    except TypeError:
        return _OneReaderAtATime(dataset)
