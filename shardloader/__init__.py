"""shardloader: a Gluon-compatible, multi-worker, sharded DataLoader for Apache MXNet.

>>> from shardloader import ShardedDataLoader   # also exported as shardloader.DataLoader
"""

from . import batchify, sampler
from ._errors import (
    ClosedIteratorError,
    LoaderTimeoutError,
    ShardLoaderError,
    WorkerDiedError,
    WorkerError,
)
from ._worker import WorkerInfo, get_worker_info
from .loader import DataLoader, ShardedDataLoader

__version__ = "0.1.0"

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
    "batchify",
    "sampler",
]
