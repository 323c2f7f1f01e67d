"""The fused path's dataset and batchify function.

``FusedDataset.__getitem__`` reads an image's bytes, parses its JPEG header and draws the
pipeline's random parameters: that is all that runs while the loader has seeded the sample
(docs/design.md, invariant 5), so seeded thread workers hold their lock only briefly.
``FusedBatchify`` then decodes, crops and resizes each image and, while it is still in the
cache, writes it into its place in the batch, a buffer from the batch allocator (a worker's
shared-memory slot): flipped, split into planes and through ToTensor and Normalize's table
in the same pass (``_write``); for ``output="hwc"`` as it is.

An image libjpeg-turbo cannot read (PNG, CMYK, damaged bytes) is decoded by MXNet's own
decoder instead; one no decoder reads raises the dataset's own error, naming the record.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import numpy as np
from mxnet.base import MXNetError

from .. import batchify as _batchify
from .._engine.ipc import alloc as _alloc
from ..recordio._imagesize import ImageTooLarge, refusal, too_large
from . import _codecs, _write
from .pipeline import ImagePipeline


class Pending:
    """One image of a fused sample: its bytes and drawn parameters, decoded in batchify."""

    __slots__ = ("source", "index", "data", "size", "params", "floor", "pixels")

    def __init__(self, source, index, data, size, params, floor, pixels=None) -> None:
        self.source, self.index, self.data = source, index, data
        self.size, self.params, self.floor, self.pixels = size, params, floor, pixels

    def shape(self, pipeline: ImagePipeline) -> Tuple[int, int, int]:
        """The HWC shape of the rendered image."""
        return pipeline.output_shape(self.size[0], self.size[1], self.params)

    def render(self, pipeline: ImagePipeline) -> Tuple[np.ndarray, _write.Flips]:
        """Decode if not yet decoded, and apply the pipeline's steps: the image (uint8 HWC)
        and the flips left to its write into the batch."""
        pixels, params, size = self.pixels, self.params, self.size
        if pixels is None:
            try:
                pixels = pipeline.decode(self.data, size, self.floor, params)
            except ValueError:
                # libjpeg-turbo refused bytes whose header it read: MXNet's decoder may
                # still take them, as the exact path would.
                pixels = _decode_or_fail(self.source, self.index, self.data, pipeline.flag)
                if pixels.shape[:2] != size:
                    size = (pixels.shape[0], pixels.shape[1])
                    params, _ = pipeline.draw(*size)
        return pipeline.render(pixels, params, size)

    def __repr__(self) -> str:
        return f"<pending image {self.index} of {self.size[1]}x{self.size[0]}>"


def _decode_or_fail(source, index: int, data: Any, flag: int) -> np.ndarray:
    """MXNet's decode of ``data``; if it fails, or the image declares too many pixels, the
    dataset's own error for it (naming the record and keeping the reason)."""
    try:
        return _codecs.decode_exact(data, flag)
    except (MXNetError, ImageTooLarge) as exc:
        source.fail(index, data, exc)
        raise


class FusedDataset:
    """The samples of ``source`` with the image replaced by a ``Pending`` image."""

    def __init__(self, source: Any, pipeline: ImagePipeline) -> None:
        self.source = source
        self.pipeline = pipeline

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, idx: int) -> Any:
        data, rest = self.source.read(idx)
        pipeline = self.pipeline
        size = _codecs.jpeg_size(data)
        if size is not None:
            why = too_large(*size)
            if why is not None:  # a decompression bomb: refused before anything allocates
                if refusal(data) is not None:
                    self.source.fail(idx, data)  # the dataset's own error, naming the record
                raise ImageTooLarge(f"{self.source.kind}: sample {idx} {why}")
        pixels = None
        if size is None:  # not a JPEG libjpeg-turbo reads to RGB: MXNet decodes it here
            pixels = _decode_or_fail(self.source, idx, data, pipeline.flag)
            size = (pixels.shape[0], pixels.shape[1])
        params, floor = pipeline.draw(*size)
        image = Pending(self.source, idx, data, size, params, floor, pixels)
        return image if rest is None else (image,) + rest

    def __repr__(self) -> str:
        return f"FusedDataset({self.source.kind}, {self.pipeline!r})"


def _mismatch(position: int, shape, first) -> ValueError:
    return ValueError(
        f"cannot stack image {position} of shape {tuple(shape)} with image 0 of shape "
        f"{tuple(first)}: the pipeline's last step gives images of different sizes; end it "
        f"with a crop or a Resize to one (width, height)"
    )


class FusedBatchify:
    """Batchify for ``FusedDataset`` samples: the images into one batch array, the rest of
    each sample's fields through ``rest_batchify`` (the loader's default)."""

    def __init__(self, pipeline: ImagePipeline, rest_batchify: Callable) -> None:
        self.pipeline = pipeline
        self.rest_batchify = rest_batchify

    @property
    def uses_batch_allocator(self) -> bool:
        """The images are allocated through the batch allocator (``_alloc.empty``), so in a
        worker process the batch is written into its shared-memory slot, never copied;
        the other fields are when ``rest_batchify`` declares it (``batchify.is_native``)."""
        return _batchify.is_native(self.rest_batchify)

    def __call__(self, samples: Sequence[Any]) -> Any:
        _codecs.settle_threads()  # in a worker process, OpenCV's pool to one thread
        if isinstance(samples[0], Pending):
            return self.images(samples)
        images = self.images([sample[0] for sample in samples])
        rest = self.rest_batchify([tuple(sample[1:]) for sample in samples])
        return [images, *rest]

    def images(self, images: Sequence[Pending]) -> Any:
        pipeline = self.pipeline
        n, (height, width, channels) = len(images), images[0].shape(pipeline)
        if pipeline.output == "hwc":
            out = _alloc.empty((n, height, width, channels), np.uint8)
            for i, image in enumerate(images):
                pixels, flips = _rendered(pipeline, image, i, out.shape[1:])
                _write.hwc(pixels, flips, out[i])
            return _alloc.to_output(out)
        # Planar output: each image's planes are written from its pixels while they are
        # still in the cache, through ToTensor and Normalize's table for float output.
        lut = None if pipeline.output == "uint8" else pipeline.lut
        dtype = np.uint8 if lut is None else pipeline.dtype
        out = _alloc.empty((n, channels, height, width), dtype)
        for i, image in enumerate(images):
            pixels, flips = _rendered(pipeline, image, i, (height, width, channels))
            _write.planes(pixels, flips, out[i], lut)
        return _alloc.to_output(out)


def _rendered(
    pipeline: ImagePipeline, image: Pending, position: int, shape: Tuple[int, ...]
) -> Tuple[np.ndarray, _write.Flips]:
    """``image`` rendered, which must have ``shape`` (HWC), that of the batch's image 0."""
    pixels, flips = image.render(pipeline)
    if pixels.shape != shape:
        raise _mismatch(position, pixels.shape, shape)
    return pixels, flips
