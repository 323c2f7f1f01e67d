"""Micro-benchmarks that time one operation instead of a loader: NDArray stacking.

**Stacking** (``STACK`` in ``--workloads``): 64 NDArray samples of float32 3x224x224
(38.5 MB in all, more than the 32 MiB L3 cache), each its own MXNet array, stacked into
one batch by

- ``memcpy``: ``np.copyto`` of each sample's bytes (a numpy view of the NDArray's memory,
  taken once, up front) into a pre-faulted buffer: the floor for any stacking;
- ``ours``: shardloader's ``default_batchify_fn`` inside ``_alloc.allocating(alloc,
  numpy_out=True)``, whose allocator hands out views of the same pre-faulted buffer: what a worker
  process does with its reused shared-memory slot;
- ``gluon``: Gluon's ``default_batchify_fn`` (``nd.stack`` into MXNet's pooled memory), what
  Gluon runs inline and with thread workers;
- ``gluon_mp``: Gluon's ``default_mp_batchify_fn`` (``nd.stack`` into a new ``cpu_shared``
  array), what Gluon's worker processes run.

Under MXNet 2.x the samples are ``mx.np`` arrays and Gluon's two are its defaults there,
``batchify.Stack()`` and ``batchify.Stack(use_shared_mem=True)``.

The methods are interleaved, one call each per round, and every call is timed until its
result is readable; the report shows the median per call.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

__all__ = ["stacking"]


def _prefaulted(nbytes: int) -> np.ndarray:
    buf = np.empty(nbytes, dtype=np.uint8)
    buf.fill(0)  # every page is touched: no page fault is left for the timed calls
    return buf


def stacking(
    samples: int = 64, shape: Tuple[int, ...] = (3, 224, 224), rounds: int = 25, warmup: int = 3
) -> Dict[str, Any]:
    """Time the four ways of stacking ``samples`` float32 NDArrays of ``shape``.

    Returns
    -------
    dict
        ``bytes`` (of one batch), ``rounds`` and ``methods``: for each method its
        ``median_s``, ``min_s`` and every call's seconds (``times``).
    """
    import mxnet as mx

    from shardloader._engine.ipc import alloc as _alloc
    from shardloader._engine.ipc import lease
    from shardloader.batchify import default_batchify_fn

    from .workloads import mxnet_2

    if mxnet_2():  # the arrays 2.x's transforms make, and 2.x's DataLoader defaults
        from mxnet.gluon.data.batchify import Stack

        make, gluon_fn, gluon_mp_fn = mx.np.array, Stack(), Stack(use_shared_mem=True)
    else:
        from mxnet.gluon.data import dataloader as gluon_dataloader

        make = mx.nd.array
        gluon_fn = gluon_dataloader.default_batchify_fn
        gluon_mp_fn = gluon_dataloader.default_mp_batchify_fn
    rng = np.random.default_rng(0)
    arrays = [make(rng.standard_normal(shape, dtype=np.float32)) for _ in range(samples)]
    mx.nd.waitall()
    per_sample = int(np.prod(shape)) * 4
    nbytes = samples * per_sample
    slot = _prefaulted(nbytes)
    views = [lease.host_view(a) for a in arrays]  # the NDArrays' own memory, for memcpy
    dest = slot.view(np.float32).reshape((samples, *shape))

    def alloc(shape_: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        size = int(np.prod(shape_, dtype=np.int64)) * np.dtype(dtype).itemsize
        return slot[:size].view(dtype).reshape(shape_)

    def memcpy() -> None:
        for k, view in enumerate(views):
            np.copyto(dest[k], view)

    def ours() -> None:
        with _alloc.allocating(alloc, numpy_out=True):
            out = default_batchify_fn(arrays)
        if out.ctypes.data != slot.ctypes.data:
            raise RuntimeError("shardloader's batchify did not stack into the given buffer")

    def gluon() -> None:
        gluon_fn(arrays).wait_to_read()

    def gluon_mp() -> None:
        gluon_mp_fn(arrays).wait_to_read()

    methods: Dict[str, Callable[[], None]] = {
        "memcpy": memcpy,
        "ours": ours,
        "gluon": gluon,
        "gluon_mp": gluon_mp,
    }
    ours()
    if not np.array_equal(dest[samples - 1], arrays[-1].asnumpy()):
        raise RuntimeError("shardloader's batchify stacked the wrong bytes")
    times: Dict[str, List[float]] = {name: [] for name in methods}
    names = list(methods)
    for round_ in range(warmup + rounds):
        # Rotate the order, so that no method always follows the same one.
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            methods[name]()
            elapsed = time.perf_counter() - start
            if round_ >= warmup:
                times[name].append(elapsed)
    return {
        "bytes": nbytes,
        "samples": samples,
        "shape": list(shape),
        "rounds": rounds,
        "methods": {
            name: {
                "median_s": float(np.median(values)),
                "min_s": float(min(values)),
                "times": values,
            }
            for name, values in times.items()
        },
    }
