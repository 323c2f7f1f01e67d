"""Which part of the data this machine reads, from MXNet's kvstore.

In data-parallel training every kvstore worker reads its own part of each epoch:

```python
kv = mx.kv.create('dist_sync')
num_parts, part_index = parts_from_kvstore(kv)
loader = ShardedDataLoader(dataset, batch_size=32, shuffle=True, seed=0,
                           num_parts=num_parts, part_index=part_index)
trainer = gluon.Trainer(net.collect_params(), 'sgd', kvstore=kv)
```

Every worker must use the same ``seed``: the loader then draws the same permutation on every
machine and each takes a disjoint slice of it. With ``dist_sync`` every worker must also make
the same number of ``trainer.step`` calls per epoch, or the job waits forever on the missing
ones, so the parts must have equal numbers of batches.

Start the workers with ``python -m shardloader.launch`` on one machine (see
``shardloader.launch``), or with MXNet's ``tools/launch.py`` on several.

A worker that leaves with an exception, or ``sys.exit(n)``, after creating a ``dist`` store does
not exit: the store's destructor waits in a barrier for the other workers, which in turn wait
for its gradients. Neither the launcher nor anyone else sees the failure until a timeout. Run the
training under ``fail_fast`` so that such a worker exits at once with its error.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Any, Dict, Iterator, Tuple, Union

__all__ = ["fail_fast", "parts_from_kvstore"]

# Stores this module created from a type string, kept for the life of the process: a dist
# store's destructor on rank 0 shuts the servers down, and ps-lite cannot start a second dist
# store in the same process (the second mx.kv.create('dist_sync') blocks forever).
_created: Dict[str, Any] = {}


def parts_from_kvstore(kv: Union[str, Any, None]) -> Tuple[int, int]:
    """Return ``(num_parts, part_index)`` for this process: ``(kv.num_workers, kv.rank)``.

    Parameters
    ----------
    kv : mxnet.kvstore.KVStore, str or None
        A kvstore, or a type string such as ``'dist_sync'``, ``'dist_async'``, ``'device'`` or
        ``'local'``, which is created with ``mxnet.kv.create``. A store created from a
        string is created once per process and kept alive, and the same type string gives it
        back on later calls. ``None`` means no kvstore: ``(1, 0)``.

        A process can hold only one ``dist`` store. If the training loop needs the store too
        (for ``gluon.Trainer(..., kvstore=kv)``), create it once and pass the object here,
        rather than passing the type string to both.

    Returns
    -------
    tuple of int
        ``num_parts`` (the number of kvstore workers) and ``part_index`` (this worker's rank,
        ``0 <= part_index < num_parts``), in the order that
        ``ShardedDataLoader(..., num_parts=..., part_index=...)`` takes them.

    Raises
    ------
    TypeError
        When ``kv`` is neither a string, None, nor an object with ``num_workers`` and ``rank``.
    RuntimeError
        When a ``dist`` type string is given outside a ps-lite cluster (no ``DMLC_*``
        variables), where MXNet would fail with a bare environment check.
    ValueError
        When the store reports a rank outside ``[0, num_workers)``.

    Examples
    --------
    >>> parts_from_kvstore(None)
    (1, 0)
    >>> import mxnet as mx
    >>> parts_from_kvstore(mx.kv.create('local'))
    (1, 0)
    """
    if kv is None:
        return 1, 0
    if isinstance(kv, str):
        kv = _create(kv)
    if not (hasattr(kv, "num_workers") and hasattr(kv, "rank")):
        raise TypeError(
            "kv must be an mxnet KVStore (with num_workers and rank), a kvstore type string "
            f"or None, got {type(kv).__name__}"
        )
    num_parts, part_index = int(kv.num_workers), int(kv.rank)
    if num_parts < 1 or not 0 <= part_index < num_parts:
        raise ValueError(
            f"kvstore reports rank {part_index} of {num_parts} workers; expected "
            "0 <= rank < num_workers"
        )
    return num_parts, part_index


def _create(kind: str) -> Any:
    """Create (once per process) the kvstore of type ``kind``."""
    if kind not in _created:
        if kind.startswith("dist") and "DMLC_PS_ROOT_URI" not in os.environ:
            raise RuntimeError(
                f"kvstore {kind!r} needs a ps-lite cluster, but DMLC_PS_ROOT_URI is not set: "
                "start this script with `python -m shardloader.launch -n N ...` or MXNet's "
                "tools/launch.py"
            )
        import mxnet as mx

        _created[kind] = mx.kv.create(kind)
    return _created[kind]


@contextlib.contextmanager
def fail_fast(kv: Any) -> Iterator[None]:
    """Let this worker exit at once if the block raises, instead of hanging in the kvstore.

    On any exception leaving the block, including ``SystemExit`` with a non-zero code and
    ``KeyboardInterrupt``, it turns off the barrier that a ``dist`` store's destructor waits in,
    then re-raises: the interpreter shuts down normally (finalizers and ``atexit`` run) and the
    process exits with its usual status, which the launcher then reports. The other workers
    are left blocked in their next synchronous step; the launcher stops them. A clean exit is
    unchanged. For a non-``dist`` store or ``None`` it does nothing.

    Parameters
    ----------
    kv : mxnet.kvstore.KVStore or None
        The store the training uses.

    Examples
    --------
    In each worker's training script (it needs a running kvstore cluster):

    ```python
    kv = mx.kv.create('dist_sync')
    with fail_fast(kv):
        train(kv)
    ```
    """
    try:
        yield
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _skip_exit_barrier(kv)
        raise
    except BaseException:
        _skip_exit_barrier(kv)
        raise


def _skip_exit_barrier(kv: Any) -> None:
    """Make a dist store's destructor finalize without waiting for the other workers."""
    if kv is None or not str(getattr(kv, "type", "")).startswith("dist"):
        return
    from mxnet.base import _LIB, check_call

    check_call(_LIB.MXKVStoreSetBarrierBeforeExit(kv.handle, ctypes.c_int(0)))
