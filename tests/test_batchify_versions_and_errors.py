"""batchify across MXNet versions and gluon-nlp, and its shape errors (issue 22, the third
hostile test, items 12, 14 and 15; issue 24's stacking errors):

- item 12: the dtypes a batch may have follow the installed MXNet (2.x adds int16, uint16,
  uint32 and uint64), in every mode;
- item 14: under 2.x, the batchify objects whose Gluon 2.x equivalent has a C++ handle
  (``__mx_handle__``) have one too, and a loader hands them to Gluon's C++ pipeline;
- item 15: gluon-nlp's ``Pad`` warns when no ``pad_val`` is given, and so does ours;
- issue 24: a stacking error names the dataset index of the odd sample in its first line,
  and says what to do in its second (a resize or crop for images).
"""

from __future__ import annotations

import warnings

import mxnet as mx
import numpy as np
import pytest
from _backends import BACKENDS
from conftest import GLUON_PYTHON, MX2, requires_mx1, requires_mx2
from mxnet.gluon.data import ArrayDataset
from mxnet.gluon.data import DataLoader as GluonDataLoader

from shardloader import ShardedDataLoader, batchify
from shardloader.batchify import Pad, Stack, Tuple, default_batchify_fn, gluon_equivalent

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


@requires_mx2("int16, uint16, uint32 and uint64 arrays, new in 2.x")
@pytest.mark.parametrize(
    "backend",
    [pytest.param(b, marks=pytest.mark.mx2_smoke) for b in ("inline", "thread", "fork")]
    + ["spawn"],  # not in the smoke run: spawned workers take seconds to import MXNet
)
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


# ------------------------------------------------------------------ issue 24: stacking errors


class OddOneOut:
    """Sample i: an array of ``shape``, except sample 5's, whose axis ``axis`` is one longer;
    with a label."""

    def __init__(self, shape, axis=0) -> None:
        self.shape, self.axis = tuple(shape), axis

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        shape = list(self.shape)
        if i == 5:
            shape[self.axis] += 1
        return np.zeros(shape, np.uint8), i


def _stacking_error(dataset, backend, **kwargs):
    """The error a loader over ``dataset`` raises for the batch of indices [7, 2, 5, 0]."""
    kwargs = dict(batch_sampler=[[7, 2, 5, 0]], **BACKENDS[backend], **kwargs)
    with ShardedDataLoader(dataset, **kwargs) as loader, pytest.raises(ValueError) as info:
        next(iter(loader))
    return info.value


def _own_message(error) -> str:
    """The batchify error's own message: all of it inline, its last lines from a worker."""
    text = str(error)
    marker = "BatchifyShapeError: "
    return text[text.rindex(marker) + len(marker) :] if marker in text else text


@pytest.mark.mx2_smoke
@pytest.mark.parametrize("backend", ["inline", "thread", "fork"])
def test_images_of_two_sizes_name_the_dataset_index_and_say_resize_or_crop(backend, no_leaks):
    """Issue 24: "cannot stack sample 1 of shape ..." counted samples by their position in
    the batch and advised Pad, which would frame images in borders. The message names the
    odd image by its dataset index, then says what to do."""
    error = _stacking_error(OddOneOut((32, 40, 3)), backend)
    message = _own_message(error)
    second, first = message.splitlines()
    assert first.startswith("Resize or crop the images to one size in the dataset's transform")
    assert "transforms.Resize((40, 32)) or CenterCrop((40, 32))" in first  # (width, height)
    assert "Pad" not in first
    assert second == (
        "Cannot stack the image (HWC) at dataset index 5, of shape (33, 40, 3), with the one "
        "at dataset index 7, of shape (32, 40, 3): the samples of a batch must have one shape."
    )
    if backend == "inline":  # nothing before it: the problem is the message's first line
        assert str(error).splitlines()[0] == second
        assert error.__context__ is None  # numpy's refusal is not chained onto it


def test_chw_images_are_resized_before_to_tensor(no_leaks):
    message = _own_message(_stacking_error(OddOneOut((3, 24, 16), axis=2), "inline"))
    assert "Resize((16, 24)) or CenterCrop((16, 24)) (sizes are (width, height), before " in (
        message
    )
    assert "the image (CHW) at dataset index 5, of shape (3, 24, 17)" in message


@pytest.mark.parametrize("backend", ["inline", "fork"])
def test_other_samples_of_two_shapes_are_told_to_pad(backend, no_leaks):
    message = _own_message(_stacking_error(OddOneOut((6,)), backend))
    second, first = message.splitlines()
    assert first.startswith("Pad the samples to one shape with batchify_fn=batchify.Pad(")
    assert second.startswith(
        "Cannot stack the sample at dataset index 5, of shape (7,), with the one at dataset "
        "index 7, of shape (6,)"
    )


def test_sharded_steps_name_the_index_in_the_shards_batch(no_leaks):
    dataset = OddOneOut((6,))
    step = [[[0, 1], [7, 5]]]  # a batch sampler of steps: shard 1 holds sample 5
    expected = r"sample at dataset index 5, .* dataset index 7,"
    with ShardedDataLoader(dataset, batch_sampler=step) as loader, pytest.raises(
        ValueError, match=expected
    ):
        next(iter(loader))


def test_a_batchify_function_that_drops_samples_keeps_positions(no_leaks):
    """Stack saw 3 samples of a batch of 4: dataset indices would name the wrong ones."""

    def drop_first(samples):
        return Stack()([data for data, _ in samples[1:]])

    error = _stacking_error(OddOneOut((6,)), "inline", batchify_fn=drop_first)
    assert "the sample at batch position 1, of shape (7,)" in str(error)
    assert "dataset index" not in str(error)


def test_pad_names_the_dataset_index_too(no_leaks):
    fn = Tuple(Pad(axis=0, pad_val=0), Stack())
    error = _stacking_error(OddOneOut((4, 2), axis=1), "inline", batchify_fn=fn)
    assert str(error).startswith("Cannot pad the sample at dataset index 5")
    assert "Pad: only axis 0 of the samples may differ" in str(error)
    assert "the sample at dataset index 5, of shape (4, 3), to the one at dataset index 7" in (
        str(error)
    )


# ------------------------------------------------------------------ item 15: Pad's warnings


def test_pad_without_pad_val_warns_as_gluonnlp_does():
    """Item 15: gluon-nlp's Pad() warns that the padding defaults to 0 (the right value is
    often a vocabulary's padding index); shardloader's was silent."""
    with pytest.warns(UserWarning, match=r"Pad: no pad_val given, so the padding is 0"):
        fn = Pad()
    assert fn([[1, 2], [3]]).asnumpy().tolist() == [[1, 2], [3, 0]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Pad(pad_val=0)
        Pad(axis=0, pad_val=-1, ret_length=True, round_to=2)


def test_pad_warns_once_that_mxnet_arrays_pad_slower():
    """gluon-nlp's test_pad: MXNet array samples. Measured, shardloader's Pad is several
    times slower on them than on numpy arrays (docs/switching.md), so it warns, once per Pad
    as gluon-nlp's does."""
    fn = Pad(pad_val=-1)
    with pytest.warns(UserWarning) as record:
        padded = fn([mx.nd.array([]), mx.nd.arange(1)])
        fn([mx.nd.array([]), mx.nd.arange(1)])
    assert padded.asnumpy().flatten().tolist() == [-1.0, 0.0]
    ours = [str(w.message) for w in record if w.category is UserWarning]
    assert len(ours) == 1 and "padding MXNet arrays is several times slower" in ours[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn = Pad(pad_val=0)
        fn([np.arange(2), np.arange(1)])
        fn([[1, 2], [3]])


@pytest.mark.parametrize("backend", ["inline", "thread", "fork"])
def test_shardloaders_own_paths_raise_no_pad_warning(backend, no_leaks):
    """Neither the default batchify, nor Gluon 2.x's Pad as the loader swaps it, nor a Pad
    with its pad_val, warns: with warnings as errors a loader still loads."""
    data = [(np.arange(n % 3 + 1, dtype="float32"), n) for n in range(8)]
    fns = [Tuple(Pad(pad_val=0), Stack())]
    gluon_batchify = getattr(mx.gluon.data, "batchify", None)
    if gluon_batchify is not None:  # 2.x: its Pad takes val, and pads every axis
        fns.append(gluon_equivalent(gluon_batchify.Group(gluon_batchify.Pad(), Stack())))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in fns:
            with ShardedDataLoader(data, batch_size=4, batchify_fn=fn, **BACKENDS[backend]) as ld:
                assert [b[0].shape for b in ld] == [(4, 3), (4, 3)]
        fixed = [(np.ones(3, "float32"), n) for n in range(8)]
        with ShardedDataLoader(fixed, batch_size=4, **BACKENDS[backend]) as ld:  # the default
            assert len(list(ld)) == 2


# ------------------------------------------------------------------ item 14: C++ handles

# (ours, Gluon 2.x's equivalent, or None where neither has a C++ handle that gives its batches)
HANDLES = {
    "Stack": (lambda: batchify.Stack(), lambda g: g.Stack()),
    "Stack(dtype)": (lambda: batchify.Stack(dtype="float32"), None),
    "Pad": (lambda: batchify.Pad(pad_val=-1), lambda g: g.Pad(val=-1)),
    "Pad(ret_length)": (lambda: batchify.Pad(pad_val=-1, ret_length=True), None),
    "Pad(round_to)": (lambda: batchify.Pad(pad_val=-1, round_to=4), None),
    "Pad(dtype)": (lambda: batchify.Pad(pad_val=-1, dtype="float32"), None),
    "Group": (
        lambda: batchify.Group(batchify.Stack(), batchify.Pad(pad_val=-1)),
        lambda g: g.Group(g.Stack(), g.Pad(val=-1)),
    ),
    "Tuple": (
        lambda: batchify.Tuple(batchify.Stack(), batchify.Stack()),
        lambda g: g.Group(g.Stack(), g.Stack()),
    ),
    # What a loader runs for Gluon 2.x's own Stack and Pad (gluon_equivalent).
    "2.x Stack": (lambda: batchify._FieldStack(), lambda g: g.Stack()),
    "2.x Pad": (lambda: batchify._PadEveryAxis(-1), lambda g: g.Pad(val=-1)),
    "2.x Pad(round_to)": (lambda: batchify._PadEveryAxis(-1, round_to=2), None),
    "Group(AsList)": (lambda: batchify.Group(batchify.Stack(), batchify.AsList()), None),
    "AsList": (lambda: batchify.AsList(), None),
    "Append": (lambda: batchify.Append(), None),
    "Dict": (lambda: batchify.Dict({"x": batchify.Stack()}), None),
}


@pytest.mark.parametrize("name", list(HANDLES))
def test_a_cpp_handle_exists_where_gluon_2x_has_one_that_gives_the_batches(name):
    """Item 14: Gluon 2.x's Stack, Pad and Group expose ``__mx_handle__()`` for its C++
    pipeline; shardloader's had none ('Group' object has no attribute '__mx_handle__')."""
    ours, theirs = HANDLES[name]
    assert hasattr(ours(), "__mx_handle__") is (MX2 and theirs is not None)


@requires_mx2("MXNet 2.x's C++ batchify functions")
@pytest.mark.parametrize("name", [n for n, (_, theirs) in HANDLES.items() if theirs is not None])
def test_the_cpp_handle_batches_as_gluons_own(name):
    from mxnet.gluon.data import batchify as gluon_batchify

    ours, theirs = HANDLES[name]
    ragged = [mx.nd.arange(i % 3 + 1) for i in range(4)]
    rows = [mx.nd.arange(3) + i for i in range(4)]
    samples = {
        "Stack": rows,
        "2.x Stack": rows,
        "Pad": ragged,
        "2.x Pad": ragged,
        "Group": list(zip(rows, ragged)),
        "Tuple": list(zip(rows, rows)),
    }[name]
    got = ours().__mx_handle__()(samples)
    expected = theirs(gluon_batchify).__mx_handle__()(samples)
    assert described(got) == described(expected)


@pytest.mark.mx2_smoke
@requires_mx2("try_nopython and Gluon's C++ pipeline, new in 2.x")
def test_gluons_cpp_pipeline_takes_shardloaders_batchify_functions(no_leaks):
    """With try_nopython=True Gluon 2.x's loader refused shardloader's Group ("batchify_fn -
    fail"); now Gluon's loader and shardloader's both hand it to the C++ pipeline, and the
    batches are those of Gluon's own Group."""
    from mxnet.gluon.data import batchify as gluon_batchify

    data = ArrayDataset(
        np.arange(30, dtype="float32").reshape(10, 3), np.arange(10, dtype="float32")
    )
    kwargs = dict(batch_size=4, num_workers=2, try_nopython=True)
    theirs = GluonDataLoader(
        data,
        batchify_fn=gluon_batchify.Group(gluon_batchify.Stack(), gluon_batchify.Stack()),
        **kwargs,
    )
    expected = [described(b) for b in theirs]
    fn = batchify.Group(batchify.Stack(), batchify.Stack())
    gluon_with_ours = GluonDataLoader(data, batchify_fn=fn, **kwargs)
    assert gluon_with_ours._mx_iter is not None
    assert [described(b) for b in gluon_with_ours] == expected
    with ShardedDataLoader(data, batchify_fn=fn, **kwargs) as loader:
        assert loader._mx_iter is not None
        assert [described(b) for b in loader] == expected
    # Without a C++ counterpart, Gluon's refusal, as for any Python batchify function.
    no_cpp = batchify.Group(batchify.Stack(), batchify.AsList())
    with pytest.raises(RuntimeError, match=r"\[dataset - pass\]\[batchify_fn - fail\]"):
        ShardedDataLoader(data, batchify_fn=no_cpp, **kwargs)
