"""Randomness as a pure function of ``(seed, epoch, ...)``.

Every random choice shardloader makes (shuffles, bucket orders, per-sample seeds) comes from
here, so it never depends on scheduling, worker count or pool type.
"""

from __future__ import annotations

import random
import threading
from typing import Any, Optional, Tuple

import numpy as np

_MASK64 = (1 << 64) - 1
# Epoch number used to derive per-worker (not per-sample) seeds.
_WORKER_SEED_EPOCH = -1
# Keeps MXNet's per-batch seeds apart from the per-sample seeds of the same indices.
MXNET_SEED_DOMAIN = 0x5EED_4D58


def fresh_seed() -> int:
    """A base seed for ``seed=None``: drawn from numpy's global RNG, like Gluon's shuffles,
    so ``np.random.seed(...)`` before building a loader still makes it reproducible."""
    return int(np.random.randint(0, 2**31 - 1))


def epoch_rng(seed: int, epoch: int, *salt: int) -> np.random.Generator:
    """A local generator for ``(seed, epoch, *salt)``; never touches global state."""
    entropy = [int(seed) & _MASK64, int(epoch) & _MASK64] + [int(s) & _MASK64 for s in salt]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(seed: int, epoch: int, index: int) -> int:
    """A 31-bit seed for one sample (or worker): cheap, well mixed and stable."""
    h = _splitmix64(int(seed) & _MASK64)
    h = _splitmix64(h ^ (int(epoch) & _MASK64))
    h = _splitmix64(h ^ (int(index) & _MASK64))
    return h & 0x7FFFFFFF


def seed_python_and_numpy(value: int) -> None:
    """Seed Python's ``random`` and numpy's global RNG (a few microseconds)."""
    random.seed(value)
    np.random.seed(value)


_reseeds = threading.local()


def seed_mxnet(value: int) -> None:
    """Seed MXNet's RNG, with at most one reseed of this thread's still in the engine.

    ``mx.random.seed`` returns in microseconds, but the engine then spends about 2 ms
    reseeding its generators. Seeding faster than that (small batches) would queue reseeds
    without bound: memory grows batch after batch, and every random operator waits behind
    the queue. So each reseed is followed by a one-number draw that depends on it, and the
    next reseed first waits for that draw: the cost is paid here, not deferred.
    """
    import mxnet as mx

    from .._compat import current_device

    previous = getattr(_reseeds, "marker", None)
    if previous is not None:
        previous.wait_to_read()
    mx.random.seed(value)
    # The device named: left to MXNet 2.x, the draw asks for it through a deprecated call,
    # and its DeprecationWarning would stop every worker under -W error.
    _reseeds.marker = mx.nd.random.uniform(shape=(1,), ctx=current_device())


def seed_all(value: int) -> None:
    """Seed Python's ``random``, numpy's global RNG and MXNet's RNG with ``value``."""
    seed_python_and_numpy(value)
    seed_mxnet(value)


class GlobalRNGState:
    """Saves and restores the global RNG states, so inline seeding leaves the user's alone."""

    def __init__(self) -> None:
        # random's state, and numpy's legacy one (its type depends on numpy's version).
        self._saved: Optional[Tuple[Tuple[Any, ...], Any]] = None

    def __enter__(self) -> GlobalRNGState:
        self._saved = (random.getstate(), np.random.get_state())
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            py, state = self._saved
            random.setstate(py)
            np.random.set_state(state)


def seed_thread_worker(worker_id: int, seed: Optional[int], entropy: int) -> None:
    """Give a worker thread its own MXNet stream: MXNet 1.9.1's RNG is per thread, and every
    new thread starts from the same state. ``random`` and ``numpy.random`` belong to the
    whole process (the caller too) and are left alone."""
    base = seed if seed is not None else entropy
    seed_mxnet(derive_seed(base, _WORKER_SEED_EPOCH, worker_id))


def seed_worker(worker_id: int, seed: Optional[int], entropy: int) -> None:
    """Give each worker its own RNG streams, so forked workers never repeat each other."""
    base = seed if seed is not None else entropy
    seed_all(derive_seed(base, _WORKER_SEED_EPOCH, worker_id))
