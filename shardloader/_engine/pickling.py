"""Which object failed to pickle, and where inside it: the search behind the error for a
worker process that could not start because its start-up data (the dataset, batchify_fn,
worker_init_fn) does not pickle under ``spawn`` or ``forkserver`` (``pools.process``).

It runs only once a start has failed, never on the per-batch path.
"""

from __future__ import annotations

import functools
import pickle
import types
from multiprocessing import reduction
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["start_error", "unpicklable_part"]


def start_error(method: str, exc: Exception, roots: Sequence[Tuple[str, Any]]) -> TypeError:
    """The error for a worker that could not start with ``start_method=method`` (pickling
    raised ``exc``) because one of ``roots`` (``(name, object)``) does not pickle: which
    object, and where inside it, when that can be found."""
    found = unpicklable_part(roots)
    if found is None:
        names = ", ".join(name for name, _ in roots[:-1]) + f" or {roots[-1][0]}"
        return TypeError(
            f"the {names} cannot be pickled to start a "
            f"worker with start_method={method!r} ({type(exc).__name__}: {exc}). Use "
            f"start_method='fork' or thread_pool=True, or make the object picklable."
        )
    path, part, error = found
    root = path.split(".", 1)[0].split("[", 1)[0]
    kind = type(part)
    where = "it" if path == root else path
    return TypeError(
        f"the {root} cannot be pickled to start a worker with start_method={method!r}: "
        f"{where} is a {kind.__module__}.{kind.__qualname__} ({type(error).__name__}: "
        f"{error}). Use start_method='fork' or thread_pool=True, or make it picklable "
        f"(leave {path} out with __getstate__, or create it in worker_init_fn)."
    )


# Bounds on the search for the part that does not pickle: it runs only once a worker
# failed to start, but a dataset may be large, and each probe pickles a part of it.
_PROBES = 200
_DEPTH = 12
_WIDTH = 200  # items looked at in one container


class _Sink:
    """A file that keeps nothing: a probe needs only to know whether pickling fails."""

    def write(self, data) -> int:
        return len(data)


def unpicklable_part(roots: Sequence[Tuple[str, Any]]) -> Optional[Tuple[str, Any, Exception]]:
    """The first of ``roots`` (``(name, object)``) that does not pickle as a worker's
    start-up data does (``spawn``, ``forkserver``), as ``(path, part, error)``: the
    innermost part that fails, and its attribute path from the root (``dataset._fn.lock``).
    ``None`` when each pickles on its own."""
    budget = [_PROBES]
    for name, obj in roots:
        error = _pickle_error(obj, budget)
        if error is not None:
            return _narrow(name, obj, error, budget, 0)
    return None


def _pickle_error(obj: Any, budget: List[int]) -> Optional[Exception]:
    budget[0] -= 1
    try:
        reduction.ForkingPickler(_Sink(), pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception as exc:  # noqa: BLE001 - whatever pickling raises is the answer
        return exc
    return None


def _narrow(path: str, obj: Any, error: Exception, budget: List[int], depth: int):
    """Follow the first part of ``obj`` that fails to pickle, down to one whose parts all
    pickle (or the bounds)."""
    if depth < _DEPTH:
        for name, part in _parts(obj):
            if budget[0] <= 0:
                break
            if _plainly_picklable(part):
                continue
            part_error = _pickle_error(part, budget)
            if part_error is not None:
                return _narrow(path + name, part, part_error, budget, depth + 1)
    return path, obj, error


def _plainly_picklable(obj: Any) -> bool:
    if obj is None or isinstance(obj, (str, bytes, int, float, complex)):
        return True
    return isinstance(obj, np.ndarray) and not obj.dtype.hasobject


def _parts(obj: Any) -> Iterator[Tuple[str, Any]]:
    """What pickling ``obj`` pickles in turn, each with its name in an attribute path."""
    if isinstance(obj, dict):
        for n, (key, value) in enumerate(obj.items()):
            if n >= _WIDTH:
                return
            yield f"[{key!r}]", value
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for n, value in enumerate(obj):
            if n >= _WIDTH:
                return
            yield f"[{n}]", value
        return
    if isinstance(obj, types.MethodType):
        yield ".__self__", obj.__self__
        return
    if isinstance(obj, functools.partial):
        yield from ((".func", obj.func), (".args", obj.args), (".keywords", obj.keywords))
        return
    try:
        reduced = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - it refuses to pickle itself: it is the part
        return
    if not isinstance(reduced, tuple):
        return  # pickled by name
    state = reduced[2] if len(reduced) > 2 else None
    if (
        isinstance(state, tuple)
        and len(state) == 2
        and all(s is None or isinstance(s, dict) for s in state)
    ):
        state = {**(state[0] or {}), **(state[1] or {})}  # (__dict__, __slots__ values)
    if isinstance(state, dict):
        yield from ((f".{key}", value) for key, value in state.items())
    elif state is not None:
        yield ".__getstate__()", state
    args = reduced[1] if len(reduced) > 1 and isinstance(reduced[1], tuple) else ()
    for n, arg in enumerate(args):
        if arg is not type(obj):
            yield f".__reduce__()[1][{n}]", arg
