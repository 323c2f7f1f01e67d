"""``vision.image_record_iter`` and ``ImageRecordLoader`` against ``mx.io.ImageRecordIter``,
argument by argument, on the same ``.rec`` files of real JPEGs: descriptions, shapes, dtypes,
labels (``label_width`` 1 and 3), padding and epoch lengths (``round_batch``), parts; pixels
where the step is deterministic; the distributions of the random steps (Kolmogorov-Smirnov
over 1,500 draws of tiny images) where it is not; and the door's refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from test_vision_fidelity import pil_jpeg, smooth_image

from shardloader import vision

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not vision.available(), reason="needs shardloader[vision]"),
]


def write(path, images, labels):
    rec, idx = str(path) + ".rec", str(path) + ".idx"
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    for i, (image, label) in enumerate(zip(images, labels)):
        header = mx.recordio.IRHeader(0, label, i, 0)
        writer.write_idx(i, mx.recordio.pack(header, pil_jpeg(image, quality=95)))
    writer.close()
    return rec


@pytest.fixture(scope="module")
def recs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("door")
    photos = [smooth_image(40, 48, s) for s in range(10)]
    grey = np.full((16, 16, 3), 128, np.uint8)
    halves = np.full((16, 16, 3), 64, np.uint8)
    halves[:, 8:] = 192
    ramp = np.zeros((64, 64, 3), np.uint8)
    ramp[:, :, 0] = np.linspace(0, 255, 64)[None, :]  # red says x
    ramp[:, :, 1] = np.linspace(0, 255, 64)[:, None]  # green says y
    return {
        "one": write(folder / "one", photos, [float(i) for i in range(10)]),
        "three": write(folder / "three", photos, [[i, 10.0 + i, 20.0 + i] for i in range(10)]),
        "grey": write(folder / "grey", [grey] * 100, [0.0] * 100),
        "halves": write(folder / "halves", [halves] * 100, [0.0] * 100),
        "ramp": write(folder / "ramp", [ramp] * 100, [0.0] * 100),
    }


def epochs(it, count):
    """Every epoch of a DataIter: a list per epoch of (data, label, pad) numpy batches."""
    out = []
    for _ in range(count):
        out.append([(b.data[0].asnumpy(), b.label[0].asnumpy(), b.pad) for b in it])
        it.reset()
    return out


def both(rec, **kwargs):
    """(ImageRecordIter, image_record_iter) over ``rec`` with the same arguments."""
    theirs = mx.io.ImageRecordIter(path_imgrec=rec, path_imgidx=rec[:-3] + "idx", **kwargs)
    ours = vision.image_record_iter(path_imgrec=rec, preprocess_threads=0, **kwargs)
    return theirs, ours


# -- descriptions, labels, padding, epochs ----------------------------------------------------


@pytest.mark.parametrize("width", [1, 3])
@pytest.mark.parametrize("round_batch", [True, False])
def test_descriptions_labels_and_padding_agree(recs, width, round_batch):
    rec = recs["one" if width == 1 else "three"]
    kwargs = dict(data_shape=(3, 32, 32), batch_size=4, label_width=width)
    theirs, ours = both(rec, round_batch=round_batch, data_name="img", label_name="y", **kwargs)
    assert ours.provide_data == theirs.provide_data
    assert ours.provide_label == theirs.provide_label
    a, b = epochs(theirs, 2), epochs(ours, 2)
    assert len(b[0]) == len(a[0]) == 3  # ceil(10 / 4)
    for (x, y, _), (u, v, our_pad) in zip(a[0], b[0]):
        assert (u.shape, u.dtype, v.shape, v.dtype) == (x.shape, x.dtype, y.shape, y.dtype)
        rows = len(v) - our_pad
        np.testing.assert_array_equal(v[:rows], y[:rows])  # the real records' labels
    # the last batch: ImageRecordIter pads 2 rows with round_batch (reports 0 without, its
    # filler undefined); ours always reports its 2 filler rows
    assert [p for *_, p in a[0]] == [0, 0, 2 if round_batch else 0]
    assert [p for *_, p in b[0]] == [0, 0, 2]
    # ImageRecordIter's next epoch after a wrap is one batch shorter; ours keeps its length
    assert len(b[1]) == 3 and len(a[1]) == (2 if round_batch else 3)


def test_the_gluon_loop_door_has_image_record_iters_label_shapes(recs):
    for rec, shape in ((recs["one"], (4,)), (recs["three"], (4, 3))):
        width = shape[-1] if len(shape) == 2 else 1
        loader = vision.ImageRecordLoader(
            rec, data_shape=(3, 16, 16), batch_size=4, label_width=width, preprocess_threads=0
        )
        with loader:
            assert [tuple(label.shape) for _, label in loader][0] == shape


def test_a_record_with_another_label_count_is_refused_by_name(recs):
    loader = vision.ImageRecordLoader(
        recs["three"], data_shape=(3, 16, 16), batch_size=4, preprocess_threads=0
    )
    with loader, pytest.raises(Exception, match="holds 3 labels but label_width=1"):
        next(iter(loader))


def test_round_batch_in_the_gluon_loop_keeps_every_batch_full(recs):
    sizes = {}
    for round_batch in (True, False):
        loader = vision.ImageRecordLoader(
            recs["one"], data_shape=(3, 16, 16), batch_size=4, round_batch=round_batch,
            preprocess_threads=0,
        )  # fmt: skip
        with loader:
            sizes[round_batch] = [[len(x) for x, _ in loader] for _ in range(2)]
    assert sizes[True] == [[4, 4], [4, 4, 4]]  # 2 records roll over to the next epoch
    assert sizes[False] == [[4, 4, 2], [4, 4, 2]]


def test_parts_are_contiguous_and_cover_the_file_as_image_record_iters(recs):
    def labels(make):
        return [
            [float(v) for b in make(k) for v in b.label[0].asnumpy()[: 4 - b.pad]] for k in range(3)
        ]

    common = dict(data_shape=(3, 16, 16), batch_size=4, num_parts=3)
    theirs = labels(lambda k: both(recs["one"], part_index=k, **common)[0])
    ours = labels(lambda k: both(recs["one"], part_index=k, **common)[1])
    for parts in (theirs, ours):
        assert sum(parts, []) == [float(i) for i in range(10)]  # in order, each record once
    assert [len(p) for p in ours] == [4, 3, 3]  # ImageRecordIter splits by bytes: 4, 4, 2


# -- pixels where the step is deterministic ---------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(data_shape=(3, 32, 40)),  # the centre crop
        dict(data_shape=(3, 24, 24), resize=30, inter_method=1),
        dict(data_shape=(3, 24, 24), resize=30, inter_method=0),
        dict(data_shape=(3, 24, 24), resize=30, inter_method=3),
        dict(data_shape=(3, 24, 24), resize=30, inter_method=9),  # by the sizes: area
        dict(
            data_shape=(3, 32, 32), mean_r=124, mean_g=117, mean_b=104, std_r=58, std_g=57, std_b=57
        ),  # fmt: skip
        dict(data_shape=(3, 32, 32), dtype="uint8"),
        dict(data_shape=(3, 32, 32), dtype="int8"),  # saturates: 127 for pixels above
        dict(data_shape=(3, 32, 32), dtype="int8", mean_r=124, mean_g=117, mean_b=104, std_r=58),
    ],
)
def test_deterministic_pixels_agree(recs, kwargs):
    theirs, ours = both(recs["one"], batch_size=5, **kwargs)
    assert ours.provide_data == theirs.provide_data
    for (x, _, _), (u, _, _) in zip(epochs(theirs, 1)[0], epochs(ours, 1)[0]):
        assert u.dtype == x.dtype
        # one uint8 level, in the output's units (int8 does not apply the std)
        level = 1.0 if kwargs.get("dtype") == "int8" else 1.0 / kwargs.get("std_r", 1.0)
        diff = np.abs(u.astype(np.float32) - x.astype(np.float32))
        assert diff.max() <= level + 1e-4 and diff.mean() < 0.05 * level


# -- distributions where it is random -------------------------------------------------------


def draws(it, epochs_count, statistic):
    values = []
    for epoch in epochs(it, epochs_count):
        for data, _, pad in epoch:
            values.extend(statistic(image) for image in data[: len(data) - pad])
    return np.array(values)


def same_distribution(rec, statistic, **kwargs):
    """KS test of ``statistic`` (one number or a tuple of them per image) over 1,500 draws
    from each iterator (15 epochs of 100)."""
    stats = pytest.importorskip("scipy.stats")  # in the 1.9.1 test environment
    theirs, ours = both(rec, batch_size=50, seed=1, **kwargs)
    a, b = draws(theirs, 15, statistic), draws(ours, 15, statistic)
    assert len(a) == len(b) == 1500
    for x, y in zip(a.reshape(1500, -1).T, b.reshape(1500, -1).T):
        result = stats.ks_2samp(x, y)
        assert result.pvalue > 1e-3, (result, x.mean(), y.mean(), x.std(), y.std())
        assert x.std() > 0  # the step does draw
    return a, b


def test_brightness_draws_image_record_iters_factors(recs):
    same_distribution(recs["grey"], lambda im: im.mean(), data_shape=(3, 8, 8), brightness=0.4)


def test_contrast_draws_image_record_iters_factors(recs):
    same_distribution(
        recs["halves"], lambda im: im[0, :, 8:].mean() - im[0, :, :8].mean(),
        data_shape=(3, 16, 16), contrast=0.4,
    )  # fmt: skip


def test_pca_noise_draws_image_record_iters_shifts(recs):
    same_distribution(
        recs["grey"], lambda im: tuple(im.mean(axis=(1, 2))), data_shape=(3, 8, 8), pca_noise=0.1
    )


def test_random_resized_crop_draws_image_record_iters_boxes(recs):
    """The ramp's red spans the box's width, its green its height: the two spans' ratio and
    product follow the aspect ratio and the area ImageRecordIter draws. Its aspect ratio is
    uniform in [1, 2] and then inverted half the time (Gluon's is log-uniform, never < 1)."""

    def spans(im):
        return im[0, :, -1].mean() - im[0, :, 0].mean(), im[1, -1].mean() - im[1, 0].mean()

    kwargs = dict(
        data_shape=(3, 16, 16), random_resized_crop=True, min_random_area=0.1,
        max_random_area=0.6, min_aspect_ratio=1.0, max_aspect_ratio=2.0,
    )  # fmt: skip
    same_distribution(
        recs["ramp"],
        lambda im: (np.log(spans(im)[0] / spans(im)[1]), np.prod(spans(im))),
        **kwargs,
    )


def test_rand_crop_and_rand_mirror_draw_as_image_record_iter(recs):
    same_distribution(
        recs["ramp"], lambda im: im[0, 0, 0] + im[1, 0, 0] / 1000,
        data_shape=(3, 40, 40), rand_crop=True,
    )  # fmt: skip
    a, b = same_distribution(
        recs["ramp"], lambda im: float(im[0, 0, 0] > im[0, 0, -1]),
        data_shape=(3, 40, 40), rand_mirror=True,
    )  # fmt: skip
    assert 0.4 < a.mean() < 0.6 and 0.4 < b.mean() < 0.6


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(data_nam="x"), TypeError,
         "image_record_iter() got an unexpected keyword argument 'data_nam'; did you mean "
         "'data_name'? It takes: path_imgrec, path_imgidx, data_shape, batch_size"),
        (dict(max_rotate_angle=10), ValueError,
         "image_record_iter(): max_rotate_angle=10 asks for a random rotation, which "
         "shardloader's fused image path does not run; it takes max_rotate_angle only at 0"),
        (dict(random_h=36), ValueError, "random_h=36 asks for a jitter in HSL space"),
        (dict(max_shear_ratio=0.1), ValueError, "max_shear_ratio=0.1 asks for a random shear"),
        (dict(max_aspect_ratio=0.25), ValueError, "without random_resized_crop=True"),
        (dict(random_resized_crop=True, max_aspect_ratio=4 / 3), ValueError,
         "give min_aspect_ratio= too"),
        (dict(rand_crop=True, random_resized_crop=True), ValueError, "conflicts with rand_crop"),
        (dict(dtype="int32"), ValueError, "ImageRecordIter itself takes float32, uint8 and int8"),
        (dict(inter_method=10), ValueError, "10, a random method per image, is not fused"),
    ],
)  # fmt: skip
def test_the_door_refuses_by_its_own_name(recs, kwargs, error, message):
    with pytest.raises(error) as info:
        vision.image_record_iter(recs["one"], data_shape=(3, 16, 16), batch_size=4, **kwargs)
    assert message in str(info.value)


def test_a_recipes_no_effect_arguments_are_taken(recs):
    """MXNet's recipe passes every augmentation argument, most at values that do nothing."""
    it = vision.image_record_iter(
        recs["one"], data_shape=(3, 16, 16), batch_size=4, max_rotate_angle=0,
        max_shear_ratio=0.0, random_h=0, random_s=0, random_l=0, max_random_scale=1.0,
        min_random_scale=1.0, pad=0, fill_value=127, min_crop_size=-1, max_crop_size=-1,
        verbose=False, preprocess_threads=0,
    )  # fmt: skip
    assert [b.pad for b in it] == [0, 0, 2]


def test_a_dataiter_attribute_on_the_gluon_loop_door_names_dataiter(recs):
    loader = vision.ImageRecordLoader(recs["one"], data_shape=(3, 16, 16), batch_size=4)
    for name in ("provide_data", "provide_label", "reset", "iter_next", "getpad"):
        with pytest.raises(AttributeError, match=r"use loader\.dataiter\(\)"):
            getattr(loader, name)
    with pytest.raises(TypeError, match="ImageRecordLoader.. got an unexpected keyword"):
        vision.ImageRecordLoader(recs["one"], batch_size=4, round_batchh=True)
    loader.close()


def test_a_recipe_is_converted_by_renaming_its_calls_only():
    """``benchmarks.gluoncv_recipe.convert``: the calls renamed, every argument kept."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is no package
    from benchmarks.gluoncv_recipe import convert

    recipe = (
        "import mxnet as mx\n"
        "train = mx.io.ImageRecordIter(path_imgrec=rec, brightness=0.4, pca_noise=0.1)\n"
        "val = mx.io.ImageRecordIter(path_imgrec=val_rec, resize=256)\n"
    )
    assert convert(recipe) == (
        "import mxnet as mx\nfrom shardloader import vision\n"
        "train = vision.image_record_iter(path_imgrec=rec, brightness=0.4, pca_noise=0.1)\n"
        "val = vision.image_record_iter(path_imgrec=val_rec, resize=256)\n"
    )
    with pytest.raises(ValueError, match="expected 'mx.io.ImageRecordIter\\(' calls"):
        convert("import mxnet as mx\n")
