"""The fused path's dataset and batchify function.

``FusedDataset.__getitem__`` reads an image's bytes, parses its JPEG header and draws the
pipeline's random parameters: that is all that runs while the loader has seeded the sample
(docs/design.md, invariant 5), so seeded thread workers hold their lock only briefly.
``FusedBatchify`` then decodes, crops, resizes and flips each image into one small uint8
buffer and, while it is still in the cache, applies ToTensor and Normalize as it splits it
into its planes of the batch, a buffer from the batch allocator (a worker's shared-memory
slot); for ``output="hwc"`` the image is written straight into the batch.

An image libjpeg-turbo cannot read (PNG, CMYK, damaged bytes) is decoded by MXNet's own
decoder instead; one no decoder reads raises the dataset's own error, naming the record.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np
from mxnet.base import MXNetError

from .. import batchify as _batchify
from .._engine.ipc import alloc as _alloc
from ..recordio._imagesize import ImageTooLarge, refusal, too_large
from . import _codecs
from .pipeline import ImagePipeline, _ShapeMismatch

_scratch = threading.local()


class Pending:
    """One image of a fused sample: its bytes and drawn parameters, decoded in batchify."""

    __slots__ = ("source", "index", "data", "size", "params", "floor", "pixels")

    def __init__(self, source, index, data, size, params, floor, pixels=None) -> None:
        self.source, self.index, self.data = source, index, data
        self.size, self.params, self.floor, self.pixels = size, params, floor, pixels

    def shape(self, pipeline: ImagePipeline) -> Tuple[int, int, int]:
        """The HWC shape of the rendered image."""
        return pipeline.output_shape(self.size[0], self.size[1], self.params)

    def render(self, pipeline: ImagePipeline, out: np.ndarray) -> None:
        """Decode if not yet decoded, and write the image after the pipeline's steps into
        ``out`` (uint8 HWC)."""
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
        pipeline.render(pixels, params, size, out)

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


def _buffer(shape: Tuple[int, ...]) -> np.ndarray:
    """A per-thread uint8 buffer of at least ``shape``, reused from batch to batch."""
    buf = getattr(_scratch, "buf", None)
    size = int(np.prod(shape))
    if buf is None or buf.size < size:
        buf = _scratch.buf = np.empty(size, np.uint8)
    return buf[:size].reshape(shape)


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
        image_shape = (height, width, channels)
        if pipeline.output == "hwc":
            pixels = _alloc.empty((n,) + image_shape, np.uint8)
            for i, image in enumerate(images):
                _render(pipeline, image, i, pixels[i])
            return _alloc.to_output(pixels)
        # Planar output: each image is rendered into one small buffer and spread into its
        # planes at once, while its pixels are still in the cache.
        lut = None if pipeline.output == "uint8" else pipeline.lut
        dtype = np.uint8 if lut is None else pipeline.dtype
        out = _alloc.empty((n, channels, height, width), dtype)
        scratch = _buffer(image_shape)
        for i, image in enumerate(images):
            _render(pipeline, image, i, scratch)
            _planes(scratch, out[i], lut)
        return _alloc.to_output(out)


def _render(pipeline: ImagePipeline, image: Pending, position: int, out: np.ndarray) -> None:
    try:
        image.render(pipeline, out)
    except _ShapeMismatch as exc:
        raise _mismatch(position, exc.shape, out.shape) from None


def _planes(pixels: np.ndarray, out: np.ndarray, lut: Optional[np.ndarray]) -> None:
    """One HWC uint8 image into its CHW ``out``, through ``lut[c]`` per channel if given.

    OpenCV splits the image into contiguous planes in one pass and maps each through its
    table (measured fastest of numpy's take, arithmetic and per-pixel tables:
    docs/design.md, "Image decoding").
    """
    cv2 = _codecs.loaded()[1]
    height, width, channels = pixels.shape
    if lut is None:
        if channels == 1:
            out[0] = pixels[:, :, 0]
        else:
            cv2.split(pixels, list(out))
        return
    planes = [pixels[:, :, 0]] if channels == 1 else cv2.split(pixels, _buffer_planes(pixels))
    for c, plane in enumerate(planes):
        table = lut[c].reshape(1, 256)
        if out.dtype == np.float32:
            cv2.LUT(plane, table, dst=out[c])
        else:
            np.copyto(out[c], cv2.LUT(plane, table), casting="unsafe")


def _buffer_planes(pixels: np.ndarray) -> list:
    """Per-thread uint8 planes for one image's channels, reused from image to image."""
    height, width, channels = pixels.shape
    planes = getattr(_scratch, "planes", None)
    if planes is None or len(planes) != channels or planes[0].shape != (height, width):
        planes = _scratch.planes = [np.empty((height, width), np.uint8) for _ in range(channels)]
    return planes
