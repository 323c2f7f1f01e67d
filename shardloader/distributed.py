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

To resume a job on another number of machines, each machine saves its loader's
``state_dict()``, ``merge_states`` puts them together into one job state, and every machine of
the new job loads that with ``load_state_dict`` (docs/distributed.md, "Resuming on another
number of machines").

A worker that leaves with an exception, or ``sys.exit(n)``, after creating a ``dist`` store does
not exit: the store's destructor waits in a barrier for the other workers, which in turn wait
for its gradients. Neither the launcher nor anyone else sees the failure until a timeout. Run the
training under ``fail_fast`` so that such a worker exits at once with its error.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Any, Dict, Iterator, Sequence, Tuple

from . import _checkpoint

__all__ = ["fail_fast", "merge_states", "parts_from_kvstore"]

# Stores this module created from a type string, kept for the life of the process: a dist
# store's destructor on rank 0 shuts the servers down, and ps-lite cannot start a second dist
# store in the same process (the second mx.kv.create('dist_sync') blocks forever).
_created: Dict[str, Any] = {}


def parts_from_kvstore(kv: Any) -> Tuple[int, int]:
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


def merge_states(states: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Merge the loader states of every machine of a job into one job state.

    Each machine saves its own ``loader.state_dict()``; this puts them together, checked, in
    part order. Any machine of the next job, on the same number of machines or another,
    loads the job state with ``loader.load_state_dict(job)``. On the same number a machine
    resumes its own part exactly as from its own state. On another number each machine
    yields its share of the batches that no machine had consumed, cut as ``num_parts``
    cuts an epoch (``even_size`` pads the shares alike), and then the epochs of its own
    ``num_parts`` and ``part_index``. The job state is JSON-ready, as the states are.

    Parameters
    ----------
    states : list of dict
        ``state_dict()`` of the loader of every machine, one per part, in any order,
        taken in the same epoch (a machine that has ended the epoch may be at batch 0 of
        the next).

    Returns
    -------
    dict
        ``{"version", "epoch", "num_parts", "parts"}``: the job's epoch (the earliest of the
        states'), its number of machines, and the states in part order.

    Raises
    ------
    TypeError
        If ``states`` is not a non-empty list.
    ValueError
        If a state is not a loader's state, the states are of different loaders (dataset
        length, ``batch_size``, ``seed``, batch sampler) or numbers of machines, a part is
        missing or given twice, or a machine is past the job's epoch.

    Examples
    --------
    >>> from shardloader import DataLoader
    >>> def loader(num_parts, part_index):
    ...     return DataLoader(list(range(10)), batch_size=2, shuffle=True, seed=0,
    ...                       num_parts=num_parts, part_index=part_index)
    >>> old = [loader(2, rank) for rank in range(2)]
    >>> taken = [next(iter(old[0])).asnumpy().tolist()]       # machine 0 takes a batch
    >>> job = merge_states([l.state_dict() for l in old])
    >>> new = [loader(3, rank) for rank in range(3)]
    >>> for l in new:
    ...     l.load_state_dict(job)
    >>> rest = [b.asnumpy().tolist() for l in new for b in l]
    >>> sorted(i for batch in taken + rest for i in batch)
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    return _checkpoint.merge_states(states)


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
