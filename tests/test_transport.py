"""The shared-memory transport, tested without workers: a batch crosses as metadata, into
reused slots, and a slot returns only when nothing uses it."""

from __future__ import annotations

import gc
import os
import pickle

import mxnet as mx
import numpy as np
import pytest

from shardloader import batchify
from shardloader._engine.ipc import alloc as _alloc
from shardloader._engine.ipc.slots import ND, ArrayRef, SlotRing
from shardloader._engine.ipc.table import SlotTable

pytestmark = pytest.mark.timeout(60)


def _ship(ring, table, batch, promoted=None, key=0):
    """What a worker and the main process do with one batch, in one process."""
    skeleton, slot_id, fds = ring.pack(batch, promoted or {})
    message = pickle.dumps((skeleton, slot_id))
    for sid, capacity, fd in fds:
        table.adopt(key, sid, os.dup(fd), capacity)
    if slot_id is not None:
        ring.sent(slot_id)
    skeleton, slot_id = pickle.loads(message)
    table.received(key, slot_id)
    return table.materialize(key, slot_id, skeleton), message


def test_batch_crosses_as_metadata_not_bytes():
    ring, table = SlotRing(), SlotTable()
    try:
        ring.begin()
        promoted: dict = {}
        samples = [(np.full((256, 256), i, np.float32), i) for i in range(8)]
        with _alloc.allocating(ring.allocate, numpy_out=True, promoted=promoted):
            batch = batchify.default_batchify_fn(samples)
        out, message = _ship(ring, table, batch, promoted)
        assert len(message) < 1024, "2 MB of data must travel as a few hundred bytes"
        assert isinstance(out[0], mx.nd.NDArray) and isinstance(out[1], mx.nd.NDArray)
        assert out[0].shape == (8, 256, 256) and out[1].asnumpy().tolist() == list(range(8))
    finally:
        ring.close()
        table.close()


def test_second_batch_is_stacked_straight_into_a_reused_slot():
    ring, table = SlotRing(), SlotTable()
    try:
        outs = []
        for step in range(3):
            ring.begin()
            promoted: dict = {}
            with _alloc.allocating(ring.allocate, numpy_out=True, promoted=promoted):
                batch = batchify.Stack()([np.full((1000,), step, np.int64)] * 4)
            in_slot = ring._offset_in(ring.current, batch) is not None
            out, _ = _ship(ring, table, batch, promoted)
            outs.append(out.asnumpy())
            if step > 0:
                assert in_slot, "after the first batch, the stack lands in the slot itself"
            del out
            gc.collect()
            table.collect()  # the user dropped the batch: its finalizer runs
            ring.release(table.take_releases(0))
        assert [o[0, 0] for o in outs] == [0, 1, 2]
        assert len(ring._slots) == 1, "one slot, reused for every batch"
    finally:
        ring.close()
        table.close()


def test_user_leaves_keep_their_types():
    ring, table = SlotRing(), SlotTable()
    try:
        ring.begin()
        batch = {
            "nd": mx.nd.arange(6).reshape((2, 3)),
            "np": np.arange(4, dtype=np.int16),
            "words": ["a", "b"],
            "obj": np.array(["x", "y"], dtype=object),
            "n": 3,
        }
        out, message = _ship(ring, table, batch)
        assert isinstance(out["nd"], mx.nd.NDArray)
        assert out["nd"].asnumpy().tolist() == [[0, 1, 2], [3, 4, 5]]
        assert isinstance(out["np"], np.ndarray) and out["np"].dtype == np.int16
        assert out["words"] == ["a", "b"] and out["obj"].tolist() == ["x", "y"]
        assert out["n"] == 3
        assert b"\x00\x01\x00\x02" not in message  # the int16 bytes did not travel pickled
    finally:
        ring.close()
        table.close()


def test_slot_returns_only_after_every_array_of_the_batch_is_gone():
    ring, table = SlotRing(), SlotTable()
    try:
        ring.begin()
        arrays = [np.ones(10000, np.float32), np.zeros(10, np.int64)]
        out, _ = _ship(ring, table, arrays, {id(a): a for a in arrays})
        del arrays
        data, label = out
        del out
        data2 = data * 2  # an MXNet op that reads the slot
        del data
        gc.collect()
        mx.nd.waitall()
        table.collect()
        assert table.take_releases(0) == [], "label still uses the slot"
        del label
        gc.collect()
        table.collect()
        assert table.take_releases(0) == [0]
        assert float(data2.sum().asscalar()) == 20000.0
    finally:
        ring.close()
        table.close()


def test_the_tables_queries_run_no_finalizer(monkeypatch):
    """``take_releases`` and ``urgent`` only read what ``collect`` queued: asking them runs
    no lease's finalizer (sides.MainSide's call order)."""
    from shardloader._engine.ipc import table as table_module

    reaped = []
    monkeypatch.setattr(table_module, "reap_some", lambda: reaped.append(1))
    table = SlotTable()
    try:
        assert table.take_releases(0) == [] and table.urgent() == []
        assert table.take_resends(0) == []
        assert reaped == [], "a query ran the finalizers of released batches"
        table.collect()
        assert reaped == [1]
    finally:
        table.close()


def test_array_ref_pickles_small():
    ref = ArrayRef(128, (64, 3, 224, 224), "|u1", ND)
    again = pickle.loads(pickle.dumps(ref))
    assert (again.offset, again.shape, again.dtype, again.kind) == (
        128,
        (64, 3, 224, 224),
        "|u1",
        ND,
    )
    assert len(pickle.dumps(ref)) < 120
