"""The image workloads' data and the image loaders that are not DataLoaders.

- **W5**: 2,048 generated JPEGs of 320x256 in an indexed ``.rec`` (:func:`jpeg_records`),
  read through Gluon's ``ImageRecordDataset`` and four of its vision transforms
  (:func:`jpeg_dataset`).
- **W7**: the same JPEGs as files in class folders (:func:`jpeg_folder`), read through
  Gluon's ``ImageFolderDataset`` and the same transforms (:func:`folder_dataset`).
- The loaders that read W5's file themselves: ``mx.io.ImageRecordIter``
  (:class:`RecordIterLoader`) and ``shardloader.vision.ImageRecordLoader``
  (:func:`vision_loader`, for the ``uint8`` output).
- The single-process probes behind the ideals: :func:`jpeg_per_sample` (Gluon's pipeline,
  ``dataset[i]``) and :func:`fused_per_sample` (decode + crop in shardloader's fused code).
"""

from __future__ import annotations

import io
import os
import time
from typing import Any, Dict, Tuple

import numpy as np

__all__ = [
    "JPEG_CROP",
    "MEAN",
    "STD",
    "RecordIterLoader",
    "folder_dataset",
    "fused_per_sample",
    "jpeg_dataset",
    "jpeg_folder",
    "jpeg_per_sample",
    "jpeg_records",
    "jpeg_transform",
    "vision_loader",
    "write_jpeg_folder",
    "write_jpeg_records",
]

# The records, and the pipeline (ImageNet's mean and std, as most users write them).
JPEG_SIZE = (256, 320)  # height, width
JPEG_QUALITY = 90
JPEG_CROP = 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
_JPEG_VERSION = 1  # part of the cached files' names: bump when the generator changes
# ``RandomResizedCrop``'s defaults (area 8-100% of the image, aspect ratio 3/4 to 4/3) in
# ImageRecordIter's argument names: ``ImageRecordLoader`` draws ImageRecordIter's crops over
# Gluon's ranges, so that its uint8 output does the fused float32 path's work. ImageRecordIter
# keeps its own defaults (``min_random_area=1``, ``max_aspect_ratio=0``), the anchor as W5 has
# always measured it; with these ranges it measured no faster (docs/benchmarks.md).
_CROP_ARGS = {
    "random_resized_crop": True,
    "min_random_area": 0.08,
    "max_random_area": 1.0,
    "min_aspect_ratio": 3.0 / 4.0,
    "max_aspect_ratio": 4.0 / 3.0,
}
# W7's class folders: image ``i`` of W5's records goes to folder ``i % FOLDER_CLASSES``.
FOLDER_CLASSES = 16


def _jpeg_pixels(rng: np.random.Generator, noise: np.ndarray) -> np.ndarray:
    """One HxWx3 uint8 image: two smooth colour gradients (random frequencies and phases)
    plus grain, so that a JPEG of it is about as large as a photo's of the same size."""
    height, width = JPEG_SIZE
    freq = rng.uniform(1.0, 7.0, (2, 3, 1))
    phase = rng.uniform(0.0, 2 * np.pi, (2, 3, 1))
    across = 60 + 50 * np.sin(np.linspace(0, 1, width, dtype=np.float32) * freq[0] + phase[0])
    down = 60 + 50 * np.sin(np.linspace(0, 1, height, dtype=np.float32) * freq[1] + phase[1])
    planes = across.astype(np.uint8)[:, None, :] + down.astype(np.uint8)[:, :, None]  # 3xHxW
    start = int(rng.integers(0, noise.size - planes.size))
    planes += noise[start : start + planes.size].reshape(planes.shape)
    return np.ascontiguousarray(planes.transpose(1, 2, 0))


def write_jpeg_records(rec_path: str, n: int, seed: int = 0) -> Tuple[str, str]:
    """Write ``n`` generated 320x256 JPEGs (quality 90, Pillow) to an indexed RecordIO file.

    Record ``i`` has key ``i`` and label ``float(i)``. The files are written under temporary
    names and renamed at the end, so an interrupted run leaves no half-written file behind
    under the final name. Returns ``(rec_path, idx_path)``.
    """
    import mxnet as mx
    from PIL import Image

    idx_path = os.path.splitext(rec_path)[0] + ".idx"
    folder = os.path.dirname(os.path.abspath(rec_path))
    os.makedirs(folder, exist_ok=True)
    tmp_rec, tmp_idx = f"{rec_path}.tmp{os.getpid()}", f"{idx_path}.tmp{os.getpid()}"
    rng = np.random.default_rng(seed)
    noise = (rng.random(4 << 20, dtype=np.float32) * 24).astype(np.uint8)
    writer = mx.recordio.MXIndexedRecordIO(tmp_idx, tmp_rec, "w")
    try:
        for i in range(n):
            buffer = io.BytesIO()
            Image.fromarray(_jpeg_pixels(rng, noise)).save(
                buffer, format="JPEG", quality=JPEG_QUALITY
            )
            header = mx.recordio.IRHeader(0, float(i), i, 0)
            writer.write_idx(i, mx.recordio.pack(header, buffer.getvalue()))
    finally:
        writer.close()
    os.replace(tmp_idx, idx_path)
    os.replace(tmp_rec, rec_path)
    return rec_path, idx_path


def jpeg_records(folder: str, n: int) -> str:
    """The path of W5's ``.rec`` with ``n`` images in ``folder``, written if missing (the
    generator is deterministic, so a file from an earlier run is reused)."""
    rec_path = os.path.join(folder, f"w5-jpeg-{n}-v{_JPEG_VERSION}.rec")
    if not (os.path.isfile(rec_path) and os.path.isfile(os.path.splitext(rec_path)[0] + ".idx")):
        write_jpeg_records(rec_path, n)
    return rec_path


def write_jpeg_folder(rec_path: str, folder: str) -> str:
    """Write every JPEG of W5's records to ``folder`` as files in class folders (W7).

    Record ``i`` becomes ``<folder>/c<k>/<i>.jpg`` with ``k = i % 16`` (zero-padded), so
    Gluon's ``ImageFolderDataset`` labels it ``k``. The bytes are the records' own: W5 and W7
    decode the very same JPEGs. The folder is written under a temporary name and renamed at
    the end. Returns ``folder``.
    """
    import mxnet as mx

    tmp = f"{folder}.tmp{os.getpid()}"
    for k in range(FOLDER_CLASSES):
        os.makedirs(os.path.join(tmp, f"c{k:02d}"), exist_ok=True)
    reader = mx.recordio.MXIndexedRecordIO(os.path.splitext(rec_path)[0] + ".idx", rec_path, "r")
    try:
        for i in sorted(reader.keys):
            _, payload = mx.recordio.unpack(reader.read_idx(i))
            name = os.path.join(tmp, f"c{i % FOLDER_CLASSES:02d}", f"{i:05d}.jpg")
            with open(name, "wb") as f:
                f.write(payload)
    finally:
        reader.close()
    os.replace(tmp, folder)
    return folder


def jpeg_folder(folder: str, n: int) -> str:
    """The path of W7's class folders with W5's ``n`` images in ``folder``, written (with
    W5's records, if those are missing too) unless an earlier run left them."""
    path = os.path.join(folder, f"w7-jpeg-{n}-v{_JPEG_VERSION}")
    if not os.path.isdir(path):
        write_jpeg_folder(jpeg_records(folder, n), path)
    return path


def folder_count(path: str) -> int:
    """The number of images in W7's class folders."""
    return sum(len(files) for _, _, files in os.walk(path))


def jpeg_transform(crop: int = JPEG_CROP, hybrid: bool = False) -> Any:
    """W5's augmentation, in Gluon's own transforms; ``hybrid``: in MXNet 2.x's
    ``HybridCompose``, which its C++ pipeline can run."""
    from mxnet.gluon.data.vision import transforms as T

    compose = T.HybridCompose if hybrid else T.Compose
    return compose(
        [T.RandomResizedCrop(crop), T.RandomFlipLeftRight(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )


def jpeg_dataset(rec_path: str, crop: int = JPEG_CROP, hybrid: bool = False) -> Any:
    """W5's dataset, exactly as a Gluon user writes it (see :func:`jpeg_transform`)."""
    from mxnet.gluon.data.vision import ImageRecordDataset

    return ImageRecordDataset(rec_path).transform_first(jpeg_transform(crop, hybrid))


def folder_dataset(path: str, crop: int = JPEG_CROP, hybrid: bool = False) -> Any:
    """W7's dataset, as a Gluon user writes it: ``ImageFolderDataset`` and W5's transforms."""
    from mxnet.gluon.data.vision import ImageFolderDataset

    return ImageFolderDataset(path).transform_first(jpeg_transform(crop, hybrid))


def jpeg_per_sample(rec_path: str, count: int = 300, warmup: int = 10) -> Dict[str, Any]:
    """Seconds per sample of W5's dataset in this process: ``dataset[i]`` (read, decode,
    augment) until its image is readable, over ``count`` samples after ``warmup``.

    Run it in a process forked from the fork server, as the loaders' runs are: MXNet then
    runs its operators on one thread, as in a worker process (MXNet restricts OpenMP in
    forked children), so ``num_workers`` times its rate is the ideal of the workers.
    """
    dataset = jpeg_dataset(rec_path)
    n = len(dataset)
    for i in range(warmup):
        dataset[i % n][0].wait_to_read()
    start = time.perf_counter()
    cpu = time.process_time()
    for i in range(count):
        dataset[(warmup + i) % n][0].wait_to_read()
    wall = time.perf_counter() - start
    return {
        "samples": count,
        "s_per_sample": wall / count,
        "cpu_per_sample": (time.process_time() - cpu) / count,
        "samples_per_s": count / wall,
    }


class RecordIterLoader:
    """``mx.io.ImageRecordIter`` on W5's records, iterable once per epoch like a DataLoader:
    each epoch ``reset()``\\ s the iterator and yields ``(data, label)``.

    W5's augmentation as ImageRecordIter spells it, done in C++: ``random_resized_crop`` to
    224 (with ImageRecordIter's default ranges), random mirror, mean/std normalisation to
    float32 CHW, shuffled through the index.
    """

    def __init__(self, rec_path: str, batch_size: int, threads: int) -> None:
        import mxnet as mx

        self._iter = mx.io.ImageRecordIter(
            **_record_iter_args(rec_path, batch_size),
            random_resized_crop=True,
            preprocess_threads=threads,
        )
        self._epochs = 0

    def __iter__(self):
        if self._epochs:
            self._iter.reset()
        self._epochs += 1
        for batch in self._iter:
            data, label = batch.data[0], batch.label[0]
            if batch.pad:  # not with W5's whole batches; kept honest for other sizes
                keep = data.shape[0] - batch.pad
                data, label = data[:keep], label[:keep]
            yield data, label

    def close(self) -> None:
        self._iter = None


def vision_loader(
    rec_path: str, batch_size: int, num_workers: int, thread_pool: bool, output: str
) -> Any:
    """``shardloader.vision.ImageRecordLoader`` on W5's records, with ``ImageRecordIter``'s
    arguments as :class:`RecordIterLoader` passes them (mean and std in 0..255 units),
    ``num_workers`` as ``preprocess_threads`` (0: inline), and ``output`` (``"float32"``:
    normalised NCHW, as Gluon's transforms give; ``"uint8"``: the pixels, normalisation left
    to the device)."""
    from shardloader.vision import ImageRecordLoader

    return ImageRecordLoader(
        **_record_iter_args(rec_path, batch_size),
        **_CROP_ARGS,
        preprocess_threads=num_workers,
        output=output,
        thread_pool=thread_pool,
    )


def _record_iter_args(rec_path: str, batch_size: int) -> Dict[str, Any]:
    """The arguments ``ImageRecordIter`` and ``ImageRecordLoader`` share on W5: the records,
    the crop's shape, shuffling, mirroring, and ImageNet's mean and std in pixel units."""
    return dict(
        path_imgrec=rec_path,
        path_imgidx=os.path.splitext(rec_path)[0] + ".idx",
        data_shape=(3, JPEG_CROP, JPEG_CROP),
        batch_size=batch_size,
        shuffle=True,
        rand_mirror=True,
        mean_r=MEAN[0] * 255,
        mean_g=MEAN[1] * 255,
        mean_b=MEAN[2] * 255,
        std_r=STD[0] * 255,
        std_g=STD[1] * 255,
        std_b=STD[2] * 255,
        seed=0,
    )


def fused_per_sample(rec_path: str, count: int = 300, warmup: int = 64) -> Dict[str, Any]:
    """Seconds per image of the fused path's per-image work in this process: read the
    record, decode (at a reduced scale where the crop allows), crop, resize, flip and write
    the uint8 pixels into the batch, with W5's crops. ``num_workers`` over it is W5's
    **decode bound**: what that many workers could deliver if the loader cost nothing.

    Timed as ``ImageRecordLoader(output="uint8")`` inline (``preprocess_threads=0``), batch
    64: the fused code itself, with no worker, no transport and no normalisation (which the
    float32 path applies as it writes each image). ``count`` images after ``warmup``, each
    rounded down to whole batches of 64 (at least one).
    """
    batch = 64
    warm_batches = max(1, warmup // batch)
    total = warm_batches + max(1, count // batch)
    loader = vision_loader(rec_path, batch, 0, False, "uint8")
    if len(loader) == 0:
        raise ValueError(f"fewer than {batch} images in {rec_path}")
    done = images = 0
    start = cpu = 0.0
    try:
        while done < total:  # as many epochs as it takes
            for data, _ in loader:
                data.wait_to_read()
                done += 1
                if done == warm_batches:
                    start, cpu = time.perf_counter(), time.process_time()
                elif done > warm_batches:
                    images += data.shape[0]
                if done == total:
                    break
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu
    finally:
        loader.close()
    return {
        "samples": images,
        "s_per_sample": wall / images,
        "cpu_per_sample": cpu / images,
        "samples_per_s": images / wall,
    }
