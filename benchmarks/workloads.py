"""The benchmark workloads (generated datasets) and one loader factory per case.

Every dataset is a module-level class, so it pickles for any start method, and its data is
generated, never downloaded. Every sample is ``(features, label)`` with ``label == index``,
which lets :func:`build` check that a loader delivers the right samples in the right order
(W5 shuffles: its check looks at the labels of the first batch as a set).

========  ==================================================  =====  ====================
name      sample                                              batch  measures
========  ==================================================  =====  ====================
W1 tiny   64 float32 + int label, 20,000 samples              32     per-batch overhead
W2 image  uint8 3x224x224 + int label, 2,048 distinct (308    64     transfer (9.6 MB
          MB: the data comes from RAM, not from the cache)           batches)
W3 cpu    ~1 ms of numpy work, 64 float32 + label, 4,096      32     parallel scaling
W4 shard  W2 as 2 shards of 32 on two contexts                2x32   sharding + placement
W5 jpeg   2,048 JPEGs 320x256 in an indexed .rec, Gluon's     64     the image pipeline
          ImageRecordDataset + RandomResizedCrop(224), flip,         users run most, also
          ToTensor, Normalize; shuffled                              against ImageRecordIter
W6 nd     W2 with MXNet array samples (uint8 3x224x224;    64     stacking NDArrays
          mx.nd, or mx.np under MXNet 2.x)
W7 folder W5's JPEGs as files in 16 class folders, Gluon's    64     the same pipeline
          ImageFolderDataset + W5's transforms; shuffled             from files
========  ==================================================  =====  ====================

W5's and W7's data and the loaders that read W5's file themselves are in
:mod:`benchmarks.images`.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from . import images

__all__ = [
    "Case",
    "Prepared",
    "WORKLOADS",
    "TinyDataset",
    "ImageDataset",
    "NDImageDataset",
    "CpuDataset",
    "build",
    "calibrate_cpu_work",
    "cpu_work_seconds",
    "mxnet_2",
    "torch_available",
]

LOADERS = (
    "gluon",
    "ours",
    "torch",
    "recorditer",
    "gluon-cpp",
    "ours-cpp",
    "ours-exact",
    "ours-uint8",
)
# MXNet 2.x only: the two loaders with ``try_nopython=True``, on W5 with its transforms in a
# ``HybridCompose`` (Gluon 2.x's C++ pipeline takes only hybridizable transforms, and
# ``Compose`` is a plain ``Sequential``). Where Gluon runs its C++ pipeline, so does
# shardloader (docs/switching.md, "try_nopython").
CPP_LOADERS = ("gluon-cpp", "ours-cpp")
# The image workloads (W5, W7): shardloader fuses their transforms into its own image path
# by default ("ours"); "ours-exact" runs them as Gluon does (``fuse_transforms=False``), and
# "ours-uint8" is ``shardloader.vision.ImageRecordLoader(output="uint8")`` on W5's file.
IMAGE_WORKLOADS = ("W5", "W7")
# Loaders that read W5's file themselves, and the workloads each one may run.
_ONLY_ON = {
    "recorditer": ("W5",),
    "gluon-cpp": ("W5",),
    "ours-cpp": ("W5",),
    "ours-uint8": ("W5",),
    "ours-exact": IMAGE_WORKLOADS,
}


@dataclass(frozen=True)
class WorkloadSpec:
    title: str
    batch_size: int  # samples per step (W4: both shards together)
    samples: int  # the full size; --quick uses ``quick_samples``
    quick_samples: int
    measures: str


WORKLOADS: Dict[str, WorkloadSpec] = {
    "W1": WorkloadSpec(
        "tiny: 64 float32 + label", 32, 20_000, 4_000, "per-batch overhead of the loader"
    ),
    "W2": WorkloadSpec(
        "image: uint8 3x224x224 + label, all distinct",
        64,
        2_048,
        512,
        "moving 9.6 MB batches of data that is in RAM, not in the cache",
    ),
    "W3": WorkloadSpec(
        "cpu: ~1 ms numpy per sample", 32, 4_096, 768, "scaling of CPU-bound work over workers"
    ),
    "W4": WorkloadSpec(
        "sharded: W2 as 2 shards of 32 on 2 contexts",
        64,
        2_048,
        512,
        "sharded steps placed on two contexts",
    ),
    "W5": WorkloadSpec(
        "jpeg: 320x256 JPEG records, Gluon transforms to 3x224x224 float32",
        64,
        2_048,
        256,
        "decode + augment in the workers, against mx.io.ImageRecordIter",
    ),
    "W7": WorkloadSpec(
        "folder: W5's JPEGs as files in class folders, the same transforms",
        64,
        2_048,
        256,
        "the same image pipeline, reading one file per image",
    ),
    "W6": WorkloadSpec(
        "nd: W2 with MXNet array samples (mx.nd; mx.np under MXNet 2.x)",
        64,
        2_048,
        512,
        "stacking NDArray samples in the workers",
    ),
}


@dataclass(frozen=True)
class Case:
    """One measurement: a workload, a loader and its options. JSON round-trips via
    :meth:`to_dict` / ``Case(**d)``."""

    workload: str
    loader: str  # one of LOADERS (recorditer and the -cpp/-uint8 ones: W5 only)
    num_workers: int = 2  # recorditer: its preprocess_threads
    pin_memory: bool = False
    thread_pool: bool = False
    samples: Optional[int] = None  # None: the workload's full size
    work_passes: int = 0  # W3: numpy passes per sample (see calibrate_cpu_work)
    rec_path: Optional[str] = None  # W5: the .rec file (see images.jpeg_records)
    folder: Optional[str] = None  # W7: the class folders (see images.jpeg_folder)

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {sorted(WORKLOADS)}, got {self.workload!r}")
        if self.loader not in LOADERS:
            raise ValueError(f"loader must be one of {LOADERS}, got {self.loader!r}")
        if self.workload == "W3" and self.work_passes < 1:
            raise ValueError(f"W3 needs work_passes >= 1 (calibrate it), got {self.work_passes}")
        if self.workload == "W5" and not self.rec_path:
            raise ValueError("W5 needs rec_path (see images.jpeg_records)")
        if self.workload == "W7" and not self.folder:
            raise ValueError("W7 needs folder (see images.jpeg_folder)")
        only = _ONLY_ON.get(self.loader)
        if only is not None and self.workload not in only:
            raise ValueError(
                f"{self.loader} reads only {' and '.join(only)}'s images, not {self.workload}"
            )
        if self.loader in CPP_LOADERS and not mxnet_2():
            raise ValueError(f"{self.loader} (try_nopython=True) needs MXNet 2.x")

    @property
    def batch_size(self) -> int:
        return WORKLOADS[self.workload].batch_size

    @property
    def num_samples(self) -> int:
        return self.samples if self.samples is not None else WORKLOADS[self.workload].samples

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------- datasets
class TinyDataset:
    """W1: ``n`` samples of ``dim`` float32 features and an int label (the index)."""

    def __init__(self, n: int, dim: int = 64) -> None:
        self._x = np.random.default_rng(0).standard_normal((n, dim), dtype=np.float32)

    def __len__(self) -> int:
        return len(self._x)

    def __getitem__(self, i: int) -> Tuple[np.ndarray, int]:
        return self._x[i], int(i)


def _image_pool(count: int, shape: Tuple[int, ...]) -> np.ndarray:
    """``count`` distinct uint8 images: one random image plus ``k % 251`` for image ``k``.

    Each image has its own memory (W2's 2,048 hold 308 MB, ten times the L3 cache), and the
    pool takes a fraction of a second to make, where drawing every byte at random would take
    about two seconds per run."""
    base = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    pool = np.empty((count, *shape), dtype=np.uint8)
    offsets = (np.arange(count) % 251).astype(np.uint8).reshape((count,) + (1,) * len(shape))
    np.add(base[None], offsets, out=pool)
    return pool


class ImageDataset:
    """W2/W4: ``n`` uint8 images, views into a pool of ``pool`` distinct images (by default
    one per sample, so that the data comes from RAM as in real training: 2,048 images are
    308 MB against a 32 MiB cache)."""

    def __init__(
        self, n: int, pool: Optional[int] = None, shape: Tuple[int, ...] = (3, 224, 224)
    ) -> None:
        self._pool = _image_pool(min(n, pool or n), shape)
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> Tuple[np.ndarray, int]:
        if not 0 <= i < self._n:
            raise IndexError(f"index {i} out of range for {self._n} samples")
        return self._pool[i % len(self._pool)], int(i)


class NDImageDataset:
    """W6: W2 with MXNet array samples: each distinct image is made into an array once, here,
    and ``__getitem__`` returns it (as a dataset that decodes or augments with MXNet hands
    MXNet arrays to the batchify function). The arrays are the installed MXNet's own:
    ``mx.nd.NDArray`` under 1.x, ``mx.np.ndarray`` under 2.x, whose transforms make those
    (and whose Gluon cannot batch legacy NDArrays: its ``Stack`` goes element by element)."""

    def __init__(
        self, n: int, pool: Optional[int] = None, shape: Tuple[int, ...] = (3, 224, 224)
    ) -> None:
        import mxnet as mx

        images = _image_pool(min(n, pool or n), shape)
        make = mx.np.array if mxnet_2() else mx.nd.array
        self._pool = [make(image, dtype="uint8") for image in images]
        del images
        mx.nd.waitall()
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> Tuple[Any, int]:
        if not 0 <= i < self._n:
            raise IndexError(f"index {i} out of range for {self._n} samples")
        return self._pool[i % len(self._pool)], int(i)


# float64 elements per numpy pass. 256 KiB stays in cache, so the time is proportional to the
# passes; and ~60 numpy calls per ms keep GIL hand-offs rare. (With 8192 elements, ~250 calls
# per ms, two Python threads sometimes convoy on the GIL and get no speed-up at all, with
# either loader: thread mode would measure that pathology, not the loader.)
_CPU_VECTOR = 32768


def _cpu_work(base: np.ndarray, i: int, passes: int) -> np.ndarray:
    v = base * (1.0 + (i % 97) * 1e-3)
    for _ in range(passes):
        v = np.sqrt(np.abs(np.sin(v)) + 1.0)
    return v


class CpuDataset:
    """W3: every ``__getitem__`` runs ``work_passes`` numpy passes (sin, abs, add, sqrt) over
    32768 float64 (about 1 ms once calibrated) and returns 64 float32 and the label."""

    def __init__(self, n: int, work_passes: int) -> None:
        self._n = n
        self._passes = work_passes
        self._base = np.linspace(0.0, 1.0, _CPU_VECTOR)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> Tuple[np.ndarray, int]:
        if not 0 <= i < self._n:
            raise IndexError(f"index {i} out of range for {self._n} samples")
        return _cpu_work(self._base, i, self._passes)[:64].astype(np.float32), int(i)


def cpu_work_seconds(work_passes: int, calls: int = 200) -> float:
    """Seconds of one W3 sample's work: the fastest of ``calls``, so that load from other
    processes on a shared machine skews the calibration as little as possible."""
    base = np.linspace(0.0, 1.0, _CPU_VECTOR)
    times = []
    for i in range(calls):
        start = time.perf_counter()
        _cpu_work(base, i, work_passes)
        times.append(time.perf_counter() - start)
    return float(min(times))


def calibrate_cpu_work(target_s: float = 1e-3) -> Tuple[int, float]:
    """Find the number of numpy passes that makes one W3 sample cost about ``target_s``.

    Returns ``(work_passes, measured seconds per sample)``. The calibration is reported
    with the results: W3's numbers only compare loaders on the same work.
    """
    per_pass = cpu_work_seconds(8, calls=100) / 8
    passes = max(1, round(target_s / per_pass))
    return passes, cpu_work_seconds(passes)


# ---------------------------------------------------------------------------- loaders
class Prepared(NamedTuple):
    """What :func:`benchmarks.harness.time_loader` needs to time one case."""

    factory: Callable[[], Any]  # builds the loader (timed as part of the first batch)
    adapt: Optional[Callable[[Any], Any]]  # per-step work of the user's loop (split_and_load)
    check: Callable[[Any], None]  # raises if the first batch of an epoch is wrong
    samples: int
    warmup_epochs: int = 1


def make_dataset(case: Case) -> Any:
    n = case.num_samples
    if case.workload == "W1":
        return TinyDataset(n)
    if case.workload in ("W2", "W4"):
        return ImageDataset(n)
    if case.workload == "W5":
        if case.loader in ("recorditer", "ours-uint8"):
            return None  # reads the file itself
        return images.jpeg_dataset(case.rec_path, hybrid=case.loader in CPP_LOADERS)
    if case.workload == "W7":
        return images.folder_dataset(case.folder)
    if case.workload == "W6":
        return NDImageDataset(n)
    return CpuDataset(n, case.work_passes)


def _shard_contexts(pinned: bool) -> List[Any]:
    import mxnet as mx

    make = mx.cpu_pinned if pinned else mx.cpu
    return [make(0), make(1)]


def _nopython(case: Case) -> Dict[str, Any]:
    return {"try_nopython": True} if case.loader in CPP_LOADERS else {}


def _gluon(case: Case, dataset: Any) -> Any:
    from mxnet.gluon.data import DataLoader

    return DataLoader(
        dataset,
        batch_size=case.batch_size,
        shuffle=case.workload in IMAGE_WORKLOADS,
        num_workers=case.num_workers,
        pin_memory=case.pin_memory,
        thread_pool=case.thread_pool,
        **_nopython(case),
    )


def _ours(case: Case, dataset: Any) -> Any:
    from shardloader import ShardedDataLoader

    kwargs: Dict[str, Any] = {
        "batch_size": case.batch_size,
        "shuffle": case.workload in IMAGE_WORKLOADS,
        "num_workers": case.num_workers,
        "thread_pool": case.thread_pool,
        **_nopython(case),
    }
    if case.loader == "ours-exact":
        kwargs["fuse_transforms"] = False
    if case.workload == "W4":
        # ctx and pin_memory are exclusive in shardloader: pinning means pinned contexts.
        kwargs.update(
            batch_size=case.batch_size // 2,
            num_shards=2,
            ctx=_shard_contexts(case.pin_memory),
        )
    else:
        kwargs["pin_memory"] = case.pin_memory
    return ShardedDataLoader(dataset, **kwargs)


def _torch_collate(samples: List[Any]) -> Any:
    """torch's default collate after turning MXNet arrays into numpy (W5, W6): what a torch
    user with an MXNet dataset has to do."""
    from torch.utils.data import default_collate

    def plain(x: Any) -> Any:
        if isinstance(x, (list, tuple)):
            return type(x)(plain(v) for v in x)
        return x.asnumpy() if hasattr(x, "asnumpy") else x

    return default_collate([plain(s) for s in samples])


def _torch(case: Case, dataset: Any) -> Any:
    import torch
    from torch.utils.data import DataLoader

    if case.workload == "W4" or case.thread_pool:
        raise ValueError("torch runs W1-W3, W5 and W6 with process workers only")
    kwargs: Dict[str, Any] = {}
    if case.workload in ("W5", "W6", "W7"):
        kwargs["collate_fn"] = _torch_collate
    return DataLoader(
        dataset,
        batch_size=case.batch_size,
        shuffle=case.workload in IMAGE_WORKLOADS,
        num_workers=case.num_workers,
        # Without CUDA torch ignores pin_memory with a warning; ask only where it works.
        pin_memory=case.pin_memory and torch.cuda.is_available(),
        # Gluon and shardloader keep their workers across epochs; let torch do the same.
        persistent_workers=case.num_workers > 0,
        **kwargs,
    )


def _recorditer(case: Case, dataset: Any) -> Any:
    return images.RecordIterLoader(case.rec_path, case.batch_size, max(1, case.num_workers))


def _vision_uint8(case: Case, dataset: Any) -> Any:
    return images.vision_loader(
        case.rec_path, case.batch_size, case.num_workers, case.thread_pool, "uint8"
    )


_FACTORIES = {
    "gluon": _gluon,
    "ours": _ours,
    "torch": _torch,
    "recorditer": _recorditer,
    "gluon-cpp": _gluon,
    "ours-cpp": _ours,
    "ours-exact": _ours,
    "ours-uint8": _vision_uint8,
}


def _gluon_split(pinned: bool) -> Callable[[Any], Any]:
    """Gluon has no sharded loader: its users split every batch with split_and_load."""
    from mxnet.gluon.utils import split_and_load

    ctxs = _shard_contexts(pinned)

    def adapt(batch: Any) -> Any:
        data, label = batch
        return list(zip(split_and_load(data, ctxs), split_and_load(label, ctxs)))

    return adapt


def _device_of(x: Any) -> Any:
    """An array's device: ``.device`` under MXNet 2.x, ``.context`` under 1.x."""
    return x.device if mxnet_2() else x.context


def _to_numpy(x: Any) -> np.ndarray:
    return x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x)


def _checker(case: Case) -> Callable[[Any], None]:
    if case.workload in IMAGE_WORKLOADS:
        return _shuffled_checker(case)
    sharded = case.workload == "W4"
    expected_ctx = _shard_contexts(case.pin_memory) if sharded else None
    per_shard = case.batch_size // 2 if sharded else case.batch_size

    def check(batch: Any) -> None:
        shards = batch if sharded else [batch]
        for k, shard in enumerate(shards):
            labels = _to_numpy(shard[1]).ravel()
            want = np.arange(k * per_shard, (k + 1) * per_shard)
            if labels.shape != want.shape or not (labels == want).all():
                raise RuntimeError(
                    f"{case.loader}: wrong first batch (shard {k}): labels "
                    f"{labels[:8].tolist()}..., expected {want[:8].tolist()}..."
                )
            if expected_ctx is not None and _device_of(shard[0]) != expected_ctx[k]:
                raise RuntimeError(
                    f"{case.loader}: shard {k} is on {_device_of(shard[0])}, "
                    f"expected {expected_ctx[k]}"
                )

    return check


def _shuffled_checker(case: Case) -> Callable[[Any], None]:
    """W5's and W7's first batch: 3x224x224 images, float32 and normalised (``ours-uint8``:
    uint8 pixels, channels first or last), and labels that are distinct sample indices (W5;
    the order is shuffled) or class indices (W7). Each epoch's sample count is checked
    separately."""
    uint8 = case.loader == "ours-uint8"
    want_shapes = [(3, images.JPEG_CROP, images.JPEG_CROP)]
    if uint8:
        want_shapes.append((images.JPEG_CROP, images.JPEG_CROP, 3))
    want_dtype = np.uint8 if uint8 else np.float32
    # The range of ToTensor + Normalize's output, with W5's mean and std.
    low = min(-m / s for m, s in zip(images.MEAN, images.STD))
    high = max((1 - m) / s for m, s in zip(images.MEAN, images.STD))

    def check(batch: Any) -> None:
        data, labels = batch[0], _to_numpy(batch[1]).ravel()
        shape = tuple(data.shape)
        if shape[1:] not in want_shapes or np.dtype(data.dtype) != want_dtype:
            raise RuntimeError(
                f"{case.loader}: first batch is {shape} {data.dtype}, expected "
                f"{' or '.join(f'(n, {w[0]}, {w[1]}, {w[2]})' for w in want_shapes)} "
                f"{np.dtype(want_dtype).name}"
            )
        first = _to_numpy(data[0])  # one image: a few hundred KB, well under a ms
        if not uint8 and not (low - 1e-3 <= first.min() and first.max() <= high + 1e-3):
            raise RuntimeError(
                f"{case.loader}: first image ranges {first.min():.3f} to {first.max():.3f}, "
                f"outside ToTensor + Normalize's {low:.3f} to {high:.3f}"
            )
        ok = (
            labels.shape == (shape[0],)
            and (labels == np.round(labels)).all()
            and labels.min() >= 0
            and (
                labels.max() < images.FOLDER_CLASSES
                if case.workload == "W7"
                else len(np.unique(labels)) == len(labels)
            )
        )
        if not ok:
            raise RuntimeError(f"{case.loader}: first batch has labels {labels[:8].tolist()}...")

    return check


def _import_loader(loader: str) -> None:
    """Import the loader's modules now, so that importing them is not timed."""
    if loader == "torch":
        import torch.utils.data  # noqa: F401
    else:
        import mxnet.gluon.data  # noqa: F401
        import mxnet.gluon.utils  # noqa: F401

        if loader.startswith("ours"):
            import shardloader  # noqa: F401
        if loader in ("ours", "ours-uint8"):
            try:  # the fused image path (shardloader[vision]): absent, "ours" runs as Gluon
                import shardloader.vision  # noqa: F401
            except ImportError:
                pass


def _record_count(rec_path: str) -> int:
    with open(os.path.splitext(rec_path)[0] + ".idx") as f:
        return sum(1 for line in f if line.strip())


def build(case: Case) -> Prepared:
    """Generate the dataset of ``case``, import its loader and return the loader factory."""
    _import_loader(case.loader)
    dataset = make_dataset(case)
    adapt = (
        _gluon_split(case.pin_memory) if case.workload == "W4" and case.loader == "gluon" else None
    )

    def factory() -> Any:
        return _FACTORIES[case.loader](case, dataset)

    samples = _record_count(case.rec_path) if dataset is None else len(dataset)
    # W5 and W7 inline have no workers to start, and one epoch takes seconds: their first
    # epoch is timed (its first batch's one-off costs are a few ms of it). Anything with
    # workers or threads, ImageRecordIter included, gets a whole warm-up epoch first.
    warm = 0 if case.workload in IMAGE_WORKLOADS and case.num_workers == 0 else 1
    return Prepared(factory, adapt, _checker(case), samples, warm)


@functools.lru_cache(maxsize=None)
def mxnet_2() -> bool:
    """Whether the installed MXNet is 2.x (looked up, not imported)."""
    from importlib.metadata import version

    return int(version("mxnet").split(".")[0]) >= 2


def torch_available() -> bool:
    """Whether torch is installed (optional: never a dependency).

    Only looked up, not imported: importing torch here would change this process (its
    OpenMP runtime and CPU flags), and with it the W3 calibration. A torch that is installed
    but fails to import shows up as failed torch runs in the report.
    """
    import importlib.util

    return importlib.util.find_spec("torch") is not None
