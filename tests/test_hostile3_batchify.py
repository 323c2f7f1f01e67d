"""Issue 22 (third hostile test), items 12, 14 and 15, and issue 24's stacking errors: what
batchify got wrong against MXNet 2.x, gluon-nlp and a new user.

- item 12: the dtypes a batch may have follow the installed MXNet (2.x adds int16, uint16,
  uint32 and uint64), in every mode;
- item 14: under 2.x, the batchify objects whose Gluon 2.x equivalent has a C++ handle
  (``__mx_handle__``) have one too, and a loader hands them to Gluon's C++ pipeline;
- item 15: gluon-nlp's ``Pad`` warns when no ``pad_val`` is given, and so does ours;
- issue 24: a stacking error names the dataset index of the odd sample and says what to do
  in its first line (a resize or crop for images).
"""

from __future__ import annotations

import numpy as np
import pytest
from _backends import BACKENDS
from conftest import GLUON_PYTHON, requires_mx1, requires_mx2
from mxnet.gluon.data import DataLoader as GluonDataLoader

from shardloader import ShardedDataLoader
from shardloader.batchify import Pad, Stack, Tuple, default_batchify_fn

pytestmark = pytest.mark.timeout(120)

# The dtypes MXNet 2.x's arrays hold and 1.x's do not.
NEW_IN_2X = ["int16", "uint16", "uint32", "uint64"]


def described(batch):
    """A comparable form of a batch: containers, array types, dtypes, shapes and values."""
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, [described(b) for b in batch])
    if hasattr(batch, "asnumpy"):
        return (type(batch).__name__, str(batch.dtype), batch.shape, batch.asnumpy().tolist())
    return batch


class NewDtypesDataset:
    """Sample i: one field per dtype of NEW_IN_2X, an array of 3 values and a scalar."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i):
        arrays = tuple(np.arange(i, i + 3, dtype=d) for d in NEW_IN_2X)
        return arrays + (np.uint16(60000 + i),)


# ------------------------------------------------------------------ item 12: 2.x's dtypes


@pytest.mark.mx2_smoke
@requires_mx2("int16, uint16, uint32 and uint64 arrays, new in 2.x")
@pytest.mark.parametrize("backend", ["inline", "thread", "fork", "spawn"])
def test_mx2_batches_int16_uint16_uint32_uint64_as_gluon_does(backend, no_leaks):
    """Item 12: shardloader refused these dtypes under 2.x in every mode ("cannot batchify
    samples of dtype int16"), where Gluon 2.x batches them."""
    data = NewDtypesDataset()
    expected = [described(b) for b in GluonDataLoader(data, batch_size=4, **GLUON_PYTHON)]
    with ShardedDataLoader(data, batch_size=4, **BACKENDS[backend]) as loader:
        got = [described(b) for b in loader]
    assert got == expected
    assert [field[1] for field in got[0][1]] == NEW_IN_2X + ["uint16"]


@requires_mx2("int16, uint16, uint32 and uint64 arrays, new in 2.x")
@pytest.mark.parametrize("dtype", NEW_IN_2X)
def test_mx2_batchify_functions_take_the_new_dtypes(dtype):
    samples = [np.arange(3, dtype=dtype), np.arange(1, dtype=dtype)]
    padded, length = Pad(pad_val=7, ret_length=True)(samples)
    assert padded.dtype == np.dtype(dtype)
    assert padded.asnumpy().tolist() == [[0, 1, 2], [0, 7, 7]]
    assert length.asnumpy().tolist() == [3, 1]
    stacked = Stack(dtype=dtype)([[1, 2], [3, 4]])
    assert stacked.dtype == np.dtype(dtype) and stacked.asnumpy().tolist() == [[1, 2], [3, 4]]
    assert default_batchify_fn([np.dtype(dtype).type(5)] * 2).dtype == np.dtype(dtype)


@requires_mx1("1.x's arrays hold no int16, uint16, uint32 or uint64")
@pytest.mark.parametrize("dtype", NEW_IN_2X)
def test_mx1_refuses_the_dtypes_its_arrays_cannot_hold(dtype):
    with pytest.raises(TypeError, match=rf"dtype {dtype}: this MXNet's arrays hold only bool"):
        default_batchify_fn([np.zeros(2, dtype), np.zeros(2, dtype)])
    with pytest.raises(ValueError, match=r"Stack: dtype must be None or one of bool, uint8, int8"):
        Stack(dtype=dtype)
    with pytest.raises(TypeError, match=rf"dtype {dtype}"):
        Tuple(Pad(pad_val=0))([(np.zeros(2, dtype),)])
