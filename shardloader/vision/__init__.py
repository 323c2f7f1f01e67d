"""Fast image pipelines: JPEG decoding and augmentation fused into the loader's workers.

A worker decodes each JPEG with libjpeg-turbo (``simplejpeg``, the GIL released), crops,
resizes and flips it with OpenCV and numpy indexing, writes uint8 pixels into one batch
buffer, and applies ToTensor and Normalize once per batch into the batch's shared-memory
slot: the float32 NCHW batch Gluon's transforms would have produced (docs/vision.md).

- ``fuse(dataset, batchify_fn)``: what ``ShardedDataLoader`` calls to recognise
  ``dataset.transform_first(Compose([...]))`` chains of Gluon's transforms;
- ``ImagePipeline``: a pipeline described by its parameters, for new code;
- ``ImageRecordLoader`` and ``image_record_iter``: ``mx.io.ImageRecordIter``'s arguments;
- ``normalize``: ToTensor and Normalize for a uint8 batch on its device;
- ``available()``: whether the codecs (the ``vision`` extra) are installed.

Modules: ``_codecs`` (the only one importing simplejpeg and cv2), ``_ops`` (the geometric
steps), ``_color`` (the colour jitters), ``pipeline``, ``_sources`` (encoded bytes from each
image dataset), ``_fused`` (the dataset and batchify function), ``recognise`` (``fuse``),
``record_loader``, ``device``.
"""

from ._codecs import available
from .device import normalize
from .pipeline import ImagePipeline
from .recognise import Fusion, fuse
from .record_loader import ImageRecordLoader, image_record_iter

__all__ = [
    "available",
    "fuse",
    "Fusion",
    "ImagePipeline",
    "ImageRecordLoader",
    "image_record_iter",
    "normalize",
]
