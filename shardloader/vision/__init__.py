"""Fast image pipelines: JPEG decoding and augmentation fused into the loader's workers.

A worker decodes each JPEG with libjpeg-turbo (``simplejpeg``, the GIL released; only the
crop's region where ``_region`` is built), crops and resizes it with OpenCV, and flips it
and applies ToTensor and Normalize as it writes the image's planes into the batch's
shared-memory slot: the float32 NCHW batch Gluon's transforms would have produced
(docs/vision.md).

- ``fuse(dataset, batchify_fn)``: recognise ``dataset.transform_first(Compose([...]))``
  chains of Gluon's transforms; ``fuse_for_loader``, what ``ShardedDataLoader`` calls;
- ``ImagePipeline``: a pipeline described by its parameters, for new code;
- ``ImageRecordLoader`` and ``image_record_iter``: ``mx.io.ImageRecordIter``'s arguments;
- ``normalize``: ToTensor and Normalize for a uint8 batch on its device;
- ``available()``: whether the codecs (the ``vision`` extra) are installed;
- ``native()``: whether each compiled helper (region decode, the one-pass write) is on, and
  if not, why; ``region_decode()``: the first of them.

Modules: ``_codecs`` (the only one importing simplejpeg and cv2), ``_ops`` (the geometric
steps), ``_color`` (the colour jitters), ``pipeline``, ``_sources`` (encoded bytes from each
image dataset), ``_fused`` (the dataset and batchify function), ``recognise`` (``fuse``),
``device``; ``_step`` (the contract each step keeps); ``_write`` (the output stage);
``_scratch`` (per-thread buffers reused from image to image);
``_native`` (building the C helpers: ``_region.c``, region decode, for ``_region``, and
``_write.c`` for ``_write``). Every one sits below the loader, which
calls ``recognise.fuse_for_loader``. ``ImageRecordLoader`` and ``image_record_iter`` are
loaders, so they live above it, in ``shardloader.image_record``; this package names them
lazily (docs/design.md).
"""

from typing import TYPE_CHECKING, Any

from ._codecs import available
from ._native import native
from ._region import region_decode
from .device import normalize
from .pipeline import ImagePipeline
from .recognise import Fusion, fuse, fuse_for_loader

if TYPE_CHECKING:  # for type checkers and the API reference; at run time, __getattr__
    from ..image_record import ImageRecordLoader, image_record_iter

_ABOVE = ("ImageRecordLoader", "image_record_iter")


def __getattr__(name: str) -> Any:
    """``ImageRecordLoader`` and ``image_record_iter``, from the module above the loader."""
    if name in _ABOVE:
        from .. import image_record

        return getattr(image_record, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "available",
    "fuse",
    "fuse_for_loader",
    "Fusion",
    "ImagePipeline",
    "ImageRecordLoader",
    "image_record_iter",
    "native",
    "normalize",
    "region_decode",
]
