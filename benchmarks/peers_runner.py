"""One peer loader, timed in this process: what :mod:`benchmarks.peers` runs in ``.venv-peers``.

Runs under the peers' own venv (torch, torchvision, and FFCV where it built), never under
shardloader's: it imports nothing from MXNet, shardloader or the ``benchmarks`` package, and
is started as a script, ``.venv-peers/bin/python benchmarks/peers_runner.py CASE_JSON``. It
prints one JSON line, the result (or ``{"error": ...}``), and exits. ``CASE_JSON`` is
``{"loader": "torch" | "ffcv", "folder": W7's folder, "beton": FFCV's file, "num_workers": 2,
"min_time_s": 1.5}``; with ``"loader": "beton"`` it only writes the ``.beton`` (if missing).

The loaders, as their own users write them, with W5/W7's augmentation (``RandomResizedCrop``
to 224 with the default area and aspect ranges, a random horizontal flip, float32 in 0..1,
ImageNet's mean and std, channels first), batch 64, shuffled:

- ``torch``: PyTorch's ``DataLoader`` over a map-style dataset of W7's JPEG files: read the
  file's bytes (``torchvision.io.read_file``), ``torchvision.io.decode_jpeg`` to a uint8
  CHW tensor, then ``transforms.v2`` on it (``RandomResizedCrop(224)``,
  ``RandomHorizontalFlip()``, ``ToDtype(torch.float32, scale=True)``, ``Normalize``);
  ``num_workers`` worker processes, ``persistent_workers=True``, torch's default collate.
- ``ffcv``: FFCV's ``Loader`` over a ``.beton`` written from W7's JPEGs
  (``RGBImageField(write_mode="jpg", jpeg_quality=90)``: FFCV stores its own JPEG of the
  decoded pixels; the originals are quality 90 too), ``RandomResizedCropRGBImageDecoder``,
  ``RandomHorizontalFlip``, ``NormalizeImage`` to float32, ``ToTensor``, ``ToTorchImage``;
  ``num_workers`` threads (FFCV's workers are threads running numba-compiled code),
  ``order=RANDOM``.

Timed the way :func:`benchmarks.harness.time_loader` times every loader: one untimed warm-up
epoch (worker start, numba's compilation), then whole epochs until they add up to
``min_time_s``; an epoch's wall time runs from ``iter(loader)`` to its end.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Tuple

CROP = 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BATCH = 64
_MAX_TIMED_EPOCHS = 20


def folder_files(folder: str) -> List[Tuple[str, int]]:
    """W7's images as ``(path, label)``: class folders in sorted order, label = the folder's
    index, as torchvision's ``ImageFolder`` (and Gluon's ``ImageFolderDataset``) number them."""
    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    files = []
    for label, name in enumerate(classes):
        sub = os.path.join(folder, name)
        files += [(os.path.join(sub, f), label) for f in sorted(os.listdir(sub))]
    if not files:
        raise ValueError(f"no images in the class folders of {folder!r}")
    return files


# ---------------------------------------------------------------------------- torchvision
def torch_loader(folder: str, num_workers: int, batch_size: int = BATCH) -> Any:
    import torch
    import torchvision
    from torch.utils.data import DataLoader, Dataset
    from torchvision.transforms import v2

    transform = v2.Compose(
        [
            v2.RandomResizedCrop(CROP),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )

    class JpegFolder(Dataset):  # type: ignore[misc]
        def __init__(self, files: List[Tuple[str, int]]) -> None:
            self.files = files

        def __len__(self) -> int:
            return len(self.files)

        def __getitem__(self, i: int) -> Tuple[Any, int]:
            path, label = self.files[i]
            data = torchvision.io.read_file(path)
            image = torchvision.io.decode_jpeg(data, mode=torchvision.io.ImageReadMode.RGB)
            return transform(image), label

    return DataLoader(
        JpegFolder(folder_files(folder)),
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )


# ---------------------------------------------------------------------------- FFCV
def write_beton(folder: str, path: str) -> str:
    """Write W7's JPEGs to FFCV's ``.beton`` at ``path`` (unless it exists): each image
    decoded (Pillow) and stored by FFCV as a quality-90 JPEG at full size, with its label.
    Written under a temporary name, renamed at the end."""
    if os.path.isfile(path):
        return path
    import numpy as np
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from PIL import Image

    files = folder_files(folder)

    class Images:
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int) -> Tuple[Any, int]:
            name, label = files[i]
            with Image.open(name) as im:
                return np.asarray(im.convert("RGB")), label

    tmp = f"{path}.tmp{os.getpid()}"
    fields = {
        "image": RGBImageField(write_mode="jpg", jpeg_quality=90, max_resolution=None),
        "label": IntField(),
    }
    DatasetWriter(tmp, fields, num_workers=1).from_indexed_dataset(Images())
    os.replace(tmp, path)
    return path


def ffcv_loader(beton: str, num_workers: int, batch_size: int = BATCH) -> Any:
    import numpy as np
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import (
        NormalizeImage,
        RandomHorizontalFlip,
        Squeeze,
        ToTensor,
        ToTorchImage,
    )

    mean = np.array(MEAN) * 255
    std = np.array(STD) * 255
    return Loader(
        beton,
        batch_size=batch_size,
        num_workers=num_workers,
        order=OrderOption.RANDOM,
        drop_last=False,
        os_cache=True,
        pipelines={
            "image": [
                RandomResizedCropRGBImageDecoder((CROP, CROP)),
                RandomHorizontalFlip(),
                NormalizeImage(mean, std, np.float32),
                ToTensor(),
                ToTorchImage(),
            ],
            "label": [IntDecoder(), ToTensor(), Squeeze()],
        },
    )


# ---------------------------------------------------------------------------- timing
def tree_cpu_s() -> float:
    """CPU seconds of this process (its threads: FFCV's workers) and its live descendants
    (torch's worker processes), as :func:`benchmarks.harness.tree_cpu_s` counts them for the
    MXNet loaders (this script cannot import it: it runs in the peers' venv)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _epoch(loader: Any) -> Dict[str, float]:
    samples = batches = 0
    cpu = tree_cpu_s()
    start = time.perf_counter()
    for data, _label in loader:
        samples += int(data.shape[0])
        batches += 1
        del data, _label
    wall = time.perf_counter() - start
    return {"wall_s": wall, "samples": samples, "batches": batches, "cpu_s": tree_cpu_s() - cpu}


def check_batch(data: Any, label: Any) -> None:
    """The first batch is W5/W7's: float32 3x224x224 images, normalised, with labels."""
    shape = tuple(data.shape)
    if shape[1:] != (3, CROP, CROP) or str(data.dtype) != "torch.float32":
        raise RuntimeError(f"wrong first batch: {shape} {data.dtype}")
    low, high = float(data.min()), float(data.max())
    if not (-2.2 <= low < 0 < high <= 2.7):
        raise RuntimeError(f"first batch not normalised: values {low:.2f}..{high:.2f}")
    if len(label) != shape[0]:
        raise RuntimeError(f"{len(label)} labels for {shape[0]} images")


def time_peer(factory: Callable[[], Any], expect: int, min_time_s: float) -> Dict[str, Any]:
    built = time.perf_counter()
    loader = factory()
    it = iter(loader)
    data, label = next(it)
    first_ms = (time.perf_counter() - built) * 1e3
    check_batch(data, label)
    warm = int(data.shape[0]) + sum(int(d.shape[0]) for d, _ in it)
    cold_s = time.perf_counter() - built
    timed: List[Dict[str, float]] = []
    while not timed or (
        sum(r["wall_s"] for r in timed) < min_time_s and len(timed) < _MAX_TIMED_EPOCHS
    ):
        timed.append(_epoch(loader))
    cpu = sum(r["cpu_s"] for r in timed)
    for run in [{"samples": warm}] + timed:
        if run["samples"] != expect:
            raise RuntimeError(f"an epoch delivered {run['samples']} samples, expected {expect}")
    wall = sum(r["wall_s"] for r in timed)
    samples = sum(int(r["samples"]) for r in timed)
    result = {
        "epochs": len(timed),
        "samples": samples,
        "timed_s": wall,
        "samples_per_s": samples / wall,
        "first_batch_ms": first_ms,
        "cold_epoch_s": cold_s,
        "timed_cpu_s": cpu,
        "cpu_ms_per_sample": cpu / samples * 1e3,
    }
    del it, loader  # torch: shuts its persistent workers down
    return result


def run(case: Dict[str, Any]) -> Dict[str, Any]:
    loader = case["loader"]
    folder = case["folder"]
    workers = int(case.get("num_workers", 2))
    min_time_s = float(case.get("min_time_s", 0.5))
    expect = len(folder_files(folder))
    versions: Dict[str, str] = {}
    if loader == "torch":
        import torch
        import torchvision

        versions = {"torch": torch.__version__, "torchvision": torchvision.__version__}
        factory = lambda: torch_loader(folder, workers)  # noqa: E731
    elif loader == "ffcv":
        from importlib.metadata import version

        # ffcv.__version__ says 0.0.3rc1 in the 1.0.2 release: ask the package's metadata.
        versions = {"ffcv": version("ffcv"), "numba": version("numba")}
        beton = write_beton(folder, case["beton"])
        factory = lambda: ffcv_loader(beton, workers)  # noqa: E731
    elif loader == "beton":
        t = time.perf_counter()
        return {"beton": write_beton(folder, case["beton"]), "write_s": time.perf_counter() - t}
    else:
        raise ValueError(f"loader must be 'torch', 'ffcv' or 'beton', got {loader!r}")
    result = time_peer(factory, expect, min_time_s)
    result["versions"] = versions
    return result


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        print(json.dumps({"error": "usage: peers_runner.py CASE_JSON"}))
        return 2
    try:
        result = run(json.loads(argv[0]))
    except BaseException as exc:  # reported to the driver, which records a failed run
        tail = traceback.format_exc().strip().splitlines()[-12:]
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": tail}
    t = os.times()
    result["tree_cpu_s"] = t.user + t.system + t.children_user + t.children_system
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
