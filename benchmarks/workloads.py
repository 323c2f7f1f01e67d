"""The benchmark workloads (generated datasets) and one loader factory per case.

Every dataset is a module-level class, so it pickles for any start method, and its data is
generated, never downloaded. Every sample is ``(features, label)`` with ``label == index``,
which lets :func:`build` check that a loader delivers the right samples in the right order.

========  ==================================================  =====  ====================
name      sample                                              batch  measures
========  ==================================================  =====  ====================
W1 tiny   64 float32 + int label, 20,000 samples              32     per-batch overhead
W2 image  uint8 3x224x224 + int label, 2,048 samples          64     transfer (9.6 MB)
W3 cpu    ~1 ms of numpy work, 64 float32 + label, 4,096      32     parallel scaling
W4 shard  W2 as 2 shards of 32 on two contexts                2x32   sharding + placement
========  ==================================================  =====  ====================
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

__all__ = [
    "Case",
    "Prepared",
    "WORKLOADS",
    "TinyDataset",
    "ImageDataset",
    "CpuDataset",
    "build",
    "calibrate_cpu_work",
    "cpu_work_seconds",
    "torch_available",
]

LOADERS = ("gluon", "ours", "torch")


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
        "image: uint8 3x224x224 + label", 64, 2_048, 512, "moving 9.6 MB batches to the user"
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
}


@dataclass(frozen=True)
class Case:
    """One measurement: a workload, a loader and its options. JSON round-trips via
    :meth:`to_dict` / ``Case(**d)``."""

    workload: str
    loader: str  # "gluon", "ours" or "torch"
    num_workers: int = 2
    pin_memory: bool = False
    thread_pool: bool = False
    samples: Optional[int] = None  # None: the workload's full size
    work_passes: int = 0  # W3: numpy passes per sample (see calibrate_cpu_work)

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {sorted(WORKLOADS)}, got {self.workload!r}")
        if self.loader not in LOADERS:
            raise ValueError(f"loader must be one of {LOADERS}, got {self.loader!r}")
        if self.workload == "W3" and self.work_passes < 1:
            raise ValueError(f"W3 needs work_passes >= 1 (calibrate it), got {self.work_passes}")

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


class ImageDataset:
    """W2/W4: ``n`` uint8 images, each a view into a pool of ``pool`` distinct images, so the
    dataset holds 9.6 MB whatever ``n`` is and does not skew the RSS measurement."""

    def __init__(self, n: int, pool: int = 64, shape: Tuple[int, ...] = (3, 224, 224)) -> None:
        rng = np.random.default_rng(0)
        self._pool = rng.integers(0, 256, (pool, *shape), dtype=np.uint8)
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> Tuple[np.ndarray, int]:
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


def make_dataset(case: Case) -> Any:
    n = case.num_samples
    if case.workload == "W1":
        return TinyDataset(n)
    if case.workload in ("W2", "W4"):
        return ImageDataset(n)
    return CpuDataset(n, case.work_passes)


def _shard_contexts(pinned: bool) -> List[Any]:
    import mxnet as mx

    make = mx.cpu_pinned if pinned else mx.cpu
    return [make(0), make(1)]


def _gluon(case: Case, dataset: Any) -> Any:
    from mxnet.gluon.data import DataLoader

    return DataLoader(
        dataset,
        batch_size=case.batch_size,
        num_workers=case.num_workers,
        pin_memory=case.pin_memory,
        thread_pool=case.thread_pool,
    )


def _ours(case: Case, dataset: Any) -> Any:
    from shardloader import ShardedDataLoader

    kwargs: Dict[str, Any] = {
        "batch_size": case.batch_size,
        "num_workers": case.num_workers,
        "thread_pool": case.thread_pool,
    }
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


def _torch(case: Case, dataset: Any) -> Any:
    import torch
    from torch.utils.data import DataLoader

    if case.workload == "W4" or case.thread_pool:
        raise ValueError("torch runs only W1-W3 with process workers")
    return DataLoader(
        dataset,
        batch_size=case.batch_size,
        num_workers=case.num_workers,
        # Without CUDA torch ignores pin_memory with a warning; ask only where it works.
        pin_memory=case.pin_memory and torch.cuda.is_available(),
        # Gluon and shardloader keep their workers across epochs; let torch do the same.
        persistent_workers=case.num_workers > 0,
    )


_FACTORIES = {"gluon": _gluon, "ours": _ours, "torch": _torch}


def _gluon_split(pinned: bool) -> Callable[[Any], Any]:
    """Gluon has no sharded loader: its users split every batch with split_and_load."""
    from mxnet.gluon.utils import split_and_load

    ctxs = _shard_contexts(pinned)

    def adapt(batch: Any) -> Any:
        data, label = batch
        return list(zip(split_and_load(data, ctxs), split_and_load(label, ctxs)))

    return adapt


def _to_numpy(x: Any) -> np.ndarray:
    return x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x)


def _checker(case: Case) -> Callable[[Any], None]:
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
            if expected_ctx is not None and shard[0].context != expected_ctx[k]:
                raise RuntimeError(
                    f"{case.loader}: shard {k} is on {shard[0].context}, expected {expected_ctx[k]}"
                )

    return check


def _import_loader(loader: str) -> None:
    """Import the loader's modules now, so that importing them is not timed."""
    if loader == "torch":
        import torch.utils.data  # noqa: F401
    else:
        import mxnet.gluon.data  # noqa: F401
        import mxnet.gluon.utils  # noqa: F401

        if loader == "ours":
            import shardloader  # noqa: F401


def build(case: Case) -> Prepared:
    """Generate the dataset of ``case``, import its loader and return the loader factory."""
    _import_loader(case.loader)
    dataset = make_dataset(case)
    adapt = (
        _gluon_split(case.pin_memory) if case.workload == "W4" and case.loader == "gluon" else None
    )

    def factory() -> Any:
        return _FACTORIES[case.loader](case, dataset)

    return Prepared(factory, adapt, _checker(case), len(dataset))


def torch_available() -> bool:
    """Whether torch is installed (optional: never a dependency).

    Only looked up, not imported: importing torch here would change this process (its
    OpenMP runtime and CPU flags), and with it the W3 calibration. A torch that is installed
    but fails to import shows up as failed torch runs in the report.
    """
    import importlib.util

    return importlib.util.find_spec("torch") is not None
