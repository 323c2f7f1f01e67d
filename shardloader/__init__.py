"""shardloader: a Gluon-compatible, multi-worker, sharded DataLoader for Apache MXNet.

>>> from shardloader import ShardedDataLoader   # also exported as shardloader.DataLoader

Every public module is reachable from here: ``batchify``, ``sampler``, ``prefetch``,
``dataiter``, ``recordio`` and ``distributed`` (``launch`` is the command line, run as
``python -m shardloader.launch``) and ``vision``; every public error is exported at the top
level. Each is imported on first use: ``import shardloader`` alone loads neither the package's
modules nor MXNet.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

# The package imports nothing, MXNet least of all, until a name is used: the command line
# (`shardloader --help`) answers without loading MXNet. Each public name -> its module.
_LAZY = {
    "ShardedDataLoader": ".loader",
    "DataLoader": ".loader",
    "get_worker_info": "._engine.worker",
    "WorkerInfo": "._engine.worker",
    "ShardLoaderError": "._errors",
    "WorkerError": "._errors",
    "WorkerDiedError": "._errors",
    "LoaderTimeoutError": "._errors",
    "ClosedIteratorError": "._errors",
    "RecordIOError": "._errors",
    "SharedMemoryError": "._errors",
}
_SUBMODULES = ("batchify", "dataiter", "distributed", "prefetch", "recordio", "sampler", "vision")

if TYPE_CHECKING:  # what the names are, for type checkers and the API pages
    from . import batchify, dataiter, distributed, prefetch, recordio, sampler, vision
    from ._engine.worker import WorkerInfo, get_worker_info
    from ._errors import (
        ClosedIteratorError,
        LoaderTimeoutError,
        RecordIOError,
        ShardLoaderError,
        SharedMemoryError,
        WorkerDiedError,
        WorkerError,
    )
    from .loader import DataLoader, ShardedDataLoader


def __getattr__(name: str):
    import importlib

    if name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "ShardedDataLoader",
    "DataLoader",
    "get_worker_info",
    "WorkerInfo",
    "ShardLoaderError",
    "WorkerError",
    "WorkerDiedError",
    "LoaderTimeoutError",
    "ClosedIteratorError",
    "RecordIOError",
    "SharedMemoryError",
    "batchify",
    "dataiter",
    "distributed",
    "prefetch",
    "recordio",
    "sampler",
    "vision",
]
