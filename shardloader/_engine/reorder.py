"""The reorder buffer: batches come out in sampler order, whatever order workers finish in.

Keyed by *task sequence number* (the batch's position in the epoch), never by dataset
index. A pure class: no threads, no processes, no I/O.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Tuple


class ReorderBuffer:
    """Holds out-of-order results until the next expected sequence number arrives.

    Invariant: every held key is ``>= next_seq`` and unique.

    >>> buf = ReorderBuffer(start=0)
    >>> buf.put(1, "b"); buf.put(0, "a")
    >>> buf.ready(), buf.pop(), buf.pop(), buf.ready()
    (True, 'a', 'b', False)
    """

    __slots__ = ("_items", "_next")

    def __init__(self, start: int = 0) -> None:
        self._items: Dict[int, Any] = {}
        self._next = start

    @property
    def next_seq(self) -> int:
        """The sequence number ``pop`` returns next."""
        return self._next

    def put(self, seq: int, item: Any) -> None:
        if seq < self._next or seq in self._items:
            raise KeyError(f"duplicate result for batch {seq} (next expected {self._next})")
        self._items[seq] = item

    def ready(self) -> bool:
        return self._next in self._items

    def pop(self) -> Any:
        item = self._items.pop(self._next)
        self._next += 1
        return item

    def drain(self) -> Iterator[Tuple[int, Any]]:
        """Remove and yield every held item (for cleanup), lowest sequence first."""
        items, self._items = self._items, {}
        for seq in sorted(items):
            yield seq, items[seq]

    def __len__(self) -> int:
        return len(self._items)
