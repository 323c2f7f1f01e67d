"""Encoded images from each kind of image dataset, without decoding them.

The one module that reads the attributes of Gluon's image datasets (``filename``,
``idx_file``, ``items``, ``_flag``, ``_imglist``...), so a change in Gluon touches only this
file. Each source gives, for an index, the encoded bytes and the rest of the sample as the
dataset would have returned it, and ``fail`` raises the error the dataset itself raises for
an image that does not decode (the exact path's error, naming the record).

Gluon's record datasets read through one file handle that threads and forked processes
would share; their source reads the same ``.rec`` through shardloader's ``RecordDataset``
instead, which every thread and process reads safely, and keeps no Gluon handle.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import mxnet as mx
import numpy as np

from ..recordio import ImageRecordDataset, RecordDataset
from . import _codecs

Rest = Optional[Tuple[Any, ...]]


class _Source:
    """What the fused dataset reads: ``len``, ``read(idx) -> (bytes, rest)``, ``fail``."""

    flag = 1
    kind = "source"

    def __len__(self) -> int:
        raise NotImplementedError

    def read(self, idx: int) -> Tuple[Any, Rest]:
        raise NotImplementedError

    def fail(self, idx: int, data: Any, cause: Optional[BaseException] = None) -> None:
        """Raise the exact path's error for sample ``idx`` whose bytes ``data`` no decoder
        took (``cause``: what the fused path's decoder raised); a dataset that does not
        raise still gets a clear error, with that cause."""
        _codecs.decode_exact(data, self.flag, f"{self.kind}: sample {idx}")
        raise ValueError(f"{self.kind}: sample {idx} is not a decodable image{_as_reason(cause)}")


def _as_reason(cause: Optional[BaseException]) -> str:
    """`` (Type: its last line)`` of what a decoder raised, or nothing."""
    if cause is None:
        return ""
    lines = str(cause).strip().splitlines()
    return f" ({type(cause).__name__}: {lines[-1] if lines else ''})"


class _ShardRecords(_Source):
    """shardloader's ``ImageRecordDataset``: its file checks and its errors."""

    kind = "ImageRecordDataset"

    def __init__(self, dataset: ImageRecordDataset, flag: int) -> None:
        self.dataset, self.flag = dataset, flag

    def __len__(self) -> int:
        return len(self.dataset)

    def read(self, idx: int) -> Tuple[Any, Rest]:
        record = RecordDataset.__getitem__(self.dataset, idx)  # verified, not decoded
        try:
            header, payload = mx.recordio.unpack(record)
        except Exception:  # noqa: BLE001 - the dataset raises its own, record-naming error
            self.dataset[idx]
            raise
        label = np.array(header.label, np.float32) if header.flag > 0 else np.float32(header.label)
        return payload, (label,)

    def fail(self, idx: int, data: Any, cause: Optional[BaseException] = None) -> None:
        self.dataset[idx]  # raises RecordIOError naming the file, record, key and offset
        raise ValueError(f"{self.kind}: record {idx} is not a decodable image{_as_reason(cause)}")


class _GluonRecords(_Source):
    """Gluon's ``vision.ImageRecordDataset``, read through shardloader's reader."""

    kind = "gluon ImageRecordDataset"

    def __init__(self, dataset: Any, flag: int) -> None:
        self.records = RecordDataset(dataset.filename, dataset.idx_file)
        self.flag = flag

    def __len__(self) -> int:
        return len(self.records)

    def read(self, idx: int) -> Tuple[Any, Rest]:
        header, payload = mx.recordio.unpack(self.records[idx])
        return payload, (header.label,)


class _Files(_Source):
    """Gluon's ``ImageFolderDataset`` and ``ImageListDataset``: one file per image."""

    def __init__(self, paths: list, labels: list, flag: int, kind: str) -> None:
        self.paths, self.labels, self.flag, self.kind = paths, labels, flag, kind

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, idx: int) -> Tuple[Any, Rest]:
        with open(self.paths[idx], "rb") as f:
            return f.read(), (self.labels[idx],)

    def fail(self, idx: int, data: Any, cause: Optional[BaseException] = None) -> None:
        where = f"{self.kind}: {self.paths[idx]}"
        _codecs.decode_exact(data, self.flag, where)
        raise ValueError(f"{where} is not a decodable image{_as_reason(cause)}")


class Encoded(_Source):
    """A dataset of encoded images: each sample is the bytes, or a tuple whose first item
    is the bytes (``bytes``, ``bytearray``, ``memoryview`` or a 1-D uint8 array)."""

    kind = "encoded images"

    def __init__(self, dataset: Any, flag: int = 1) -> None:
        self.dataset, self.flag = dataset, flag

    def __len__(self) -> int:
        return len(self.dataset)

    def read(self, idx: int) -> Tuple[Any, Rest]:
        sample = self.dataset[idx]
        if isinstance(sample, tuple):
            return _as_bytes(sample[0], idx), tuple(sample[1:])
        return _as_bytes(sample, idx), None


def _as_bytes(value: Any, idx: int) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value
    if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1:
        return value.tobytes()
    raise TypeError(
        f"sample {idx}: expected encoded image bytes (bytes, bytearray, memoryview or a 1-D "
        f"uint8 array), got {type(value).__name__}"
    )


# The methods of each recognised dataset class that the fused path replaces (it reads the
# encoded bytes and labels itself): a subclass that overrides one of them keeps the exact path,
# one that overrides none (gluon-cv's ImageNet, which only sets attributes in __init__) is read
# as its base class is. Listed in docs/vision.md, "What is recognised".
REPLACED = {
    "ImageRecordDataset": ("__getitem__",),  # shardloader's: records read, then decoded here
    "gluon ImageRecordDataset": ("__getitem__", "__len__"),  # read through RecordDataset
    "ImageFolderDataset": ("__getitem__", "__len__"),  # read from ``items``
    "ImageListDataset": ("__getitem__", "__len__"),  # read from ``_imglist``
}


def _recognised(dataset: Any) -> Tuple[Optional[type], str]:
    """The recognised class ``dataset`` is an instance of, and its key in ``REPLACED``."""
    from mxnet.gluon.data import vision

    kinds = [
        (ImageRecordDataset, "ImageRecordDataset"),
        (vision.ImageRecordDataset, "gluon ImageRecordDataset"),
        (vision.ImageFolderDataset, "ImageFolderDataset"),
    ]
    image_list = getattr(vision, "ImageListDataset", None)  # MXNet 2.x only
    if image_list is not None:
        kinds.append((image_list, "ImageListDataset"))
    for base, key in kinds:
        if isinstance(dataset, base):
            return base, key
    return None, ""


def overridden(dataset: Any, base: type, key: str) -> Optional[str]:
    """The first method of ``REPLACED[key]`` that ``dataset``'s class overrides below
    ``base``, or ``None``."""
    for cls in type(dataset).__mro__:
        if cls is base:
            return None
        for name in REPLACED[key]:
            if name in vars(cls):
                return f"{cls.__name__}.{name}"
    return None


def source_of(dataset: Any) -> Tuple[Optional[_Source], str]:
    """The source for an image dataset Gluon's transforms would see decoded, or ``None``
    and why it is not one."""
    name = type(dataset).__name__
    base, key = _recognised(dataset)
    if base is None:
        return None, f"the dataset ({name}) is not an image dataset shardloader can read encoded"
    replaced = overridden(dataset, base, key)
    if replaced is not None:
        return None, (
            f"the dataset ({name}) is a subclass of {base.__name__} that overrides {replaced}, "
            f"which the fused path replaces"
        )
    if key == "ImageRecordDataset":
        if dataset.transform_fn is not None:
            return None, f"the {name} has a transform= of its own"
        return _ShardRecords(dataset, dataset.flag), ""
    if getattr(dataset, "_transform", None) is not None:  # ImageListDataset has none
        return None, f"the {name} has a transform= of its own"
    if key == "gluon ImageRecordDataset":
        return _GluonRecords(dataset, dataset._flag), ""
    if key == "ImageFolderDataset":
        paths = [path for path, _ in dataset.items]
        labels = [label for _, label in dataset.items]
        return _Files(paths, labels, dataset._flag, name), ""
    keys = dataset._imgkeys
    paths = [dataset._imglist[k][1] for k in keys]
    labels = [dataset._imglist[k][0] for k in keys]
    return _Files(paths, labels, dataset._flag, name), ""
