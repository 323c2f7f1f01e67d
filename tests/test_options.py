"""Every loader option is spelled once: the public signatures (``ShardedDataLoader``'s,
Gluon's, and ``ImageRecordLoader``'s, ImageRecordIter's) agree with the options objects that
hold each option's default and check, and an options object is checked wherever it is made,
so a copy (``dataclasses.replace``, an assignment to one of Gluon's attributes) is refused
what the constructor refuses."""

from __future__ import annotations

import dataclasses
import inspect

import mxnet as mx
import numpy as np
import pytest
from conftest import MX2

from shardloader import ShardedDataLoader, vision
from shardloader._engine.options import LoaderOptions

pytestmark = pytest.mark.timeout(60)

# Options worked out when the options are made, not arguments of the loader.
DERIVED = {"ctx_name"}


def _parameters(func):
    return {
        name: p
        for name, p in inspect.signature(func).parameters.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def test_the_loaders_signature_and_its_options_agree():
    signature = _parameters(ShardedDataLoader.__init__)
    options = _parameters(LoaderOptions)
    assert set(signature) - {"dataset"} == set(options) - DERIVED
    for name, param in signature.items():
        if name != "dataset":
            assert param.default == options[name].default, name
    # Gluon's positional order, then shardloader's keywords
    gluon = ["dataset", "batch_size", "shuffle", "sampler", "last_batch", "batch_sampler",
             "batchify_fn", "num_workers", "pin_memory", "pin_device_id", "prefetch",
             "thread_pool", "timeout"]  # fmt: skip
    assert list(signature)[: len(gluon)] == gluon
    fourteenth = "try_nopython" if MX2 else "auto_reload"
    assert list(signature)[len(gluon)] == fourteenth


def test_the_loader_makes_its_options_from_its_arguments_before_anything_else():
    """``LoaderOptions.from_arguments(locals())`` is the first statement of the loader's
    ``__init__``: a statement above it could rebind an argument, or add a local, that the
    options would then take for what the user passed."""
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(ShardedDataLoader.__init__)))
    body = tree.body[0].body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    first = ast.unparse(body[0])
    assert first == "self._opts = _options.LoaderOptions.from_arguments(locals())", first


def test_the_record_doors_signature_and_its_options_agree():
    from shardloader.image_record import ImageRecordLoader, _DoorOptions

    signature = _parameters(ImageRecordLoader.__init__)
    door, loader = _parameters(_DoorOptions), _parameters(LoaderOptions)
    assert set(door) - {"door"} <= set(signature)
    for name, param in signature.items():
        owner = door if name in door else loader
        assert name in owner, f"{name} is neither the door's option nor the loader's"
        assert param.default == owner[name].default, name
    # the loader's options it takes are the loader's, not spelled again by the door
    assert set(door).isdisjoint(loader)


def _loader(**kwargs):
    return ShardedDataLoader(np.arange(12, dtype="float32"), batch_size=4, **kwargs)


@pytest.mark.parametrize(
    "given, changes, message",
    [
        (dict(sampler=[0, 1, 2]), dict(shuffle=True), "shuffle must not be specified if sampler"),
        (dict(num_parts=2, part_index=1), dict(num_parts=1),
         "part_index must be in [0, num_parts=1)"),
        (dict(num_parts=2), dict(shuffle=True), "num_parts > 1 with shuffle=True needs seed="),
        (dict(ctx=mx.cpu(0)), dict(pin_memory=True), "pin_memory and ctx must not both be given"),
        (dict(), dict(num_workers=-1), "num_workers must be a non-negative int, got -1"),
        (dict(), dict(mxnet_seed="epoch"), "mxnet_seed must be one of 'batch', 'sample'"),
    ],
)  # fmt: skip
def test_a_copy_of_the_options_is_checked_as_the_original(given, changes, message):
    opts = _loader(**given)._opts
    with pytest.raises((ValueError, TypeError)) as info:
        dataclasses.replace(opts, **changes)
    assert message in str(info.value)


def test_assigning_a_gluon_attribute_is_refused_what_the_constructor_refuses():
    """``_pin_memory = True`` on a loader that places its batches with ``ctx``/``device``:
    the constructor refuses the pair; the assignment used to take it."""
    name = "device" if MX2 else "ctx"
    loader = _loader(**{name: mx.cpu(0)})
    with pytest.raises(ValueError, match=f"pin_memory and {name} must not both be given"):
        loader._pin_memory = True
    assert loader._pin_memory is False  # refused: the loader is as it was
    assert [x.asnumpy().tolist() for x in loader][0] == [0, 1, 2, 3]
    loader.close()


def test_a_copy_keeps_the_name_the_placement_was_given_under():
    opts = _loader(device=mx.cpu(0))._opts
    assert dataclasses.replace(opts, timeout=5).ctx_name == "device"
    assert dataclasses.replace(opts, timeout=5).ctx == opts.ctx


def test_a_copy_keeps_canonical_values():
    opts = _loader(shuffle=np.bool_(True), seed=np.int64(3), timeout=7)._opts
    assert (opts.shuffle, opts.seed, opts.timeout, opts.prefetch) == (True, 3, 7.0, 0)
    assert type(opts.seed) is int and type(opts.shuffle) is bool
    assert dataclasses.replace(opts) == opts


@pytest.mark.skipif(not vision.available(), reason="needs shardloader[vision]")
def test_colour_jitters_on_grey_images_are_refused_by_the_jitter(tmp_path):
    """A colour jitter with a 1-channel ``data_shape`` is refused, naming the jitter; a
    flip on grey images is not (it was refused as 'brightness', and a jitter was not)."""
    from test_record_iter_door import write
    from test_vision_fidelity import smooth_image

    rec = write(tmp_path / "r", [smooth_image(20, 24, s) for s in range(4)], [0.0] * 4)
    with pytest.raises(ValueError, match="saturation needs colour images"):
        vision.ImageRecordLoader(rec, data_shape=(1, 8, 8), batch_size=2, saturation=0.4)
    loader = vision.ImageRecordLoader(
        rec, data_shape=(1, 8, 8), batch_size=2, rand_mirror=True, preprocess_threads=0
    )
    with loader:
        assert [tuple(x.shape) for x, _ in loader] == [(2, 1, 8, 8), (2, 1, 8, 8)]
