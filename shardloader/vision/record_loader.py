"""``ImageRecordLoader``: ``mx.io.ImageRecordIter``'s arguments, on the fused path.

The mapping of each argument is the table in docs/vision.md. ImageRecordIter's ``mean_*``
and ``std_*`` are in pixel units (0..255): the batch is ``(pixel - mean) / std``, with no
division by 255, exactly as ImageRecordIter computes it.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import numpy as np

from .. import batchify as _batchify
from .._compat import MX2
from .._engine.stage import Stage
from .._validate import check_bool, check_int
from ..dataiter import LoaderDataIter
from ..loader import ShardedDataLoader
from ..recordio import ImageRecordDataset
from . import _codecs, _sources
from ._fused import FusedBatchify, FusedDataset
from .device import normalize
from .pipeline import ImagePipeline

__all__ = ["ImageRecordLoader", "image_record_iter"]


def _data_shape(value: Any) -> tuple:
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        or value[0] not in (1, 3)
    ):
        raise ValueError(
            f"data_shape must be (channels, height, width) with 1 or 3 channels and positive "
            f"sizes, got {value!r}"
        )
    return tuple(value)


def _aspect_range(min_aspect_ratio: Optional[float], max_aspect_ratio: float) -> tuple:
    """ImageRecordIter's aspect-ratio range: ``max_aspect_ratio=0`` keeps the aspect;
    ``min_aspect_ratio=None`` means ``1 / max_aspect_ratio``."""
    if max_aspect_ratio < 0:
        raise ValueError(f"max_aspect_ratio must be >= 0, got {max_aspect_ratio!r}")
    if max_aspect_ratio == 0:
        return 1.0, 1.0
    low = 1.0 / max_aspect_ratio if min_aspect_ratio is None else float(min_aspect_ratio)
    high = float(max_aspect_ratio)
    low, high = min(low, high), max(low, high)
    if low <= 0:
        raise ValueError(f"min_aspect_ratio must be > 0, got {min_aspect_ratio!r}")
    return low, high


class ImageRecordLoader(ShardedDataLoader):
    """A loader over an indexed ``.rec`` of images that takes ``mx.io.ImageRecordIter``'s
    common arguments, with their meaning, and runs on the fused image path.

    It is a ``ShardedDataLoader`` (process workers, ``preprocess_threads`` of them), so it
    also has seeds, sharding, resume and errors naming the record; ``dataiter()`` gives an
    ``mx.io.DataIter`` for ``Module.fit``. Batches are ``[data, label]``: data float32
    ``(batch_size, C, H, W)`` (or uint8 with ``output='uint8'``), label float32.

    Parameters
    ----------
    path_imgrec : str
        The ``.rec`` file of images.
    path_imgidx : str, optional
        Its index; by default the ``.idx`` file next to it (``path_imgrec`` with ``.idx``).
    data_shape : (channels, height, width), default (3, 224, 224)
        The output shape; 1 channel decodes to grey.
    batch_size : int
        Images per batch.
    shuffle : bool, default False
        Shuffle every epoch (seeded by ``seed`` and the epoch).
    rand_crop : bool, default False
        A random ``data_shape`` crop instead of the centre one.
    random_resized_crop : bool, default False
        Gluon's RandomResizedCrop: area in ``[min_random_area, max_random_area]`` of the
        image's, aspect ratio in ``[min_aspect_ratio, max_aspect_ratio]``.
    min_random_area, max_random_area : float, default 1.0
    max_aspect_ratio : float, default 0.0
        0 keeps the aspect ratio.
    min_aspect_ratio : float, optional
        Defaults to ``1 / max_aspect_ratio``.
    rand_mirror : bool, default False
        Flip left-right with probability 0.5.
    resize : int, default -1
        Resize the shorter edge to this first (-1: don't).
    mean_r, mean_g, mean_b, std_r, std_g, std_b : float
        In pixel units (0..255), as ImageRecordIter's: ``(pixel - mean) / std``.
    num_parts, part_index : int
        Read only part ``part_index`` of ``num_parts`` (one per machine).
    preprocess_threads : int, optional
        Worker processes (``num_workers``); by default ``min(4, os.cpu_count())``.
    seed : int, optional
        Makes shuffling and augmentation reproducible for any number of workers.
    output : {'float32', 'uint8', 'device'}, default 'float32'
        ``'uint8'`` leaves normalisation to ``shardloader.vision.normalize``. ``'device'``
        moves uint8 (4x fewer bytes) and normalises each batch after it is placed (on
        ``ctx=``'s devices, where the loader places it), so the loop receives float32.
    inter_method : int, default 1
        The interpolation code (0 nearest, 1 bilinear, 2 cubic, 3 area, 4 Lanczos).
    **loader_kwargs
        Any other ``ShardedDataLoader`` argument (``last_batch``, ``ctx``, ``timeout``...).
    """

    def __init__(
        self,
        path_imgrec: str,
        path_imgidx: Optional[str] = None,
        data_shape: Sequence[int] = (3, 224, 224),
        batch_size: Optional[int] = None,
        shuffle: bool = False,
        rand_crop: bool = False,
        random_resized_crop: bool = False,
        min_random_area: float = 1.0,
        max_random_area: float = 1.0,
        max_aspect_ratio: float = 0.0,
        min_aspect_ratio: Optional[float] = None,
        rand_mirror: bool = False,
        resize: int = -1,
        mean_r: float = 0.0,
        mean_g: float = 0.0,
        mean_b: float = 0.0,
        std_r: float = 1.0,
        std_g: float = 1.0,
        std_b: float = 1.0,
        num_parts: int = 1,
        part_index: int = 0,
        preprocess_threads: Optional[int] = None,
        seed: Optional[int] = None,
        output: str = "float32",
        inter_method: int = 1,
        **loader_kwargs: Any,
    ) -> None:
        if not _codecs.available():
            raise ImportError(f"ImageRecordLoader needs the image codecs: {_codecs.INSTALL_HINT}")
        if batch_size is None:
            raise TypeError("ImageRecordLoader needs batch_size=, got None")
        channels, height, width = _data_shape(data_shape)
        for name, value in (
            ("rand_crop", rand_crop),
            ("random_resized_crop", random_resized_crop),
            ("rand_mirror", rand_mirror),
        ):
            check_bool(name, value)
        resize = check_int("resize", resize, -1)
        if output not in ("float32", "uint8", "device"):
            raise ValueError(f"output must be one of 'float32', 'uint8', 'device', got {output!r}")
        self._on_device = output == "device"
        if preprocess_threads is None:
            preprocess_threads = min(4, os.cpu_count() or 1)
        self.pipeline = ImagePipeline(
            (width, height),
            resize=resize if resize > 0 else None,
            random_resized_crop=random_resized_crop,
            scale=(min_random_area, max_random_area),
            ratio=_aspect_range(min_aspect_ratio, max_aspect_ratio),
            random_crop=rand_crop and not random_resized_crop,
            center_crop=not (rand_crop or random_resized_crop),
            flip_left_right=rand_mirror,
            mean=(mean_r, mean_g, mean_b) if channels == 3 else mean_r,
            std=(std_r, std_g, std_b) if channels == 3 else std_r,
            output="uint8" if output == "device" else output,
            interpolation=inter_method,
            flag=1 if channels == 3 else 0,
            pixel_units=True,
        )
        records = ImageRecordDataset(path_imgrec, path_imgidx, flag=self.pipeline.flag)
        source, _ = _sources.source_of(records)
        labels = _batchify._FieldStack() if MX2 else _batchify.default_batchify_fn
        super().__init__(
            FusedDataset(source, self.pipeline),
            batch_size,
            shuffle,
            batchify_fn=FusedBatchify(self.pipeline, labels),
            num_workers=check_int("preprocess_threads", preprocess_threads, 0),
            seed=seed,
            num_parts=num_parts,
            part_index=part_index,
            **loader_kwargs,
        )
        self._data_shape = (channels, height, width)
        self._rows = batch_size

    def __iter__(self):
        epoch = super().__iter__()
        return _NormalizedOnDevice(epoch, self.pipeline) if self._on_device else epoch

    def dataiter(self, data_name: str = "data", label_name: str = "softmax_label"):
        """An ``mx.io.DataIter`` over this loader for ``Module.fit``, with ImageRecordIter's
        names (``data``, ``softmax_label``) and padded last batch
        (``shardloader.dataiter.LoaderDataIter``)."""
        import mxnet as mx

        uint8 = self.pipeline.output == "uint8" and not self._on_device
        dtype = np.uint8 if uint8 else np.float32
        n = self._rows
        return LoaderDataIter(
            self,
            provide_data=[mx.io.DataDesc(data_name, (n, *self._data_shape), dtype)],
            provide_label=[mx.io.DataDesc(label_name, (n,), np.float32)],
            batch_size=n,
        )


class _NormalizedOnDevice(Stage):
    """``output='device'``: each placed batch's images normalised where they are (the
    epoch's other attributes, ``epoch`` and ``position`` among them, are its source's)."""

    def __init__(self, source: Any, pipeline: ImagePipeline) -> None:
        self._source = source
        self._pipeline = pipeline

    def _next(self) -> Any:
        batch = next(self._source)
        if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], (list, tuple)):
            return [self._normalized(shard) for shard in batch]  # a step of shards
        return self._normalized(batch)

    def _normalized(self, batch: Any) -> Any:
        data, *rest = batch
        mean, std = self._pipeline.mean, self._pipeline.std
        return [normalize(data, mean, std, pixel_units=True), *rest]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def __len__(self) -> int:
        return len(self._source)


def image_record_iter(*args: Any, **kwargs: Any):
    """``ImageRecordLoader(*args, **kwargs).dataiter()``: an ``mx.io.DataIter`` that takes
    ``mx.io.ImageRecordIter``'s arguments (``data_name`` and ``label_name`` too)."""
    names = {k: kwargs.pop(k) for k in ("data_name", "label_name") if k in kwargs}
    return ImageRecordLoader(*args, **kwargs).dataiter(**names)
