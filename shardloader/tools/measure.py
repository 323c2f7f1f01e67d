"""The measuring kernels of ``shardloader bench`` and of the repository's benchmarks.

- :class:`PeakMemory`: the peak memory of this process and its workers during a ``with``
  block.
- :func:`touch`: wait until every array of a batch is readable, and count its bytes.
- :func:`count_samples`: the samples in a batch; :func:`count_step_samples`: in a training
  step, which may be a list of per-device batches.

psutil is imported when a :class:`PeakMemory` is made, never by this module, so importing
it adds nothing heavy to the ``shardloader`` package (which imports MXNet; see
``benchmarks/harness.py`` for a process that must not).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Optional

import numpy as np

from .._engine.nest import leaves

__all__ = ["PeakMemory", "touch", "count_samples", "count_step_samples"]

_MB = 1024.0 * 1024.0
# The benchmarks' defaults (benchmarks/harness.py); ``shardloader bench`` samples less often.
_INTERVAL_S = 0.005
_PSS_EVERY = 20  # samples between PSS readings (100 ms): smaps_rollup costs ~0.4 ms/process
_CHILDREN_REFRESH_S = 0.05  # listing descendants walks /proc (~0.5 ms)


class PeakMemory:
    """Peak memory of this process and all its descendants during a ``with`` block.

    With psutil, a background thread sums the RSS of this process and its descendants every
    ``interval_s`` seconds, from the start of the block to its end (pages shared between
    processes count once per process that maps them). The descendants are listed again at
    most every ``children_refresh_s``; 0 lists them at every sample. With ``pss_every``, the
    first and last samples and every ``pss_every``-th one also sum the PSS, which counts every
    shared page once in all.

    Without psutil, making one raises ``ImportError``, unless ``rusage_fallback``: then the
    block's end reads ``resource.getrusage``, the largest RSS this process ever had plus the
    largest of its finished children, since start-up (so it never goes down between blocks).

    One instance may measure several blocks, one after the other; each starts from zero.

    Attributes
    ----------
    peak_rss_mb, peak_pss_mb : float
        The peaks of the last block (``peak_pss_mb`` stays 0 without ``pss_every``).
    base_rss_mb : float
        The RSS at the block's start (0 without psutil).
    peak_processes, samples : int
        The most processes seen at once, and the number of samples taken.
    method : str
        How the peak RSS is measured, in words.

    >>> with PeakMemory() as mem:
    ...     block = bytearray(64 << 20)
    >>> mem.peak_rss_mb >= mem.base_rss_mb
    True
    """

    def __init__(
        self,
        interval_s: float = _INTERVAL_S,
        *,
        pss_every: Optional[int] = _PSS_EVERY,
        children_refresh_s: float = _CHILDREN_REFRESH_S,
        rusage_fallback: bool = False,
    ) -> None:
        try:
            import psutil
        except ImportError:
            if not rusage_fallback:
                raise
            psutil = None
        self._psutil = psutil
        self._interval_s = interval_s
        self._pss_every = pss_every
        self._refresh_s = children_refresh_s
        self._me = psutil.Process() if psutil is not None else None
        self._procs: Dict[int, Any] = {}
        self._refreshed: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if psutil is not None:
            every = f"{interval_s * 1e3:g} ms"
            self.method = f"psutil: this process + its workers, sampled every {every}"
        else:
            self.method = (
                "resource.getrusage (psutil is not installed): lifetime peak of this process "
                "+ largest finished child"
            )
        self._reset()

    def _reset(self) -> None:
        self.base_rss_mb = self.peak_rss_mb = self.peak_pss_mb = 0.0
        self.peak_processes = 1
        self.samples = 0
        self._procs, self._refreshed = {}, None

    def __enter__(self) -> PeakMemory:
        self._reset()
        if self._psutil is not None:
            self.base_rss_mb = self._sample(with_pss=self._pss_every is not None)
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._thread is None:
            self.peak_rss_mb = _rusage_peak_mb()
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample(with_pss=self._pss_every is not None)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            due = self._pss_every is not None and self.samples % self._pss_every == 0
            self._sample(with_pss=due)

    def _list_processes(self) -> None:
        now = time.monotonic()
        if self._refreshed is not None and now - self._refreshed < self._refresh_s:
            return
        self._refreshed = now
        me = self._me
        assert me is not None, "sampled only with psutil"
        try:
            kids = me.children(recursive=True)
        except self._psutil.Error:
            kids = []
        alive = {me.pid: me}
        for kid in kids:  # keep the Process objects: they cache their /proc handles
            alive[kid.pid] = self._procs.get(kid.pid, kid)
        self._procs = alive

    def _sample(self, with_pss: bool) -> float:
        """Take one sample; return its RSS in MB."""
        self._list_processes()
        rss = pss = 0
        for proc in list(self._procs.values()):
            try:
                rss += proc.memory_info().rss
                if with_pss:
                    pss += proc.memory_full_info().pss
            except self._psutil.Error:  # exited between listing and reading
                continue
        self.samples += 1
        self.peak_rss_mb = max(self.peak_rss_mb, rss / _MB)
        if with_pss:
            self.peak_pss_mb = max(self.peak_pss_mb, pss / _MB)
        self.peak_processes = max(self.peak_processes, len(self._procs))
        return rss / _MB


def _rusage_peak_mb() -> float:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + kids) / 1024.0  # kilobytes on Linux


def touch(batch: Any) -> int:
    """Wait until every NDArray in ``batch`` is readable; return the bytes the batch holds.

    Walks ``batch`` with the loader's own walker (:func:`shardloader._engine.nest.leaves`).
    A leaf counts ``size * itemsize`` if it is an NDArray (which has no ``nbytes``), its
    length if it is ``bytes``, its ``nbytes`` otherwise (numpy arrays, torch tensors), and 0
    if it has none (numbers, strings).
    """
    return sum(_touch_leaf(leaf) for leaf in leaves(batch))


def _touch_leaf(leaf: Any) -> int:
    wait = getattr(leaf, "wait_to_read", None)
    if wait is not None:
        wait()
        return int(leaf.size) * np.dtype(leaf.dtype).itemsize
    if isinstance(leaf, (bytes, bytearray)):
        return len(leaf)
    return int(getattr(leaf, "nbytes", 0))


def count_samples(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first array (depth first), or, for a
    batch of plain lists, the length of the first; 1 for a single value."""
    # Each array's shape is read once: an NDArray's is a call into MXNet, and this runs in
    # the timed loop.
    node, shape = batch, getattr(batch, "shape", None)
    while True:
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(node, dict) and node:
            node = next(iter(node.values()))
            shape = getattr(node, "shape", None)
        elif isinstance(node, (list, tuple)) and node:
            first = node[0]
            shape = getattr(first, "shape", None)
            if shape is None and not isinstance(first, (list, tuple, dict)):
                return len(node)  # a list of plain values
            node = first
        else:
            return len(node) if isinstance(node, (list, tuple)) else 1


def count_step_samples(step: Any) -> int:
    """Samples in a training step: a batch ``(data, label, ...)``, or a sharded step, a list
    of such batches (one per device), whose samples add up."""
    if isinstance(step[0], (list, tuple)):
        return sum(count_samples(shard) for shard in step)
    return count_samples(step)
