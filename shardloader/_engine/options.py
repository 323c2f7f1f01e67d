"""Loader options: each one spelled once, with its default and its check, and checked
wherever an options object is made.

``LoaderOptions`` has a field for every argument of ``shardloader.ShardedDataLoader`` but the
dataset (``device``, MXNet 2.x's name for ``ctx``, is taken when it is made). Each field
checks its own value; ``__post_init__`` then checks the options against each other, so
``dataclasses.replace`` (an assignment to one of Gluon's attributes) is checked as fully as
the loader's arguments. Every check raises ``ValueError`` or ``TypeError`` naming the
argument, what is accepted and what was received. Gluon's own conflicting-argument errors
are kept word for word in meaning, so code that catches them keeps working.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import numbers
from dataclasses import InitVar, dataclass
from typing import Any, Callable, Mapping, Optional

import numpy as np

from .._compat import MX2
from .._validate import (
    LAST_BATCH_CHOICES,
    arguments_for,
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_options,
    option,
    optional,
)
from .device import device_argument, placement

ON_WORKER_DEATH_CHOICES = ("raise", "restart")
MXNET_SEED_CHOICES = ("batch", "sample")


def _choice(*choices: str) -> Callable[[str, Any], str]:
    return lambda name, value: check_choice(name, value, choices)


def _start_method(name: str, value: Any) -> str:
    """The start method given, or by default ``'fork'`` where there is one."""
    methods = mp.get_all_start_methods()
    if value is None:
        value = "fork" if "fork" in methods else mp.get_start_method()
    return check_choice(name, value, methods)


def _check_timeout(name: str, timeout: Any) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"{name} must be a positive number of seconds or None, got {timeout!r}")
    if timeout <= 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {timeout}")
    return float(timeout)


def _check_try_nopython(name: str, try_nopython: Any) -> Optional[bool]:
    if try_nopython is None:
        return None
    if not isinstance(try_nopython, (bool, np.bool_)):
        raise TypeError(
            f"{name} must be None, True or False, got {try_nopython!r} "
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


@dataclass(frozen=True)
class LoaderOptions:
    """The loader's options, in canonical types; the defaults are the loader's (a test holds
    ``ShardedDataLoader``'s signature to them)."""

    # Checked together with batch_sampler (Gluon's rules), in __post_init__.
    batch_size: Optional[int] = option(None)
    shuffle: bool = option(False, check_bool)
    sampler: Any = option(None, repr=False)
    last_batch: Optional[str] = option(None)
    batch_sampler: Any = option(None, repr=False)
    # As given; the loader runs its default (or Gluon's equivalent) in its place.
    batchify_fn: Optional[Callable] = option(None, optional(check_callable), repr=False)
    num_workers: int = option(0, check_int)
    pin_memory: bool = option(False, check_bool)
    pin_device_id: int = option(0, check_int)
    prefetch: int = option(None)  # by default 2 * num_workers, in __post_init__
    thread_pool: bool = option(False, check_bool)
    timeout: Optional[float] = option(120, _check_timeout)
    auto_reload: bool = option(False, check_bool)
    # Only MXNet 2.x accepts True.
    try_nopython: Optional[bool] = option(None, _check_try_nopython)
    seed: Optional[int] = option(None, optional(check_int))
    mxnet_seed: str = option("batch", _choice(*MXNET_SEED_CHOICES))
    num_shards: int = option(0, check_int)
    num_parts: int = option(1, functools.partial(check_int, minimum=1))
    part_index: int = option(0, check_int)
    even_size: bool = option(False, check_bool)
    worker_init_fn: Optional[Callable] = option(None, optional(check_callable))
    start_method: str = option(None, _start_method)
    # Where batches go, given as ctx or as device (MXNet 2.x's name for it).
    ctx: Any = option(None)
    device: InitVar[Any] = None
    on_worker_death: str = option("raise", _choice(*ON_WORKER_DEATH_CHOICES))
    # Run Gluon image chains on the fused path (shardloader.vision, docs/vision.md).
    fuse_transforms: bool = option(True, check_bool)
    # The name the placement was given under ("ctx" or "device"), for messages: worked out
    # when the options are made from the loader's arguments, and kept by a copy.
    ctx_name: str = option("")

    def __post_init__(self, device: Any) -> None:
        check_options(self)
        ctx, name = device_argument(self.ctx, device)
        if device is None and self.ctx_name:
            name = self.ctx_name  # a copy (replace) keeps the name the original was given
        if ctx is not None:
            placement(ctx, name)  # the type of each context, checked now
        self._set(ctx=ctx, ctx_name=name)
        self._check_batching()
        if self.prefetch is None:
            self._set(prefetch=2 * self.num_workers)
        self._set(prefetch=check_int("prefetch", self.prefetch))
        self._check_sharding()
        if self.ctx is not None and self.pin_memory:
            raise ValueError(
                f"pin_memory and {name} must not both be given: {name} already places "
                f"each batch (use mx.cpu_pinned(i) in {name} to pin)"
            )

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> LoaderOptions:
        """The options from the loader's arguments (its ``locals()``); the others (the
        dataset) are left out."""
        return cls(**arguments_for(cls, arguments))

    def _set(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _check_batching(self) -> None:
        """Gluon's rules for batch_size, shuffle, sampler, last_batch and batch_sampler."""
        if self.batch_sampler is None:
            if self.batch_size is None:
                raise ValueError("batch_size must be specified unless batch_sampler is specified")
            self._set(batch_size=check_int("batch_size", self.batch_size, 1))
            if self.sampler is not None and self.shuffle:
                raise ValueError("shuffle must not be specified if sampler is specified")
            if self.last_batch is not None:
                check_choice("last_batch", self.last_batch, LAST_BATCH_CHOICES)
        elif self.shuffle or any(
            value is not None for value in (self.batch_size, self.sampler, self.last_batch)
        ):
            raise ValueError(
                "batch_size, shuffle, sampler and last_batch must not be specified "
                "if batch_sampler is specified."
            )

    def _check_sharding(self) -> None:
        if self.part_index >= self.num_parts:
            raise ValueError(
                f"part_index must be in [0, num_parts={self.num_parts}), got {self.part_index}"
            )
        if self.num_parts > 1 and self.shuffle and self.seed is None:
            raise ValueError(
                "num_parts > 1 with shuffle=True needs seed=<int>, so that every machine "
                "draws the same permutation and the parts stay disjoint"
            )


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
