"""Loader options, validated once, up front.

Every check raises ``ValueError`` or ``TypeError`` naming the argument, what is accepted and
what was received. Gluon's own conflicting-argument errors are kept word for word in
meaning, so code that catches them keeps working.
"""

from __future__ import annotations

import multiprocessing as mp
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import numpy as np

from .._compat import MX2
from .._validate import LAST_BATCH_CHOICES, check_bool, check_choice, check_int
from .device import device_argument, placement

ON_WORKER_DEATH_CHOICES = ("raise", "restart")
MXNET_SEED_CHOICES = ("batch", "sample")


@dataclass(frozen=True)
class LoaderOptions:
    batch_size: Optional[int]
    shuffle: bool
    last_batch: Optional[str]
    num_workers: int
    pin_memory: bool
    pin_device_id: int
    prefetch: int
    thread_pool: bool
    timeout: Optional[float]
    auto_reload: bool
    seed: Optional[int]
    mxnet_seed: str
    num_shards: int
    num_parts: int
    part_index: int
    even_size: bool
    worker_init_fn: Optional[Callable]
    start_method: str
    ctx: Any
    on_worker_death: str
    # The name the placement argument was given under ("ctx" or MXNet 2.x's "device"), for
    # messages; and try_nopython, which only MXNet 2.x accepts as True.
    ctx_name: str = "ctx"
    try_nopython: Optional[bool] = None
    # Run Gluon image chains on the fused path (shardloader.vision, docs/vision.md).
    fuse_transforms: bool = True


def check_dataset(dataset: Any) -> int:
    """The dataset's length; a clear error if it is not a sized, indexable collection.

    An empty dataset is accepted, as Gluon accepts it: the loader then has no batches.
    """
    missing = [m for m in ("__len__", "__getitem__") if not hasattr(dataset, m)]
    if missing:
        raise TypeError(
            f"dataset must support len() and indexing (__len__ and __getitem__); "
            f"{type(dataset).__name__} lacks {' and '.join(missing)}"
        )
    return len(dataset)


def validate(
    *,
    batch_size: Any,
    shuffle: Any,
    sampler: Any,
    last_batch: Any,
    batch_sampler: Any,
    batchify_fn: Any,
    num_workers: Any,
    pin_memory: Any,
    pin_device_id: Any,
    prefetch: Any,
    thread_pool: Any,
    timeout: Any,
    auto_reload: Any,
    try_nopython: Any,
    seed: Any,
    mxnet_seed: Any,
    num_shards: Any,
    num_parts: Any,
    part_index: Any,
    even_size: Any,
    worker_init_fn: Any,
    start_method: Any,
    ctx: Any,
    on_worker_death: Any,
    device: Any,
    fuse_transforms: Any = True,
) -> LoaderOptions:
    """Check every argument of ``shardloader.ShardedDataLoader`` but the dataset; the
    options, in canonical types. ``sampler``, ``batch_sampler`` and ``batchify_fn`` are
    only checked: the loader builds its batch sampler and batchify from them itself."""
    v: Dict[str, Any] = dict(
        batch_size=batch_size,
        shuffle=check_bool("shuffle", shuffle),
        sampler=sampler,
        last_batch=last_batch,
        batch_sampler=batch_sampler,
        batchify_fn=batchify_fn,
        pin_memory=check_bool("pin_memory", pin_memory),
        thread_pool=check_bool("thread_pool", thread_pool),
        auto_reload=check_bool("auto_reload", auto_reload),
        even_size=check_bool("even_size", even_size),
        fuse_transforms=check_bool("fuse_transforms", fuse_transforms),
        seed=seed,
        mxnet_seed=mxnet_seed,
        num_shards=num_shards,
        num_parts=num_parts,
        part_index=part_index,
        worker_init_fn=worker_init_fn,
        start_method=start_method,
        on_worker_death=on_worker_death,
    )
    v["ctx"], v["ctx_name"] = device_argument(ctx, device)
    if v["ctx"] is not None:
        placement(v["ctx"], v["ctx_name"])  # the type of each context, checked now
    _check_batching(v)
    for name in ("batchify_fn", "worker_init_fn"):
        if v[name] is not None and not callable(v[name]):
            raise TypeError(f"{name} must be callable, got {type(v[name]).__name__}")
    v["num_workers"] = check_int("num_workers", num_workers)
    v["pin_device_id"] = check_int("pin_device_id", pin_device_id)
    v["prefetch"] = check_int("prefetch", 2 * v["num_workers"] if prefetch is None else prefetch)
    v["timeout"] = check_timeout(timeout)
    v["try_nopython"] = _check_try_nopython(try_nopython)
    if v["seed"] is not None:
        v["seed"] = check_int("seed", v["seed"])
    check_choice("mxnet_seed", v["mxnet_seed"], MXNET_SEED_CHOICES)
    _check_sharding(v)
    methods = mp.get_all_start_methods()
    if v["start_method"] is None:
        v["start_method"] = "fork" if "fork" in methods else mp.get_start_method()
    check_choice("start_method", v["start_method"], methods)
    check_choice("on_worker_death", v["on_worker_death"], ON_WORKER_DEATH_CHOICES)
    if v["ctx"] is not None and v["pin_memory"]:
        name = v["ctx_name"]
        raise ValueError(
            f"pin_memory and {name} must not both be given: {name} already places "
            f"each batch (use mx.cpu_pinned(i) in {name} to pin)"
        )
    for name in ("sampler", "batch_sampler", "batchify_fn"):
        del v[name]  # the loader builds its batch sampler and batchify from these itself
    return LoaderOptions(**v)


def _check_batching(v: Dict[str, Any]) -> None:
    """Gluon's rules for batch_size, shuffle, sampler, last_batch and batch_sampler."""
    if v["batch_sampler"] is None:
        if v["batch_size"] is None:
            raise ValueError("batch_size must be specified unless batch_sampler is specified")
        v["batch_size"] = check_int("batch_size", v["batch_size"], 1)
        if v["sampler"] is not None and v["shuffle"]:
            raise ValueError("shuffle must not be specified if sampler is specified")
        if v["last_batch"] is not None:
            check_choice("last_batch", v["last_batch"], LAST_BATCH_CHOICES)
    elif v["shuffle"] or any(v[k] is not None for k in ("batch_size", "sampler", "last_batch")):
        raise ValueError(
            "batch_size, shuffle, sampler and last_batch must not be specified "
            "if batch_sampler is specified."
        )


def _check_sharding(v: Dict[str, Any]) -> None:
    v["num_shards"] = check_int("num_shards", v["num_shards"])
    v["num_parts"] = check_int("num_parts", v["num_parts"], 1)
    v["part_index"] = check_int("part_index", v["part_index"])
    if v["part_index"] >= v["num_parts"]:
        raise ValueError(
            f"part_index must be in [0, num_parts={v['num_parts']}), got {v['part_index']}"
        )
    if v["num_parts"] > 1 and v["shuffle"] and v["seed"] is None:
        raise ValueError(
            "num_parts > 1 with shuffle=True needs seed=<int>, so that every machine "
            "draws the same permutation and the parts stay disjoint"
        )


def check_timeout(timeout: Any) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout}")
    return float(timeout)


def _check_try_nopython(try_nopython: Any) -> Optional[bool]:
    if try_nopython is None:
        return None
    if not isinstance(try_nopython, (bool, np.bool_)):
        raise TypeError(
            f"try_nopython must be None, True or False, got {try_nopython!r} "
            f"(type {type(try_nopython).__name__})"
        )
    if try_nopython and not MX2:
        import mxnet as mx

        raise ValueError(
            "try_nopython=True asks for MXNet 2.x's C++ data pipeline, which MXNet "
            f"{mx.__version__} does not have; use try_nopython=None or False (shardloader's "
            "worker processes already avoid Python overhead on the transfer path)"
        )
    return bool(try_nopython)
