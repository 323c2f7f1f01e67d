"""Randomness as a pure function of ``(seed, epoch, ...)``.

Every random choice shardloader makes (shuffles, bucket orders, per-sample seeds) comes from
here, so it never depends on scheduling, worker count or pool type.
"""

from __future__ import annotations

import _random
import array
import ctypes
import random
import sys
import threading
from typing import Any, Callable, Optional, Tuple, Union

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
    return sample_seed(sample_seed_prefix(seed, epoch), index)


def sample_seed_prefix(seed: int, epoch: int) -> int:
    """What :func:`derive_seed` mixes from ``(seed, epoch)``, once for a whole batch:
    ``sample_seed(sample_seed_prefix(s, e), i) == derive_seed(s, e, i)``."""
    return _splitmix64(_splitmix64(int(seed) & _MASK64) ^ (int(epoch) & _MASK64))


def sample_seed(prefix: int, index: int) -> int:
    """``derive_seed`` for one sample, from its batch's :func:`sample_seed_prefix`."""
    return _splitmix64(prefix ^ (int(index) & _MASK64)) & 0x7FFFFFFF


# The generators behind the module-level functions of random and numpy.random.
_PY_RANDOM: random.Random = random.seed.__self__  # type: ignore[attr-defined]
_NP_RANDOM: np.random.RandomState = np.random.seed.__self__  # type: ignore[attr-defined]
_seed_mersenne = _random.Random.seed


def seed_python_and_numpy(value: int) -> None:
    """Seed Python's ``random`` and numpy's global RNG (a few microseconds): what
    ``random.seed(value)`` and ``np.random.seed(value)`` do, without the checks that
    ``random.seed`` makes in Python for an argument that may not be an int."""
    _seed_mersenne(_PY_RANDOM, value)
    _PY_RANDOM.gauss_next = None  # type: ignore[attr-defined]
    _NP_RANDOM.seed(value)


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


# ---------------------------------------------------------------- MXNet, seeded on demand
# A reseed costs about a millisecond of engine work, and most datasets never draw from
# MXNet's RNG. So a batch only says which seed MXNet would get (``defer_mxnet_seed``), and
# the reseed happens in this thread just before its next call into libmxnet that runs
# operators or seeds: every draw (an operator, a hybridized block, an mx.np function, an
# executor) goes through one of these, and MXNet's RNG is per thread (1.x and 2.x alike).
# The draws are those of a reseed at the start of the batch, bit for bit: until that call,
# nothing has touched this thread's RNG. Without the ctypes front end (MXNet built with
# Cython calls libmxnet directly), every deferred seed is applied at once.
_RNG_CALLS = (
    "MXImperativeInvoke",
    "MXImperativeInvokeEx",
    "MXInvokeCachedOp",
    "MXInvokeCachedOpEx",
    "MXNetFuncCall",
    "MXExecutorForward",
    "MXExecutorBackward",
    "MXExecutorBackwardEx",
    "MXAutogradBackward",
    "MXAutogradBackwardEx",
    "MXRandomSeed",
    "MXRandomSeedContext",
)
_deferred = threading.local()
_guard_lock = threading.Lock()
_guarded: Optional[bool] = None  # None: not yet decided (MXNet is imported lazily)


def defer_mxnet_seed(seed: Union[int, Callable[[], int]]) -> None:
    """Seed MXNet's RNG (:func:`seed_mxnet`) in this thread before anything in it draws from
    MXNet, or not at all if nothing does. ``seed``: the value, or a function that computes
    it (called only if the reseed happens). Replaces a seed deferred before."""
    if _guarded is None:
        _guard_mxnet()
    if _guarded:
        _deferred.seed = seed
    else:
        seed_mxnet(seed() if callable(seed) else seed)


def drop_deferred_mxnet_seed() -> None:
    """Forget this thread's deferred seed: the batch it was for is made."""
    _deferred.seed = None


def _apply_deferred() -> None:
    seed = getattr(_deferred, "seed", None)
    if seed is not None:
        _deferred.seed = None  # first: seed_mxnet's own calls pass through
        seed_mxnet(seed() if callable(seed) else seed)


def _guard_mxnet() -> None:
    """Route the libmxnet calls that can draw or seed through ``_apply_deferred``, once per
    process (a forked worker inherits it)."""
    global _guarded
    with _guard_lock:
        if _guarded is not None:
            return
        try:
            from mxnet import base
            from mxnet._ffi import function
            from mxnet.ndarray import _internal

            lib = base._LIB
            front_ends = (_internal._imperative_invoke, function._FunctionBase)
        except (ImportError, AttributeError):  # another MXNet layout: seed every batch
            _guarded = False
            return
        ctypes_front_ends = ("mxnet._ctypes", "mxnet._ffi._ctypes")
        if not all(f.__module__.startswith(ctypes_front_ends) for f in front_ends):
            _guarded = False
            return
        for name in _RNG_CALLS:
            try:
                call = getattr(lib, name)
            except AttributeError:
                continue  # not in this MXNet version
            setattr(lib, name, _seeding_first(call))
        _guarded = True


def _seeding_first(call: Callable) -> Callable:
    def guarded(*args):
        if getattr(_deferred, "seed", None) is not None:
            _apply_deferred()
        return call(*args)

    guarded.__wrapped__ = call  # type: ignore[attr-defined]
    return guarded


class GlobalRNGState:
    """Saves and restores the global RNG states, so inline seeding leaves the user's alone."""

    def __init__(self) -> None:
        self._saved: Optional[Tuple[Tuple[Any, ...], Any]] = None

    def __enter__(self) -> GlobalRNGState:
        self._saved = (_PY_RANDOM.getstate(), _numpy_state.save())
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            py, state = self._saved
            _PY_RANDOM.setstate(py)
            _numpy_state.restore(state)


def global_rng_marks() -> Tuple[Any, Any]:
    """What tells whether anything drew from ``random`` or ``numpy.random`` since: compare
    two marks. numpy's omits a cached Gaussian value, so take it where there is none (just
    after seeding, or in :class:`UnseededWatch`)."""
    return _python_state.mark(), _numpy_state.mark()


class UnseededWatch:
    """Around samples loaded without seeding ``random`` and ``numpy.random``: afterwards,
    ``touched`` tells whether anything drew from them (or seeded them). Untouched, their
    states are as they were; touched, they are given back as they were before.

    A sample that draws nothing gives the same result whatever the states are, so an
    untouched batch is the batch that seeding every sample would have made.
    """

    touched = False

    def __enter__(self) -> UnseededWatch:
        self._py = _python_state.mark()
        self._np = _numpy_state.save()
        # Without a cached Gaussian value: taking one changes nothing else in the state.
        _numpy_state.drop_cached(self._np)
        self._np_mark = _numpy_state.mark()
        return self

    def __exit__(self, *exc) -> None:
        self.touched = _python_state.mark() != self._py or _numpy_state.mark() != self._np_mark
        if self.touched:
            _python_state.restore(self._py)
        if self.touched or _numpy_state.had_cached(self._np):
            _numpy_state.restore(self._np)


_RANDOM_BYTES = 4 + 624 * 4  # CPython's RandomObject after its header: int index; uint32 state[624]


class _PythonState:
    """Marks of ``random``'s generator, to tell whether anything drew from it: its
    Mersenne Twister state read as bytes from the object (about a microsecond, where
    ``random.getstate()`` builds a tuple of 625 ints in 10 µs and comparing two takes as
    long), and ``gauss_next``. The layout is CPython's, checked against ``getstate()`` once;
    elsewhere the marks are ``getstate()`` itself.
    """

    def __init__(self) -> None:
        self._address: Optional[int] = None
        try:
            address = id(_PY_RANDOM) + object.__basicsize__
            words = _PY_RANDOM.getstate()[1]
            expected = words[-1].to_bytes(4, sys.byteorder, signed=True)
            expected += array.array("I", words[:-1]).tobytes()
            cpython = sys.implementation.name == "cpython" and array.array("I").itemsize == 4
            if cpython and ctypes.string_at(address, _RANDOM_BYTES) == expected:
                self._address = address
        except (AttributeError, IndexError, OverflowError, TypeError, ValueError):
            pass

    def mark(self) -> Any:
        if self._address is None:
            return _PY_RANDOM.getstate()
        return ctypes.string_at(self._address, _RANDOM_BYTES), _PY_RANDOM.gauss_next  # type: ignore[attr-defined]

    def restore(self, mark: Any) -> None:
        """Gives ``random`` the state it had at ``mark``."""
        if self._address is None:
            _PY_RANDOM.setstate(mark)
            return
        state, gauss_next = mark
        words = array.array("I")
        words.frombytes(state[4:])
        index = int.from_bytes(state[:4], sys.byteorder, signed=True)
        _PY_RANDOM.setstate((_PY_RANDOM.VERSION, tuple(words) + (index,), gauss_next))


_python_state = _PythonState()


_MT19937_BYTES = 624 * 4 + 4  # numpy's mt19937_state: uint32_t key[624]; int pos


class _NumpyState:
    """Saves and restores numpy's global RandomState in a few microseconds.

    ``np.random.get_state`` and ``set_state`` copy the 624 words of its MT19937 state one
    by one, about 40 µs each way. Here the state is copied as bytes, through the bit
    generator's ctypes interface; the layout is checked against ``get_state`` once, and any
    other generator or layout takes the slow path. The Gaussian value a RandomState caches
    (``randn`` draws them in pairs) is outside that state: a probe tells whether there is
    one, and only then is the slow path taken to restore it.
    """

    def __init__(self) -> None:
        self._address: Optional[int] = None
        try:
            generator = _NP_RANDOM._bit_generator
            address = generator.ctypes.state_address
            key, pos = generator.state["state"]["key"], generator.state["state"]["pos"]
            expected = np.asarray(key, np.uint32).tobytes() + int(pos).to_bytes(4, sys.byteorder)
            if (
                type(generator).__name__ == "MT19937"
                and ctypes.string_at(address, _MT19937_BYTES) == expected
            ):
                self._address = address
        except (AttributeError, KeyError, TypeError, ValueError):
            pass

    def save(self) -> Any:
        """The state: ``(MT19937 bytes, the cached Gaussian value or None)``, or on the
        slow path ``np.random.get_state()``."""
        address = self._address
        if address is None:
            return np.random.get_state()
        state = ctypes.string_at(address, _MT19937_BYTES)
        # Takes the cached value if there is one (then the state is untouched), else draws.
        value = _NP_RANDOM.standard_normal()
        cached = ctypes.string_at(address, _MT19937_BYTES) == state
        return state, value if cached else None

    def restore(self, saved: Any) -> None:
        address = self._address
        if address is None:
            np.random.set_state(saved)
            return
        state, gauss = saved
        if gauss is None:
            _NP_RANDOM.seed(0)  # clears the cached value, if any
            ctypes.memmove(address, state, _MT19937_BYTES)
        else:
            key = np.frombuffer(state, np.uint32, 624)
            pos = int.from_bytes(state[-4:], sys.byteorder, signed=True)
            np.random.set_state(("MT19937", key, pos, 1, gauss))

    def drop_cached(self, saved: Any) -> None:
        """The state of ``saved``, without a cached Gaussian value."""
        if self._address is None:
            np.random.set_state(saved[:3] + (0, 0.0))
        else:
            self.restore((saved[0], None))

    def had_cached(self, saved: Any) -> bool:
        return bool(saved[3]) if self._address is None else saved[1] is not None

    def mark(self) -> Any:
        """The MT19937 state (not the cached Gaussian value), comparable with ``==``."""
        if self._address is None:
            state: Any = np.random.get_state()
            return state[1].tobytes(), state[2]
        return ctypes.string_at(self._address, _MT19937_BYTES)


_numpy_state = _NumpyState()


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
