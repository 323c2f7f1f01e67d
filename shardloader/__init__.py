"""shardloader: a Gluon-compatible, multi-worker, sharded DataLoader for Apache MXNet.

>>> from shardloader import ShardedDataLoader   # also exported as shardloader.DataLoader

Every public module is reachable from here: ``batchify``, ``sampler``, ``prefetch``,
``dataiter``, ``recordio`` and ``distributed`` (``launch`` is the command line, run as
``python -m shardloader.launch``), and ``vision``, imported on first use; every public error
is exported at the top level.
"""

from . import batchify, dataiter, distributed, prefetch, recordio, sampler
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

__version__ = "0.1.0"


def __getattr__(name: str):
    # shardloader.vision (docs/vision.md) is imported when first used, not with the package.
    if name == "vision":
        import importlib

        return importlib.import_module(".vision", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
