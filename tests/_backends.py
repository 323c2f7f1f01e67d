"""The loader backends that tests run against, in one table.

A test that runs in several modes parametrizes over names of :data:`BACKENDS` and passes
the entry to the loader as keyword arguments::

    @pytest.mark.parametrize("backend", ["inline", "thread", "fork"])
    def test_x(backend):
        with ShardedDataLoader(data, batch_size=4, **BACKENDS[backend]) as loader: ...
"""

from __future__ import annotations

from typing import Any, Dict

BACKENDS: Dict[str, Dict[str, Any]] = {
    "inline": dict(num_workers=0),
    "thread": dict(num_workers=2, thread_pool=True),
    "fork": dict(num_workers=2, start_method="fork"),
    "spawn": dict(num_workers=2, start_method="spawn"),
    # Process workers in the default way: the only process arguments Gluon's loader takes too.
    "process": dict(num_workers=2),
}


def backends(*names: str) -> Dict[str, Dict[str, Any]]:
    """The entries of :data:`BACKENDS` called ``names``, in that order."""
    return {name: BACKENDS[name] for name in names}


class FixedSampler:
    """A user's sampler or batch sampler that is no Gluon class: a fixed sequence (of sample
    indices, or of index lists) with a length. It pickles, so spawn workers can take it."""

    def __init__(self, items) -> None:
        self.items = list(items)

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)
