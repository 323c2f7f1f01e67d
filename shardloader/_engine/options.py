"""Loader options, validated once, up front.

Every check raises ``ValueError`` or ``TypeError`` naming the argument, what is accepted and
what was received. Gluon's own conflicting-argument errors are kept word for word in
meaning, so code that catches them keeps working.
"""

from __future__ import annotations

import multiprocessing as mp
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .._validate import check_choice, check_int

LAST_BATCH_CHOICES = ("keep", "discard", "rollover")
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
    batch_size,
    shuffle,
    sampler,
    last_batch,
    batch_sampler,
    batchify_fn,
    num_workers,
    pin_memory,
    pin_device_id,
    prefetch,
    thread_pool,
    timeout,
    auto_reload,
    try_nopython,
    seed,
    mxnet_seed,
    num_shards,
    num_parts,
    part_index,
    even_size,
    worker_init_fn,
    start_method,
    ctx,
    on_worker_death,
    device=None,
) -> LoaderOptions:
    """Check every argument of ``shardloader.ShardedDataLoader``."""
    from .._compat import MX2
    from .device import device_argument

    ctx, ctx_name = device_argument(ctx, device)
    if batch_sampler is None:
        if batch_size is None:
            raise ValueError("batch_size must be specified unless batch_sampler is specified")
        batch_size = check_int("batch_size", batch_size, 1)
        if sampler is not None and shuffle:
            raise ValueError("shuffle must not be specified if sampler is specified")
        if last_batch is not None:
            check_choice("last_batch", last_batch, LAST_BATCH_CHOICES)
    elif batch_size is not None or shuffle or sampler is not None or last_batch is not None:
        raise ValueError(
            "batch_size, shuffle, sampler and last_batch must not be specified "
            "if batch_sampler is specified."
        )
    if batchify_fn is not None and not callable(batchify_fn):
        raise TypeError(f"batchify_fn must be callable, got {type(batchify_fn).__name__}")
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise TypeError(f"worker_init_fn must be callable, got {type(worker_init_fn).__name__}")
    num_workers = check_int("num_workers", num_workers, 0)
    pin_device_id = check_int("pin_device_id", pin_device_id, 0)
    if prefetch is None:
        prefetch = 2 * num_workers
    prefetch = check_int("prefetch", prefetch, 0)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError(
                f"timeout must be a positive number of seconds or None, got {timeout!r}"
            )
        if timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout}")
        timeout = float(timeout)
    if try_nopython is not None and not isinstance(try_nopython, (bool, np.bool_)):
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
    if seed is not None:
        seed = check_int("seed", seed, 0)
    check_choice("mxnet_seed", mxnet_seed, MXNET_SEED_CHOICES)
    num_shards = check_int("num_shards", num_shards, 0)
    num_parts = check_int("num_parts", num_parts, 1)
    part_index = check_int("part_index", part_index, 0)
    if part_index >= num_parts:
        raise ValueError(f"part_index must be in [0, num_parts={num_parts}), got {part_index}")
    methods = mp.get_all_start_methods()
    if start_method is None:
        start_method = "fork" if "fork" in methods else mp.get_start_method()
    check_choice("start_method", start_method, methods)
    check_choice("on_worker_death", on_worker_death, ON_WORKER_DEATH_CHOICES)
    if ctx is not None and pin_memory:
        raise ValueError(
            f"pin_memory and {ctx_name} must not both be given: {ctx_name} already places "
            f"each batch (use mx.cpu_pinned(i) in {ctx_name} to pin)"
        )
    return LoaderOptions(
        batch_size=batch_size,
        shuffle=bool(shuffle),
        last_batch=last_batch,
        num_workers=num_workers,
        pin_memory=bool(pin_memory),
        pin_device_id=pin_device_id,
        prefetch=prefetch,
        thread_pool=bool(thread_pool),
        timeout=timeout,
        auto_reload=bool(auto_reload),
        seed=seed,
        mxnet_seed=mxnet_seed,
        num_shards=num_shards,
        num_parts=num_parts,
        part_index=part_index,
        even_size=bool(even_size),
        worker_init_fn=worker_init_fn,
        start_method=start_method,
        ctx=ctx,
        on_worker_death=on_worker_death,
        ctx_name=ctx_name,
        try_nopython=None if try_nopython is None else bool(try_nopython),
    )
