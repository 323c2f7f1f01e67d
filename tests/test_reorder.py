"""Results come out in sequence order, whatever order the workers finish in (docs/design.md,
invariant 1)."""

from __future__ import annotations

import pytest

from shardloader._engine.reorder import ReorderBuffer

pytestmark = pytest.mark.timeout(30)


def test_reorder_buffer_releases_in_sequence_order():
    buf = ReorderBuffer(start=5)
    for seq in (7, 5, 9, 6, 8):
        buf.put(seq, f"b{seq}")
    assert len(buf) == 5  # the loader's stats read the depth from here
    out = []
    while buf.ready():
        out.append(buf.pop())
    assert out == ["b5", "b6", "b7", "b8", "b9"]
    assert len(buf) == 0


def test_reorder_buffer_rejects_duplicates_and_stale_results():
    buf = ReorderBuffer()
    buf.put(0, "a")
    with pytest.raises(KeyError, match="duplicate"):
        buf.put(0, "again")
    buf.pop()
    with pytest.raises(KeyError):
        buf.put(0, "late")


def test_reorder_buffer_drain_returns_everything_held():
    buf = ReorderBuffer()
    buf.put(3, "d")
    buf.put(1, "b")
    assert list(buf.drain()) == [(1, "b"), (3, "d")]
    assert len(buf) == 0 and not buf.ready()
