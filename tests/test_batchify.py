"""Tests for shardloader.batchify: Gluon's default batchify, gluon-nlp's batchify functions and
MXNet 2.x's (``Group``, ``AsList``, ``Append``, and 2.x's ``Stack`` and ``Pad`` through
``gluon_equivalent``)."""

import collections
import doctest
import importlib
import pickle
import pkgutil
import re
import warnings

import mxnet as mx
import numpy as np
import pytest
from conftest import ARRAY_TYPE, ARRAYS, requires_mx1, requires_mx2, where
from mxnet.gluon.data.dataloader import default_batchify_fn as gluon_default_batchify_fn

from shardloader import batchify
from shardloader._engine.ipc import alloc as _alloc
from shardloader.batchify import (
    Append,
    AsList,
    Dict,
    Group,
    List,
    NamedTuple,
    Pad,
    Stack,
    Tuple,
    default_batchify_fn,
    default_mp_batchify_fn,
    gluon_equivalent,
    is_native,
)

pytestmark = pytest.mark.timeout(60)

# Module level, so that batchify functions holding it can be pickled.
Sample = collections.namedtuple("Sample", ["data", "label"])
Other = collections.namedtuple("Other", ["data", "label"])

MX_DTYPES = ["float32", "float64", "float16", "uint8", "int8", "int32", "int64", "bool"]


# ----------------------------------------------------------------------------------------------
# Helpers and fixtures


class RecordingAllocator:
    """Carves every buffer out of one arena, as the shared-memory transport does."""

    def __init__(self, nbytes=1 << 20):
        self.arena = np.zeros(nbytes, dtype=np.uint8)
        self.offset = 0
        self.buffers = []

    def __call__(self, shape, dtype):
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        start = -(-self.offset // 64) * 64
        self.offset = start + nbytes
        buf = self.arena[start : start + nbytes].view(dtype).reshape(shape)
        self.buffers.append(buf)
        return buf


@pytest.fixture
def raw_alloc():
    alloc = RecordingAllocator()
    with _alloc.allocating(alloc, numpy_out=True):
        yield alloc


def assert_same_batch(ours, theirs):
    """Same structure, types, dtypes, shapes, contexts and values."""
    assert type(ours) is type(theirs), (type(ours), type(theirs))
    if isinstance(theirs, mx.nd.NDArray):
        assert ours.dtype == theirs.dtype
        assert ours.shape == theirs.shape
        assert ours.context == theirs.context
        np.testing.assert_array_equal(ours.asnumpy(), theirs.asnumpy())
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert_same_batch(a, b)
    elif isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype
        np.testing.assert_array_equal(ours, theirs)
    else:
        assert ours == theirs


def assert_nd(batch, expected, dtype=None):
    assert isinstance(batch, mx.nd.NDArray)
    expected = np.asarray(expected, dtype=dtype)
    assert batch.dtype == expected.dtype
    np.testing.assert_array_equal(batch.asnumpy(), expected)


def _values(rng, dtype, shape):
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    return (rng.random(size=shape) * 100).astype(dtype)


def _random_field(rng, n):
    """``n`` values of one field, all of one random kind, dtype and shape."""
    kind = int(rng.integers(5))
    dtype = str(rng.choice(MX_DTYPES))
    shape = tuple(int(s) for s in rng.integers(0, 4, size=int(rng.integers(0, 3))))
    if kind == 0:
        return [_values(rng, dtype, shape) for _ in range(n)]
    if kind == 1:  # Gluon's nd.stack fails on empty or 0-d NDArrays: keep them non-empty.
        shape = tuple(max(s, 1) for s in shape) or (2,)
        return [mx.nd.array(_values(rng, dtype, shape), dtype=dtype) for _ in range(n)]
    if kind == 2:
        return [np.dtype(dtype).type(_values(rng, dtype, ())) for _ in range(n)]
    if kind == 3:
        python_type = [int, float, bool][int(rng.integers(3))]
        return [python_type(_values(rng, "float64", ())) for _ in range(n)]
    length = int(rng.integers(0, 4))
    return [[float(v) for v in _values(rng, "float64", (length,))] for _ in range(n)]


def _random_batch(rng):
    n = int(rng.integers(1, 6))
    structure = int(rng.integers(3))
    if structure == 0:
        return _random_field(rng, n)
    fields = [_random_field(rng, n) for _ in range(int(rng.integers(1, 4)))]
    if structure == 2:  # one field nested one level deeper
        fields[0] = list(zip(_random_field(rng, n), fields[0]))
    return list(zip(*fields))


# ----------------------------------------------------------------------------------------------
# default_batchify_fn: the same results as Gluon 1.9.1


GLUON_CASES = {
    "ndarray_float32": [mx.nd.array(np.arange(6).reshape(2, 3) + i) for i in range(4)],
    "ndarray_int8": [mx.nd.array([1, 2, i], dtype="int8") for i in range(3)],
    "ndarray_float16": [mx.nd.array([[0.5, i]], dtype="float16") for i in range(3)],
    "numpy_float32": [np.full(64, i, dtype=np.float32) for i in range(32)],
    "numpy_float64_2d": [np.arange(6.0).reshape(2, 3) * i for i in range(3)],
    "numpy_uint8_image": [np.full((4, 4, 3), i, dtype=np.uint8) for i in range(5)],
    "numpy_int32": [np.array([i, -i], dtype=np.int32) for i in range(3)],
    "numpy_bool": [np.array([True, False]), np.array([False, False])],
    "numpy_0d": [np.array(1.5), np.array(2.5)],
    "numpy_empty": [np.zeros((2, 0)), np.zeros((2, 0))],
    "numpy_non_contiguous": [np.arange(10.0)[::2], np.arange(10.0)[1::2]],
    "numpy_mixed_dtypes": [np.zeros(3, np.float32), np.ones(3, np.float64)],
    "numpy_int32_float32_promote": [np.zeros(2, np.int32), np.ones(2, np.float32)],
    "numpy_int8_int32_promote": [np.zeros(2, np.int8), np.ones(2, np.int32)],
    "numpy_array_and_number": [np.array(1), 2],
    "numpy_scalar_float32": [np.float32(i) / 3 for i in range(4)],
    "numpy_scalar_int8": [np.int8(i) for i in range(4)],
    "numpy_scalar_bool": [np.bool_(True), np.bool_(False)],
    "python_int": list(range(7)),
    "python_float": [0.5 * i for i in range(7)],
    "python_bool": [True, False, True],
    "python_int_float_mix": [1, 2.5, 3],
    "numpy_scalar_python_float_mix": [np.float32(1), 2.0],
    "list_of_ints": [[1, 2, 3], [4, 5, 6]],
    "nested_lists": [[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]],
    "batch_of_one": [np.arange(3.0)],
    "tuple_array_int": [(np.full(64, i, np.float32), i) for i in range(32)],
    "tuple_ndarray_float": [(mx.nd.ones((2, 2)) * i, float(i)) for i in range(3)],
    "tuple_nested": [(np.zeros(2) + i, (i, np.float32(i), [i, i])) for i in range(3)],
    "tuple_of_one": [(i,) for i in range(3)],
    "tuple_empty": [(), ()],
    # numpy subclasses that hold plain numbers: Gluon's np.asarray stacks their values.
    "masked_nothing_masked": [np.ma.masked_array([1.0, 2.0], mask=[0, 0]), np.ma.arange(2.0)],
    "masked_array_after_plain": [np.zeros(2), np.ma.masked_array([1.0, 2.0])],
    "recarray_of_numbers": [np.arange(3).view(np.recarray), np.ones(3, int).view(np.recarray)],
}


@pytest.mark.parametrize("data", list(GLUON_CASES.values()), ids=list(GLUON_CASES))
def test_default_batchify_matches_gluon(data):
    assert_same_batch(default_batchify_fn(data), gluon_default_batchify_fn(data))


def test_default_batchify_matches_gluon_on_random_batches():
    rng = np.random.default_rng(1234)
    for _ in range(300):
        data = _random_batch(rng)
        assert_same_batch(default_batchify_fn(data), gluon_default_batchify_fn(data))


def test_default_batchify_types_of_python_numbers():
    assert default_batchify_fn([1, 2]).dtype == np.int64
    assert default_batchify_fn([1.0, 2.0]).dtype == np.float64
    assert default_batchify_fn([np.float16(1), np.float16(2)]).dtype == np.float16


def test_default_batchify_tuples_give_a_list():
    out = default_batchify_fn([(np.zeros(2), 1), (np.ones(2), 2)])
    assert type(out) is list and len(out) == 2
    assert_nd(out[0], [[0, 0], [1, 1]], dtype=np.float64)
    assert_nd(out[1], [1, 2])


def test_default_batchify_stacks_empty_ndarrays():
    out = default_batchify_fn([mx.nd.array(np.zeros((2, 0))), mx.nd.array(np.zeros((2, 0)))])
    assert out.shape == (2, 2, 0)


def test_default_mp_batchify_fn_is_the_default():
    assert default_mp_batchify_fn is default_batchify_fn


# ----------------------------------------------------------------------------------------------
# default_batchify_fn: extensions where Gluon would fail


@pytest.mark.parametrize(
    "data",
    [
        ["a", "bc"],
        [b"a", b"b"],
        [None, None],
        [object(), object()],
        [1, None],
        [{"x"}, {"y"}],
        [["a", "b"], ["c", "d"]],
        [["a"], ["b", "c"]],
        [np.array(["a", "b"]), np.array(["c", "d"])],
        [2**70, 2**71],
    ],
    ids=[
        "str",
        "bytes",
        "none",
        "objects",
        "int_and_none",
        "sets",
        "str_lists",
        "ragged_str_lists",
        "str_arrays",
        "huge_ints",
    ],
)
def test_default_batchify_returns_non_numeric_leaves_as_a_list(data):
    out = default_batchify_fn(data)
    assert type(out) is list
    assert len(out) == len(data)
    assert all(a is b for a, b in zip(out, data))


def test_default_batchify_non_numeric_field_of_tuples():
    data, words = default_batchify_fn([(np.zeros(2), "hello"), (np.ones(2), "world")])
    assert_nd(data, [[0, 0], [1, 1]], dtype=np.float64)
    assert words == ["hello", "world"]


def test_default_batchify_dict_samples():
    out = default_batchify_fn(
        [
            {"x": np.zeros(3, np.float32), "y": 1, "meta": ("a", 0.5)},
            {"x": np.ones(3, np.float32), "y": 2, "meta": ("b", 1.5)},
        ]
    )
    assert type(out) is dict
    assert list(out) == ["x", "y", "meta"]
    assert_nd(out["x"], [[0, 0, 0], [1, 1, 1]], dtype=np.float32)
    assert_nd(out["y"], [1, 2])
    assert out["meta"][0] == ["a", "b"]
    assert_nd(out["meta"][1], [0.5, 1.5])


def test_default_batchify_dict_inside_tuple():
    data, extra = default_batchify_fn([(1, {"k": 2.0}), (3, {"k": 4.0})])
    assert_nd(data, [1, 3])
    assert_nd(extra["k"], [2.0, 4.0])


def test_default_batchify_dicts_need_the_same_keys():
    with pytest.raises(ValueError, match=r"sample 1 must be a dict with the keys of sample 0"):
        default_batchify_fn([{"a": 1, "b": 2}, {"a": 1}])
    with pytest.raises(ValueError, match=r"sample 2 must be a dict"):
        default_batchify_fn([{"a": 1}, {"a": 2}, 3])


# Masked and record arrays: Gluon's np.asarray(data) drops a mask without a word, and fails on
# record arrays (KeyError: <class 'numpy.record'>).

MASKED = np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])


@pytest.mark.parametrize(
    "fn, data, where",
    [
        (default_batchify_fn, [np.zeros(3), MASKED], "default_batchify_fn: sample 1"),
        (default_batchify_fn, [MASKED, MASKED], "default_batchify_fn: sample 0"),
        (default_batchify_fn, [(MASKED, 0), (np.zeros(3), 1)], "default_batchify_fn: sample 0"),
        (Stack(), [np.ones(3), np.ones(3), MASKED], "Stack: sample 2"),
        (Pad(pad_val=0), [np.ones(2), MASKED], "Pad: sample 1"),
    ],
    ids=["default", "default_first", "default_tuple_field", "stack", "pad"],
)
def test_a_masked_array_with_masked_values_is_refused(fn, data, where):
    # Gluon would return the value hidden under the mask (2.0) as if it were data.
    if fn is default_batchify_fn and isinstance(data[0], np.ndarray):
        hidden = gluon_default_batchify_fn(data).asnumpy()
        assert 2.0 in hidden[[i for i, a in enumerate(data) if a is MASKED]]
    with pytest.raises(ValueError, match=re.escape(where) + r" is a masked array with 1 masked"):
        fn(data)


def test_masked_scalars_become_nan_as_in_gluon():
    data = [np.ma.masked, np.ma.masked_array(2.0, mask=False)]
    with pytest.warns(UserWarning, match="masked element to nan"):
        theirs = gluon_default_batchify_fn(data)
    with pytest.warns(UserWarning, match="masked element to nan"):
        ours = default_batchify_fn(data)
    assert_same_batch(ours, theirs)
    np.testing.assert_array_equal(ours.asnumpy(), [np.nan, 2.0])


RECORDS = np.rec.fromarrays([np.arange(3), np.arange(3.0) / 2], names="id,score")


@pytest.mark.parametrize(
    "data",
    [
        [RECORDS, RECORDS[::-1]],
        [RECORDS[0], RECORDS[1]],
        [np.zeros(2, dtype=[("a", "i4"), ("b", "f8")])] * 2,
    ],
    ids=["record_arrays", "records", "structured_arrays"],
)
def test_record_arrays_come_back_whole_with_their_field_names(data):
    with pytest.raises(KeyError):
        gluon_default_batchify_fn(data)  # Gluon cannot batch them at all
    out = default_batchify_fn(data)
    assert type(out) is list and len(out) == len(data)
    for got, sample in zip(out, data):
        assert got is sample
        assert got.dtype.names == sample.dtype.names
    field, ids = default_batchify_fn([(RECORDS, 0), (RECORDS, 1)])
    assert field[0].dtype.names == ("id", "score")
    assert_nd(ids, [0, 1])
    with pytest.raises(TypeError, match="Stack: cannot stack samples that are not numbers"):
        Stack()(data)


def test_default_batchify_namedtuple_samples_keep_their_type():
    samples = [Sample(np.full(2, i, np.float32), i) for i in range(3)]
    out = default_batchify_fn(samples)
    assert type(out) is Sample
    # Gluon gives a list with the same entries.
    assert_same_batch(list(out), gluon_default_batchify_fn(samples))


def test_default_batchify_namedtuples_must_share_a_type():
    with pytest.raises(TypeError, match=r"sample 1 is .*Other.*sample 0 is a Sample"):
        default_batchify_fn([Sample(1, 2), Other(3, 4)])


def test_default_batchify_tuples_need_the_same_number_of_fields():
    # Gluon's zip would silently drop the third field.
    with pytest.raises(ValueError, match=r"sample 2 has 3 fields, expected 2"):
        default_batchify_fn([(1, 2), (3, 4), (5, 6, 7)])
    with pytest.raises(TypeError, match=r"sample 1 must be a tuple or list of 2 fields"):
        default_batchify_fn([(1, 2), 3])


def test_default_batchify_empty_batch():
    with pytest.raises(ValueError, match="empty batch"):
        default_batchify_fn([])


@pytest.mark.parametrize(
    "data, dtype",
    [
        pytest.param(
            [np.zeros(2, np.uint16), np.zeros(2, np.uint16)],
            "uint16",
            marks=requires_mx1("uint16: 2.x's arrays hold it"),
        ),
        pytest.param(
            [np.int16(1), np.int16(2)], "int16", marks=requires_mx1("int16: 2.x's arrays hold it")
        ),
        ([1j, 2j], "complex128"),
    ],
)
def test_default_batchify_rejects_dtypes_mxnet_cannot_hold(data, dtype):
    with pytest.raises(TypeError, match=rf"dtype {dtype}: this MXNet's arrays hold only bool, "):
        default_batchify_fn(data)


def test_default_batchify_converts_big_endian_arrays():
    out = default_batchify_fn([np.arange(3, dtype=">f4"), np.arange(3, dtype=">f4")])
    assert_nd(out, [[0, 1, 2], [0, 1, 2]], dtype=np.float32)


# ----------------------------------------------------------------------------------------------
# Mismatched shapes


PAD_HINT = (
    "Pad the samples to one shape with batchify_fn=batchify.Pad(pad_val=0) (for samples of "
    "several fields, batchify.Tuple(batchify.Pad(pad_val=0), batchify.Stack())), or make them "
    "one shape in the dataset."
)


def test_mismatched_numpy_shapes_name_the_sample_and_both_shapes():
    data = [np.zeros((3, 4))] * 3 + [np.zeros((3, 5))] + [np.zeros((3, 6))]
    expected = (
        "Cannot stack the sample at batch position 3, of shape (3, 5), with the one at batch "
        f"position 0, of shape (3, 4): the samples of a batch must have one shape.\n{PAD_HINT}"
    )
    with pytest.raises(ValueError) as info:
        default_batchify_fn(data)
    assert str(info.value) == expected
    with pytest.raises(ValueError) as info:
        Stack()(data)
    assert str(info.value) == expected


@pytest.mark.parametrize(
    "data, position, shape, first_shape",
    [
        ([mx.nd.zeros((2, 2)), mx.nd.zeros((2, 3))], 1, (2, 3), (2, 2)),
        ([np.zeros(3), np.zeros(3), np.zeros((3, 1))], 2, (3, 1), (3,)),
        ([[1, 2, 3], [4, 5, 6], [7, 8]], 2, (2,), (3,)),
        ([[1, 2], 3], 1, (), (2,)),
        ([[[1, 2], [3, 4]], [[1, 2], [3, 4, 5]]], 1, (2, None), (2, 2)),
        ([np.zeros(4), [1, 2]], 1, (2,), (4,)),
    ],
    ids=["ndarray", "numpy_ndim", "lists", "list_and_number", "nested_lists", "array_and_list"],
)
def test_mismatched_shapes(data, position, shape, first_shape):
    message = (
        f"Cannot stack the sample at batch position {position}, of shape {shape}, "
        f"with the one at batch position 0, of shape {first_shape}"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no numpy warning about ragged sequences
        with pytest.raises(ValueError, match=re.escape(message)):
            default_batchify_fn(data)


def test_ragged_nested_lists_inside_samples():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"position 0, of shape \(2, None\): its nested lists"):
            default_batchify_fn([[[1, 2], [3]], [[1, 2], [3]]])


def test_mismatched_shapes_inside_a_tuple_field():
    data = [(np.zeros(4), 0), (np.zeros(4), 1), (np.zeros(5), 2)]
    with pytest.raises(
        ValueError, match=re.escape("position 2, of shape (5,), with the one at batch position 0")
    ):
        default_batchify_fn(data)


# ----------------------------------------------------------------------------------------------
# Stack


def test_stack_lists_of_numbers():
    # gluon-nlp's example: lists go through np.asarray, so ints stay int64.
    out = Stack()([[1, 2, 3, 4], [4, 5, 6, 8], [8, 9, 1, 2]])
    assert_nd(out, [[1, 2, 3, 4], [4, 5, 6, 8], [8, 9, 1, 2]])


def test_stack_numpy_arrays_keep_their_dtype():
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.int32)
    b = np.array([[5, 6, 7, 8], [1, 2, 3, 4]], dtype=np.int32)
    assert_nd(Stack()([a, b]), np.stack([a, b]))


def test_stack_ndarrays():
    a = mx.nd.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = mx.nd.array([[5, 6, 7, 8], [1, 2, 3, 4]])
    assert_nd(Stack()([a, b]), np.stack([a.asnumpy(), b.asnumpy()]))


@pytest.mark.parametrize(
    "data, dtype, expected",
    [
        ([np.array([1.7, -2.2]), np.array([3.9, 4.0])], "int32", [[1, -2], [3, 4]]),
        ([[1, 2], [3, 4]], np.float16, [[1, 2], [3, 4]]),
        ([mx.nd.array([0.5]), mx.nd.array([1.5])], "float64", [[0.5], [1.5]]),
        ([1, 0, 2], "bool", [True, False, True]),
    ],
)
def test_stack_dtype(data, dtype, expected):
    assert_nd(Stack(dtype=dtype)(data), expected, dtype=dtype)


def test_stack_numpy_scalars():
    assert_nd(Stack()([np.float32(1), np.float32(2)]), [1, 2], dtype=np.float32)


def test_stack_tuple_samples_are_rows():
    assert_nd(Stack()([(1, 2), (3, 4)]), [[1, 2], [3, 4]])


def test_stack_rejects_non_numeric_samples():
    with pytest.raises(TypeError, match=r"Stack: cannot stack samples that are not numbers.*List"):
        Stack()(["a", "b"])


def test_stack_empty_batch():
    with pytest.raises(ValueError, match="empty batch"):
        Stack()([])


# ----------------------------------------------------------------------------------------------
# Pad


def reference_pad(arrays, axis, pad_val, dtype, round_to=None):
    arrays = [np.asarray(a) for a in arrays]
    size = max(a.shape[axis] for a in arrays)
    if round_to:
        size = int(np.ceil(size / round_to) * round_to)
    shape = list(arrays[0].shape)
    shape[axis] = size
    out = np.full([len(arrays)] + shape, pad_val, dtype=dtype)
    for i, a in enumerate(arrays):
        index = [slice(None)] * a.ndim
        index[axis] = slice(0, a.shape[axis])
        out[i][tuple(index)] = a
    return out


def test_pad_lists_give_float32():
    # gluon-nlp's example: list samples come out as float32.
    out = Pad(pad_val=0)([[1, 2, 3, 4], [4, 5, 6], [8, 2]])
    assert_nd(out, [[1, 2, 3, 4], [4, 5, 6, 0], [8, 2, 0, 0]], dtype=np.float32)


def test_pad_keeps_the_values_of_float_lists():
    assert_nd(Pad(pad_val=0)([[0.5, 1.5], [2.5]]), [[0.5, 1.5], [2.5, 0]], dtype=np.float32)


def test_pad_ret_length_gives_int32_lengths():
    batch, length = Pad(pad_val=0, ret_length=True)([[1, 2, 3, 4], [4, 5, 6], [8, 2]])
    assert_nd(batch, [[1, 2, 3, 4], [4, 5, 6, 0], [8, 2, 0, 0]], dtype=np.float32)
    assert_nd(length, [4, 3, 2], dtype=np.int32)


def test_pad_axis_1_with_pad_val():
    # gluon-nlp's example: numpy samples keep their dtype.
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = np.array([[5, 8], [1, 2]])
    expected = [[[1, 2, 3, 4], [5, 6, 7, 8]], [[5, 8, -1, -1], [1, 2, -1, -1]]]
    assert_nd(Pad(axis=1, pad_val=-1)([a, b]), expected)
    assert_nd(Pad(axis=-1, pad_val=-1)([a, b]), expected)


def test_pad_axis_0_of_3d_samples():
    rng = np.random.default_rng(0)
    arrays = [rng.random((n, 8, 5)).astype(np.float32) for n in (10, 6, 3)]
    out = Pad(pad_val=7)(arrays)
    assert out.shape == (3, 10, 8, 5)
    assert_nd(out, reference_pad(arrays, 0, 7, np.float32))


def test_pad_middle_axis_with_lengths():
    arrays = [np.ones((2, n, 3), dtype=np.int32) * n for n in (1, 4, 0, 2)]
    out, length = Pad(pad_val=0, axis=1, ret_length=True)(arrays)
    assert_nd(out, reference_pad(arrays, 1, 0, np.int32))
    assert_nd(length, [1, 4, 0, 2], dtype=np.int32)


@pytest.mark.parametrize(
    "lengths, round_to, size",
    [((5, 2), 4, 8), ((8, 3), 4, 8), ((5, 2), 1, 5), ((1,), 16, 16), ((0, 0), 8, 0)],
)
def test_pad_round_to(lengths, round_to, size):
    arrays = [np.arange(n, dtype=np.int64) + 1 for n in lengths]
    out, length = Pad(pad_val=0, round_to=round_to, ret_length=True)(arrays)
    assert out.shape == (len(lengths), size)
    assert_nd(out, reference_pad(arrays, 0, 0, np.int64, round_to))
    assert_nd(length, lengths, dtype=np.int32)


def test_pad_dtype_and_float_pad_val():
    out = Pad(pad_val=0.5, dtype="float16")([np.array([1, 2, 3]), np.array([4])])
    assert_nd(out, [[1, 2, 3], [4, 0.5, 0.5]], dtype=np.float16)


def test_pad_ndarray_samples_keep_their_dtype():
    with pytest.warns(UserWarning, match="padding MXNet arrays is several times slower"):
        out, length = Pad(pad_val=0, ret_length=True)([mx.nd.array([1, 2, 3]), mx.nd.array([4])])
    assert_nd(out, [[1, 2, 3], [4, 0, 0]], dtype=np.float32)
    assert_nd(length, [3, 1], dtype=np.int32)


def test_pad_equal_lengths_need_no_padding():
    arrays = [np.arange(3.0), np.arange(3.0) + 1]
    assert_nd(Pad(pad_val=9)(arrays), np.stack(arrays))


def test_pad_matches_reference_on_random_samples():
    rng = np.random.default_rng(7)
    for _ in range(100):
        ndim = int(rng.integers(1, 4))
        axis = int(rng.integers(-ndim, ndim))
        base = [int(s) for s in rng.integers(1, 4, size=ndim)]
        dtype = str(rng.choice(["float32", "int64", "uint8", "float64"]))
        arrays = []
        for _ in range(int(rng.integers(1, 6))):
            shape = list(base)
            shape[axis] = int(rng.integers(0, 6))
            arrays.append(_values(rng, dtype, tuple(shape)))
        pad_val = int(rng.integers(0, 10))
        round_to = [None, 1, 3][int(rng.integers(3))]
        out, length = Pad(axis=axis, pad_val=pad_val, ret_length=True, round_to=round_to)(arrays)
        assert_nd(out, reference_pad(arrays, axis, pad_val, dtype, round_to))
        assert_nd(length, [a.shape[axis] for a in arrays], dtype=np.int32)


def test_pad_rejects_samples_that_differ_on_another_axis():
    message = (
        "Cannot pad the sample at batch position 2, of shape (3, 5), to the one at batch "
        "position 0, of shape (2, 4).\nPad: only axis 0 of the samples may differ; make the "
        "other axes one size in the dataset, or pad another axis with Pad(axis=...)."
    )
    with pytest.raises(batchify.BatchifyShapeError) as info:
        Pad(pad_val=0)([np.zeros((2, 4)), np.zeros((1, 4)), np.zeros((3, 5))])
    assert str(info.value) == message
    with pytest.raises(ValueError, match=re.escape("batch position 1, of shape (2, 4, 1)")):
        Pad(pad_val=0)([np.zeros((2, 4)), np.zeros((2, 4, 1))])


def test_pad_axis_out_of_range():
    with pytest.raises(ValueError, match=re.escape("Pad: axis 2 is out of range for samples of")):
        Pad(pad_val=0, axis=2)([np.zeros((2, 3)), np.zeros((2, 3))])
    with pytest.raises(ValueError, match="out of range"):
        Pad(pad_val=0)([1, 2])


def test_pad_rejects_non_numeric_samples_and_empty_batches():
    with pytest.raises(TypeError, match="Pad: cannot pad samples that are not numbers"):
        Pad(pad_val=0)([["a", "b"], ["c"]])
    with pytest.raises(ValueError, match="empty batch"):
        Pad(pad_val=0)([])


# ----------------------------------------------------------------------------------------------
# Tuple, List, Dict, NamedTuple


def test_tuple_applies_one_function_per_field():
    data = [([1, 2, 3, 4], 0), ([5, 7], 1)]
    for fn in (
        Tuple(Pad(pad_val=0), Stack()),
        Tuple([Pad(pad_val=0), Stack()]),
        Tuple((Pad(pad_val=0), Stack())),
    ):
        out = fn(data)
        assert type(out) is tuple and len(out) == 2
        assert_nd(out[0], [[1, 2, 3, 4], [5, 7, 0, 0]], dtype=np.float32)
        assert_nd(out[1], [0, 1])


def test_tuple_passes_lists_and_nests():
    seen = []
    out = Tuple(lambda field: seen.append(field) or len(field), Tuple(List(), Stack()))(
        [("x", ("a", 1)), ("y", ("b", 2))]
    )
    assert seen == [["x", "y"]]
    assert out[0] == 2
    assert out[1][0] == ["a", "b"]
    assert_nd(out[1][1], [1, 2])


def test_tuple_accepts_list_samples():
    out = Tuple(Stack(), List())([[1, "a"], [2, "b"]])
    assert_nd(out[0], [1, 2])
    assert out[1] == ["a", "b"]


def test_tuple_checks_the_number_of_fields():
    with pytest.raises(ValueError, match=r"Tuple: sample 1 has 3 fields, expected 2"):
        Tuple(Stack(), Stack())([(1, 2), (1, 2, 3)])
    with pytest.raises(TypeError, match=r"Tuple: sample 0 must be a tuple or list of 2 fields"):
        Tuple(Stack(), Stack())([1, 2])


def test_list_returns_the_samples_unchanged():
    samples = ("a", None, {"k": 1}, np.zeros(2))
    out = List()(samples)
    assert type(out) is list
    assert len(out) == len(samples) and all(a is b for a, b in zip(out, samples))


def test_dict_applies_one_function_per_key():
    data = [
        {"data": [1, 2, 3, 4], "label": 0, "ignored": "x"},
        {"data": [5, 7], "label": 1, "ignored": "y"},
        {"data": [1, 2, 3, 4, 5, 6, 7], "label": 0, "ignored": "z"},
    ]
    out = Dict({"data": Pad(pad_val=0), "label": Stack()})(data)
    assert list(out) == ["data", "label"]
    assert_nd(
        out["data"],
        [[1, 2, 3, 4, 0, 0, 0], [5, 7, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]],
        dtype=np.float32,
    )
    assert_nd(out["label"], [0, 1, 0])


def test_dict_checks_its_samples():
    fn = Dict({"data": Stack(), "label": Stack()})
    with pytest.raises(ValueError, match=r"Dict: sample 1 lacks the keys \['label'\]"):
        fn([{"data": 1, "label": 2}, {"data": 1}])
    with pytest.raises(TypeError, match=r"Dict: sample 0 must be a dict, got"):
        fn([(1, 2)])


def test_namedtuple_with_dict_or_list_of_functions():
    data = [Sample([1, 2, 3, 4], 0), Sample([5, 7], 1), Sample([1, 2, 3, 4, 5, 6, 7], 0)]
    for fn in (
        NamedTuple(Sample, {"label": Stack(), "data": Pad(pad_val=0)}),
        NamedTuple(Sample, [Pad(pad_val=0), Stack()]),
    ):
        out = fn(data)
        assert type(out) is Sample
        assert out.data.shape == (3, 7)
        assert_nd(out.label, [0, 1, 0])


def test_namedtuple_checks_the_sample_type():
    with pytest.raises(TypeError, match=r"NamedTuple: sample 1 must be a Sample, got"):
        NamedTuple(Sample, [Stack(), Stack()])([Sample(1, 2), Other(1, 2)])
    # gluon-nlp raises ValueError here: code written for it catches that.
    with pytest.raises(ValueError, match=r"NamedTuple: sample 0 must be a Sample, got"):
        NamedTuple(Sample, [Stack(), Stack()])([Other(1, 2)])
    with pytest.raises(ValueError, match="empty batch"):
        NamedTuple(Sample, [Stack(), Stack()])([])


# ----------------------------------------------------------------------------------------------
# Configuration errors, raised in __init__


@pytest.mark.parametrize(
    "make, error, pattern",
    [
        (lambda: Stack(dtype="no such dtype"), TypeError, r"Stack: dtype must be None or a numpy"),
        (lambda: Stack(dtype="complex64"), ValueError, r"Stack: dtype must be None or one of .*"),
        (
            lambda: Stack(dtype=object),
            ValueError,
            r"float64 \(the dtypes this MXNet's arrays hold\)",
        ),
        (
            lambda: Pad(pad_val=0, axis=1.5),
            TypeError,
            r"Pad: axis must be an int, got 1.5 \(float\)",
        ),
        (
            lambda: Pad(pad_val=0, axis=True),
            TypeError,
            r"Pad: axis must be an int, got True \(bool\)",
        ),
        (
            lambda: Pad(pad_val="0"),
            TypeError,
            r"Pad: pad_val must be None, an int or a float, got '0'",
        ),
        (
            lambda: Pad(pad_val=0, ret_length=1),
            TypeError,
            r"Pad: ret_length must be True or False, got 1",
        ),
        (
            lambda: Pad(pad_val=0, round_to=0),
            ValueError,
            r"Pad: round_to must be None or a positive int",
        ),
        (
            lambda: Pad(pad_val=0, round_to=2.0),
            TypeError,
            r"Pad: round_to must be None or a positive int",
        ),
        (
            lambda: Pad(pad_val=0, dtype="complex64"),
            ValueError,
            r"Pad: dtype must be None or one of bool",
        ),
        (lambda: Tuple([Stack()], Stack()), ValueError, r"Tuple: pass the functions as"),
        (lambda: Tuple([]), ValueError, r"Tuple: needs at least one batchify function"),
        (lambda: Tuple(Stack(), 3), TypeError, r"Tuple: fn\[1\] must be a callable .* got 3"),
        (lambda: Dict([Stack()]), TypeError, r"Dict: fn_dict must be a dict"),
        (lambda: Dict({"a": "b"}), TypeError, r"Dict: fn_dict\['a'\] must be a callable"),
        (lambda: NamedTuple(tuple, []), TypeError, r"NamedTuple: container must be a namedtuple"),
        (lambda: NamedTuple(Sample, [Stack()]), ValueError, r"must have 2 functions.*got 1"),
        (
            lambda: NamedTuple(Sample, {"data": Stack()}),
            ValueError,
            r"missing \['label'\], unknown \[\]",
        ),
        (
            lambda: NamedTuple(Sample, {"data": Stack(), "label": Stack(), "x": Stack()}),
            ValueError,
            r"missing \[\], unknown \['x'\]",
        ),
        (lambda: NamedTuple(Sample, Stack()), TypeError, r"fn_info must be a list, tuple or dict"),
        (
            lambda: NamedTuple(Sample, [Stack(), None]),
            TypeError,
            r"fn_info\['label'\] must be a callable",
        ),
    ],
)
def test_configuration_errors(make, error, pattern):
    with pytest.raises(error, match=pattern):
        make()


# Where gluon-nlp 0.10.0 raises ValueError for a wrong type, shardloader raises an error that is
# both a TypeError and a ValueError, so that `except ValueError` written for gluon-nlp works.
GLUONNLP_VALUE_ERRORS = {
    "dict_not_a_dict": (lambda bf: bf.Dict([bf.Stack()]), None),
    "dict_function_not_callable": (lambda bf: bf.Dict({"a": "b"}), None),
    "namedtuple_list_function_not_callable": (
        lambda bf: bf.NamedTuple(Sample, [bf.Stack(), 3]),
        None,
    ),
    "namedtuple_dict_function_not_callable": (
        lambda bf: bf.NamedTuple(Sample, {"data": bf.Stack(), "label": None}),
        None,
    ),
    "namedtuple_sample_of_another_type": (
        lambda bf: bf.NamedTuple(Sample, [bf.Stack(), bf.Stack()]),
        [Other(1, 2), Other(3, 4)],
    ),
}


def _raise_gluonnlp_case(module, case):
    make, samples = GLUONNLP_VALUE_ERRORS[case]
    fn = make(module)
    if samples is not None:
        fn(samples)


@pytest.mark.parametrize("case", list(GLUONNLP_VALUE_ERRORS))
def test_wrong_types_raise_an_error_that_gluonnlp_code_catches(case):
    with pytest.raises(ValueError) as info:
        _raise_gluonnlp_case(batchify, case)
    assert isinstance(info.value, TypeError)
    assert type(info.value) is batchify.BatchifyTypeError


@pytest.mark.parametrize("case", list(GLUONNLP_VALUE_ERRORS))
def test_gluonnlp_raises_value_error_in_the_same_cases(case):
    gluonnlp_batchify = pytest.importorskip("gluonnlp.data.batchify")
    with pytest.raises(ValueError):
        _raise_gluonnlp_case(gluonnlp_batchify, case)


def test_accepted_configurations():
    Stack(dtype=np.float32)
    Stack(dtype="int8")
    Pad(axis=np.int64(-1), pad_val=np.float32(0.5), ret_length=np.bool_(True), round_to=8)
    Tuple(lambda x: x)
    NamedTuple(Sample, (Stack(), List()))


def test_functions_pickle_and_repr():
    fns = [
        Stack(dtype="float16"),
        Pad(axis=1, pad_val=-1, ret_length=True, dtype="int32", round_to=4),
        Tuple(Stack(), List()),
        List(),
        Dict({"a": Stack()}),
        NamedTuple(Sample, [Stack(), Stack()]),
    ]
    for fn in fns:
        clone = pickle.loads(pickle.dumps(fn))
        assert repr(clone) == repr(fn)
    assert repr(fns[1]) == "Pad(axis=1, pad_val=-1, ret_length=True, dtype='int32', round_to=4)"
    out = pickle.loads(pickle.dumps(fns[5]))([Sample(1, 2), Sample(3, 4)])
    assert_nd(out.data, [1, 3])


# ----------------------------------------------------------------------------------------------
# MXNet 2.x's batchify functions: Group, AsList, Append, and its Stack and Pad


def test_group_is_tuple_by_its_2x_name():
    tokens, words = Group(Pad(pad_val=0), AsList())([([1, 2, 3], "a"), ([4], "b")])
    assert_nd(tokens, [[1, 2, 3], [4, 0, 0]], "float32")
    assert words == ["a", "b"]
    assert type(Group([Stack(), Stack()])([(1, 2), (3, 4)])) is tuple
    assert repr(Group(Stack(), AsList())) == "Group(Stack(dtype=None), AsList())"
    with pytest.raises(ValueError, match="Group: sample 1 has 3 fields, expected 2"):
        Group(Stack(), Stack())([(1, 2), (3, 4, 5)])
    with pytest.raises(batchify.BatchifyTypeError, match=r"Group: fn\[1\] must be a callable"):
        Group(Stack(), 3)


def test_append_gives_one_array_per_sample():
    out = Append()([[1, 2, 3], np.arange(2, dtype=np.uint8), ARRAYS.array([5, 6], dtype="int32")])
    assert [type(a) for a in out] == [ARRAY_TYPE] * 3
    assert [a.shape for a in out] == [(1, 3), (1, 2), (1, 2)]
    # Anything but an MXNet array becomes float32, as mx.nd.array makes it.
    assert [str(np.dtype(a.dtype)) for a in out] == ["float32", "float32", "int32"]
    np.testing.assert_array_equal(out[0].asnumpy(), [[1, 2, 3]])
    assert [a.shape for a in Append(expand=False)([[1, 2, 3], [4]])] == [(3,), (1,)]
    assert [a.shape for a in Append(batch_axis=1)([np.zeros((2, 3))])] == [(2, 1, 3)]
    assert [a.shape for a in Append()([7.0])] == [(1,)]
    with pytest.raises(ValueError, match="Append: batch_axis 3 is out of range for sample 0"):
        Append(batch_axis=3)([[1, 2]])
    with pytest.raises(TypeError, match="Append: expand must be True or False"):
        Append(expand="yes")
    assert is_native(Append()) and is_native(Group(Stack(), AsList()))


def test_gluon_equivalent_keeps_what_it_does_not_know():
    assert gluon_equivalent(len) is len
    assert gluon_equivalent(Stack()).__class__ is Stack
    from mxnet.gluon.data.dataloader import default_mp_batchify_fn as gluon_mp

    assert gluon_equivalent(gluon_default_batchify_fn) is default_batchify_fn
    assert gluon_equivalent(gluon_mp) is default_batchify_fn


def _gluon2():
    return pytest.importorskip("mxnet.gluon.data.batchify")


def assert_same_2x(ours, theirs):
    """Same containers, array types, dtypes, shapes, devices and values."""
    assert type(ours) is type(theirs), (type(ours), type(theirs))
    if isinstance(theirs, mx.nd.NDArray):
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape)
        assert where(ours) == where(theirs)
        np.testing.assert_array_equal(ours.asnumpy(), theirs.asnumpy())
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert_same_2x(a, b)
    else:
        assert ours == theirs


STACK_2X_CASES = {
    "ints": [1, 2, 3],
    "floats": [1.0, 2.5],
    "numpy scalars": [np.float16(1), np.float16(2)],
    "bools": [True, False],
    "numpy arrays": [np.zeros((2, 2), "uint8"), np.ones((2, 2), "uint8")],
    "lists are fields": [[1, 2.5, 3], [4, 5.5, 6]],
    "tuples": [(np.zeros(2), 1), (np.ones(2), 2)],
    "nested": [([1, 2], 3), ([4, 5], 6)],
    "mx arrays": lambda: [mx.np.zeros((2,)), mx.np.ones((2,))],
}
PAD_2X_CASES = {
    "ragged ints": ([[1, 2, 3], [4]], {}),
    "ragged floats": ([[1.0, 2.0], [3.0]], dict(val=-1)),
    "first sample's dtype": ([np.arange(3, dtype="int32"), np.arange(1, dtype="int64")], {}),
    "every axis": ([np.ones((2, 3)), np.ones((1, 4))], dict(val=7)),
    "round_to every axis": ([np.ones((2, 3)), np.ones((1, 4))], dict(val=-1, round_to=4)),
    "dtype": ([[1, 2, 3], [4]], dict(dtype="float16", round_to=2)),
    "mx arrays": (lambda: [mx.np.ones((3,)), mx.np.ones((1,))], {}),
}


@requires_mx2("mxnet.gluon.data.batchify, new in 2.x")
@pytest.mark.filterwarnings("ignore:Using Pad with NDArrays is discouraged")
def test_2x_stack_pad_group_and_aslist_give_gluons_batches():
    gluon = _gluon2()
    for name, data in STACK_2X_CASES.items():
        data = data() if callable(data) else data
        ours = gluon_equivalent(gluon.Stack())
        assert is_native(ours), name
        assert_same_2x(ours(data), gluon.Stack()(data))
    for data, kwargs in PAD_2X_CASES.values():
        data = data() if callable(data) else data
        assert_same_2x(gluon_equivalent(gluon.Pad(**kwargs))(data), gluon.Pad(**kwargs)(data))
    group = gluon.Group(gluon.Pad(val=-1), gluon.Stack(), gluon.AsList())
    data = [([1, 2, 3], 0, "a"), ([4], 1, "b")]
    ours = gluon_equivalent(group)
    assert type(ours) is Group and is_native(ours)
    assert_same_2x(ours(data), group(data))
    # A user's function inside a Group stays the user's (and the Group not native).
    mixed = gluon_equivalent(gluon.Group(gluon.Stack(), len))
    assert mixed._fns[1] is len and not is_native(mixed)


@requires_mx2("mxnet.gluon.data.batchify, new in 2.x")
def test_2x_append_gives_gluons_arrays_in_legacy_mode():
    """2.0.0b1's Append works only without numpy semantics (it looks for mx.np.NDArray)."""
    gluon = _gluon2()
    before = _alloc.numpy_flags()
    mx.npx.reset_np()
    try:
        for data in ([[1, 2, 3], [4, 5]], [np.arange(2), np.arange(3)], [mx.nd.ones((2,))]):
            for kwargs in ({}, {"expand": False}, {"batch_axis": 1}):
                ours = gluon_equivalent(gluon.Append(**kwargs))
                assert_same_2x(ours(data), gluon.Append(**kwargs)(data))
    finally:
        _alloc.set_numpy_flags(before)


@requires_mx2("Gluon 2.x's Stack, which refuses legacy mx.nd samples under numpy semantics")
def test_2x_stack_takes_legacy_ndarray_samples_too():
    gluon = _gluon2()
    samples = [mx.nd.ones((2,)), mx.nd.zeros((2,))]
    with pytest.raises(KeyError):
        gluon.Stack()(samples)  # Gluon's own: np.asarray over legacy arrays
    out = gluon_equivalent(gluon.Stack())(samples)
    assert type(out) is mx.np.ndarray and out.asnumpy().tolist() == [[1, 1], [0, 0]]


def test_2x_pad_checks_its_input():
    from shardloader.batchify import _PadEveryAxis

    with pytest.raises(TypeError, match="Pad: sample 0 must be an array or a list"):
        _PadEveryAxis()([(1, 2), (3, 4)])
    with pytest.raises(ValueError, match="Pad: sample 1 has 2 dimensions"):
        _PadEveryAxis()([np.ones(2), np.ones((2, 2))])
    with pytest.raises(ValueError, match="round_to must be None or a positive int, got 0"):
        _PadEveryAxis(round_to=0)


# ----------------------------------------------------------------------------------------------
# Raw mode: a worker's allocator, numpy results, no extra copy


def assert_from(array, alloc, index):
    """``array`` is exactly the ``index``-th buffer ``alloc`` handed out, inside its arena."""
    assert type(array) is np.ndarray
    assert array is alloc.buffers[index]
    assert np.shares_memory(array, alloc.arena)


def test_raw_default_batchify(raw_alloc):
    data = [(np.full(64, i, np.float32), i) for i in range(32)]
    out = default_batchify_fn(data)
    assert type(out) is list
    assert len(raw_alloc.buffers) == 2
    assert_from(out[0], raw_alloc, 0)
    assert_from(out[1], raw_alloc, 1)
    np.testing.assert_array_equal(out[0], np.stack([d[0] for d in data]))
    np.testing.assert_array_equal(out[1], np.arange(32))
    assert out[1].dtype == np.int64


def test_raw_default_batchify_ndarray_samples(raw_alloc):
    samples = [mx.nd.ones((2, 2), dtype="int32"), mx.nd.zeros((2, 2), dtype="int32")]
    out = default_batchify_fn(samples)
    assert_from(out, raw_alloc, 0)
    assert out.dtype == np.int32 and out.shape == (2, 2, 2)


def test_raw_default_batchify_nested(raw_alloc):
    out = default_batchify_fn(
        [{"s": Sample(np.zeros(2), 1.0), "w": "a"}, {"s": Sample(np.ones(2), 2.0), "w": "b"}]
    )
    assert type(out["s"]) is Sample
    assert_from(out["s"].data, raw_alloc, 0)
    assert_from(out["s"].label, raw_alloc, 1)
    assert out["w"] == ["a", "b"]
    assert len(raw_alloc.buffers) == 2


def test_raw_stack(raw_alloc):
    out = Stack(dtype="float16")([np.arange(3), np.arange(3)])
    assert_from(out, raw_alloc, 0)
    assert out.dtype == np.float16


def test_raw_pad_with_lengths(raw_alloc):
    out, length = Pad(pad_val=0, ret_length=True)([np.arange(3), np.arange(1)])
    assert_from(out, raw_alloc, 0)
    assert_from(length, raw_alloc, 1)
    np.testing.assert_array_equal(out, [[0, 1, 2], [0, 0, 0]])
    np.testing.assert_array_equal(length, [3, 1])


def test_raw_tuple_dict_namedtuple(raw_alloc):
    a, b = Tuple(Stack(), Pad(pad_val=0))([(1, [1, 2]), (2, [3])])
    assert_from(a, raw_alloc, 0)
    assert_from(b, raw_alloc, 1)
    d = Dict({"x": Stack()})([{"x": 1.0}, {"x": 2.0}])
    assert_from(d["x"], raw_alloc, 2)
    n = NamedTuple(Sample, [Stack(), Stack()])([Sample(1, 2), Sample(3, 4)])
    assert_from(n.data, raw_alloc, 3)
    assert_from(n.label, raw_alloc, 4)


def test_allocator_without_raw_mode_still_gives_ndarrays():
    alloc = RecordingAllocator()
    with _alloc.allocating(alloc, numpy_out=False):
        out = default_batchify_fn([np.zeros(3, np.float32), np.ones(3, np.float32)])
    assert isinstance(out, mx.nd.NDArray)
    assert len(alloc.buffers) == 1
    np.testing.assert_array_equal(out.asnumpy(), alloc.buffers[0])


def test_normal_mode_after_raw_mode():
    with _alloc.allocating(RecordingAllocator(), numpy_out=True):
        assert type(default_batchify_fn([1, 2])) is np.ndarray
    assert isinstance(default_batchify_fn([1, 2]), mx.nd.NDArray)


# ----------------------------------------------------------------------------------------------
# Documentation


def test_module_doctests():
    # The examples live in the package's modules; they run with the package's names in scope.
    attempted = 0
    modules = [batchify] + [
        importlib.import_module(f"{batchify.__name__}.{info.name}")
        for info in pkgutil.iter_modules(batchify.__path__)
    ]
    for module in modules:
        result = doctest.testmod(
            module, extraglobs=vars(batchify), optionflags=doctest.NORMALIZE_WHITESPACE
        )
        assert result.failed == 0, module.__name__
        attempted += result.attempted
    assert attempted > 0


def test_public_names_have_examples():
    for name in batchify.__all__:
        obj = getattr(batchify, name)
        assert ">>>" in (obj.__doc__ or ""), name
