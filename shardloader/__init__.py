"""shardloader: a Gluon-compatible, multi-worker, sharded DataLoader for Apache MXNet."""

__version__ = "0.1.0"
