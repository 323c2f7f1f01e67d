"""shardloader.vision: what ``fuse`` recognises and why it falls back, the random steps'
distributions, seeded reproducibility in every worker kind, images it cannot fuse, every
source of images, ``ImageRecordLoader``'s ImageRecordIter arguments, and the loader's
``fuse_transforms`` option."""

from __future__ import annotations

import math
import os
import sys

import mxnet as mx
import numpy as np
import pytest
from _backends import BACKENDS
from conftest import ARRAYS, MX2, requires_mx1, requires_mx2
from mxnet.gluon.data.vision import transforms as T
from test_vision_fidelity import MEAN, STD, pil_jpeg, smooth_image, write_rec

from shardloader import ShardedDataLoader, vision
from shardloader.recordio import ImageRecordDataset
from shardloader.vision import _codecs

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not vision.available(), reason="needs shardloader[vision]"),
]

# Gluon's transforms as they are: the loader would fuse them by itself.
EXACT = dict(fuse_transforms=False)

W5_CHAIN = lambda: T.Compose(  # noqa: E731 - one shared chain, built fresh per test
    [T.RandomResizedCrop(64), T.RandomFlipLeftRight(), T.ToTensor(), T.Normalize(MEAN, STD)]
)


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    """16 JPEGs of 96x120 in an indexed .rec, label = position."""
    folder = tmp_path_factory.mktemp("vision")
    return write_rec(folder, [pil_jpeg(smooth_image(96, 120, s)) for s in range(16)])


def batches(loader):
    with loader:
        return [[field.asnumpy() for field in batch] for batch in loader]


# -- recognition ------------------------------------------------------------------------------


def test_a_gluon_chain_over_record_datasets_is_fused(rec):
    for base in (ImageRecordDataset(rec), mx.gluon.data.vision.ImageRecordDataset(rec)):
        fusion = vision.fuse(base.transform_first(W5_CHAIN()))
        assert (fusion.path, fusion.reason) == ("fused", None)
        assert [type(s).__name__ for s in fusion.pipeline.steps] == ["RandomResizedCrop", "Flip"]
    bare = vision.fuse(ImageRecordDataset(rec).transform_first(T.RandomResizedCrop(32)))
    assert bare.path == "fused" and bare.pipeline.output == "hwc"


@requires_mx1("Gluon 1.x's default_batchify_fn")
def test_gluons_default_batchify_is_fused(rec):
    fn = mx.gluon.data.dataloader.default_batchify_fn
    fusion = vision.fuse(ImageRecordDataset(rec).transform_first(W5_CHAIN()), fn)
    assert fusion.path == "fused"


@pytest.mark.parametrize(
    "make, batchify_fn, reason",
    [
        (
            lambda r: ImageRecordDataset(r).transform_first(
                T.Compose([T.RandomResizedCrop(32), T.RandomRotation((-10, 10)), T.ToTensor()])
            ),
            None,
            "transform RandomRotation is not fused",
        ),
        (
            lambda r: ImageRecordDataset(r).transform_first(
                T.Compose([T.Resize(32), T.Normalize(0.5, 0.2), T.ToTensor()])
            ),
            None,
            "transform Normalize before ToTensor is not fused",
        ),
        (
            lambda r: ImageRecordDataset(r).transform_first(
                T.Compose([T.ToTensor(), T.Resize(32)])
            ),
            None,
            "transform Resize after ToTensor is not fused",
        ),
        (
            lambda r: ImageRecordDataset(r).transform(lambda x, y: (x, y)),
            None,
            "dataset.transform(fn) is not fused (transform_first(fn) is)",
        ),
        (
            lambda r: ImageRecordDataset(r).transform_first(W5_CHAIN()),
            lambda samples: samples,
            "a custom batchify_fn (<lambda>) expects the transformed samples",
        ),
        (
            lambda r: ImageRecordDataset(r, transform=lambda x, y: (x, y)),
            None,
            "the ImageRecordDataset has a transform= of its own",
        ),
        (
            lambda r: mx.gluon.data.SimpleDataset([1, 2, 3]).transform_first(T.ToTensor()),
            None,
            "the dataset (SimpleDataset) is not an image dataset shardloader can read encoded",
        ),
        (
            lambda r: ImageRecordDataset(r, flag=0).transform_first(
                T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
            ),
            None,
            "the chain's parameters are not fused: mean must have 1 or 1 values for "
            "1-channel images, got 3",
        ),
    ],
)
def test_anything_else_keeps_the_exact_path_and_says_why(rec, make, batchify_fn, reason):
    dataset = make(rec)
    fusion = vision.fuse(dataset, batchify_fn)
    assert (fusion.path, fusion.reason) == ("exact", reason)
    assert fusion.dataset is dataset and fusion.batchify_fn is batchify_fn


def test_without_the_codecs_fuse_says_how_to_install_them(rec, monkeypatch):
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # makes `import simplejpeg` fail
    monkeypatch.setattr(_codecs, "_modules", None)
    assert not vision.available()
    fusion = vision.fuse(ImageRecordDataset(rec).transform_first(W5_CHAIN()))
    assert fusion.path == "exact"
    assert _codecs.INSTALL_HINT in fusion.reason and "shardloader[" not in fusion.reason
    assert "simplejpeg==1.9.0 opencv-python-headless==4.11.0.86" in fusion.reason


# -- random steps -----------------------------------------------------------------------------


def _ks_statistic(a, b) -> float:
    """The two-sample Kolmogorov-Smirnov statistic."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, "right") / len(a)
    cdf_b = np.searchsorted(b, grid, "right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


def _coordinate_image(height: int, width: int) -> np.ndarray:
    """Each pixel holds its own position: red its x, green its y (sizes under 256)."""
    image = np.zeros((height, width, 3), np.uint8)
    image[:, :, 0] = np.arange(width)[None, :]
    image[:, :, 1] = np.arange(height)[:, None]
    return image


def _boxes(crops: np.ndarray) -> np.ndarray:
    """(area, log aspect, x0) of each crop, read from the corners of a nearest-neighbour
    crop of a coordinate image."""
    x0, y0 = crops[:, 0, 0, 0].astype(float), crops[:, 0, 0, 1].astype(float)
    w = crops[:, -1, -1, 0] - x0 + 1
    h = crops[:, -1, -1, 1] - y0 + 1
    return np.stack([w * h, np.log(w / h), x0], axis=1)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "size",
    [
        (200, 250),
        # The 10-try fallback. Gluon 1.x's is the centre crop, as the fused path's; 2.x's C++
        # operator crops the top-left size x size box instead (measured), which the fused
        # path does not copy (docs/vision.md).
        pytest.param((20, 250), marks=requires_mx1("the centre-crop fallback")),
    ],
)
def test_random_resized_crop_follows_gluons_distribution(tmp_path, size):
    """Crops of a coordinate image by Gluon's own RandomResizedCrop and by the fused path,
    from independent seeds: crop area, log aspect ratio and position agree (two-sample KS
    at the 0.1% level)."""
    n, out = 1500, 16
    image = _coordinate_image(*size)
    gluon = T.RandomResizedCrop(out, interpolation=0)
    mx.random.seed(1)
    source = ARRAYS.array(image, dtype="uint8")
    theirs = np.stack([gluon(source).asnumpy() for _ in range(n)])
    rec = write_rec(tmp_path, [_png(image)] * n)  # lossless, so the corners are exact
    dataset = ImageRecordDataset(rec).transform_first(T.RandomResizedCrop(out, interpolation=0))
    fusion = vision.fuse(dataset)
    assert fusion.path == "fused"
    loader = ShardedDataLoader(fusion.dataset, 500, batchify_fn=fusion.batchify_fn, seed=2)
    ours = np.concatenate([x for x, _ in batches(loader)])
    a, b = _boxes(ours), _boxes(theirs)
    critical = 1.95 * math.sqrt(2 / n)
    for column, name in enumerate(("area", "log aspect", "x0")):
        assert _ks_statistic(a[:, column], b[:, column]) < critical, name


def test_flips_have_probability_one_half(tmp_path):
    """Half black, half white images: the left column tells whether each was flipped."""
    image = np.zeros((32, 32, 3), np.uint8)
    image[:, 16:] = 255
    rec = write_rec(tmp_path, [pil_jpeg(image, quality=100)] * 2000)
    fusion = vision.fuse(
        ImageRecordDataset(rec).transform_first(T.Compose([T.RandomFlipLeftRight(), T.ToTensor()]))
    )
    loader = ShardedDataLoader(fusion.dataset, 500, batchify_fn=fusion.batchify_fn, seed=5)
    flipped = np.concatenate([x[:, 0, 16, 0] > 0.5 for x, _ in batches(loader)])
    assert abs(flipped.mean() - 0.5) < 4 * math.sqrt(0.25 / len(flipped))


@pytest.mark.parametrize("backend", ["thread", "fork", "spawn"])
def test_seeded_batches_are_the_same_in_every_worker_kind(rec, backend):
    def run(**kwargs):
        dataset = mx.gluon.data.vision.ImageRecordDataset(rec).transform_first(W5_CHAIN())
        fusion = vision.fuse(dataset)
        return batches(
            ShardedDataLoader(
                fusion.dataset, 5, batchify_fn=fusion.batchify_fn, shuffle=True, seed=11, **kwargs
            )
        )

    inline = run(num_workers=0)
    for other in (run(**BACKENDS[backend]), run(num_workers=1)):
        for a, b in zip(inline, other):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])


# -- images the fused path cannot decode --------------------------------------------------------


def _png(image):
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image).save(out, format="PNG")
    return out.getvalue()


def _cmyk_jpeg(image):
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image).convert("CMYK").save(out, format="JPEG", quality=95)
    return out.getvalue()


def test_png_and_cmyk_take_mxnets_decoder_and_match_the_exact_path(tmp_path):
    image = smooth_image(80, 100, 3)
    payloads = [_png(image), _cmyk_jpeg(image), pil_jpeg(image)]
    assert _codecs.jpeg_size(payloads[1]) is None  # libjpeg-turbo cannot give RGB
    rec = write_rec(tmp_path, payloads)
    chain = T.Compose([T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)])
    dataset = ImageRecordDataset(rec).transform_first(chain)
    fusion = vision.fuse(dataset)
    exact = batches(ShardedDataLoader(dataset, 3, **EXACT))
    fused = batches(ShardedDataLoader(fusion.dataset, 3, batchify_fn=fusion.batchify_fn))
    scale = np.asarray(STD).reshape(1, 3, 1, 1)
    assert (np.abs(exact[0][0] - fused[0][0]) * scale).max() <= 1 / 255 + 1e-6


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_corrupt_bytes_raise_the_exact_paths_error_naming_the_record(tmp_path, backend):
    good = pil_jpeg(smooth_image(80, 100, 4))
    rec = write_rec(tmp_path, [good, b"\xff\xd8\xff\xe0 not a jpeg at all", good])
    dataset = ImageRecordDataset(rec).transform_first(W5_CHAIN())
    fusion = vision.fuse(dataset)
    messages = []
    for data, fn in ((dataset, None), (fusion.dataset, fusion.batchify_fn)):
        with ShardedDataLoader(data, 3, batchify_fn=fn, **EXACT, **BACKENDS[backend]) as loader:
            with pytest.raises(Exception) as info:
                next(iter(loader))
            messages.append(str(info.value))
            # the worker did not crash: the loader still serves the good records
            assert (
                len(batches(ShardedDataLoader(data, 1, batchify_fn=fn, sampler=[0, 2], **EXACT)))
                == 2
            )
    assert "record 1 (key 1" in messages[1] and "not a decodable image" in messages[1]
    assert "RecordIOError" in messages[1] or backend == "inline"
    assert messages[1].split("record 1")[1][:40] == messages[0].split("record 1")[1][:40]


def test_a_damaged_scan_that_mxnet_still_decodes_matches_the_exact_path(tmp_path):
    data = bytearray(pil_jpeg(smooth_image(96, 120, 5)))
    data[len(data) // 2 : len(data) // 2 + 40] = b"\x00" * 40  # damage inside the scan
    rec = write_rec(tmp_path, [bytes(data)])
    chain = T.Compose([T.CenterCrop(64), T.ToTensor()])
    dataset = ImageRecordDataset(rec).transform_first(chain)
    fusion = vision.fuse(dataset)
    exact = batches(ShardedDataLoader(dataset, 1, **EXACT))
    fused = batches(ShardedDataLoader(fusion.dataset, 1, batchify_fn=fusion.batchify_fn))
    assert np.abs(exact[0][0] - fused[0][0]).max() <= 1 / 255 + 1e-6


# -- sources ------------------------------------------------------------------------------------


def _folder(tmp_path, n=6):
    root = tmp_path / "folder"
    for i in range(n):
        klass = root / f"class{i % 2}"
        klass.mkdir(parents=True, exist_ok=True)
        (klass / f"{i}.jpg").write_bytes(pil_jpeg(smooth_image(70, 90, i)))
    return str(root)


def test_image_folder_dataset_is_fused_and_matches(tmp_path):
    dataset = mx.gluon.data.vision.ImageFolderDataset(_folder(tmp_path)).transform_first(
        T.Compose([T.Resize((48, 40)), T.ToTensor()])
    )
    fusion = vision.fuse(dataset)
    assert fusion.path == "fused"
    exact = batches(ShardedDataLoader(dataset, 3, **EXACT))
    fused = batches(ShardedDataLoader(fusion.dataset, 3, batchify_fn=fusion.batchify_fn))
    for a, b in zip(exact, fused):
        assert np.abs(a[0] - b[0]).max() <= 1 / 255 + 1e-6
        np.testing.assert_array_equal(a[1], b[1])


@requires_mx2("Gluon's ImageListDataset")
def test_image_list_dataset_is_fused_and_matches(tmp_path):
    root = _folder(tmp_path)
    files = sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
    )
    base = mx.gluon.data.vision.ImageListDataset(root, [[i, f] for i, f in enumerate(files)])
    dataset = base.transform_first(T.Compose([T.Resize((48, 40)), T.ToTensor()]))
    fusion = vision.fuse(dataset)
    assert fusion.path == "fused", fusion.reason
    exact = batches(ShardedDataLoader(dataset, 3, **EXACT))
    fused = batches(ShardedDataLoader(fusion.dataset, 3, batchify_fn=fusion.batchify_fn))
    for a, b in zip(exact, fused):
        assert np.abs(a[0] - b[0]).max() <= 1 / 255 + 1e-6
        np.testing.assert_array_equal(a[1], b[1])


def test_raw_jpeg_bytes_through_a_pipeline():
    payloads = [pil_jpeg(smooth_image(80, 100, s)) for s in range(4)]
    pipeline = vision.ImagePipeline(48, center_crop=True, mean=MEAN, std=STD)
    bare = vision.fuse(payloads, pipeline=pipeline)
    with ShardedDataLoader(bare.dataset, 4, batchify_fn=bare.batchify_fn) as loader:
        images = next(iter(loader)).asnumpy()
    assert images.shape == (4, 3, 48, 48) and images.dtype == np.float32
    labelled = vision.fuse([(p, np.float32(i)) for i, p in enumerate(payloads)], pipeline=pipeline)
    out = batches(ShardedDataLoader(labelled.dataset, 4, batchify_fn=labelled.batchify_fn))[0]
    np.testing.assert_array_equal(out[0], images)
    expected = T.Compose([T.CenterCrop(48), T.ToTensor(), T.Normalize(MEAN, STD)])(
        mx.image.imdecode(payloads[3])
    ).asnumpy()
    scale = np.asarray(STD).reshape(3, 1, 1)
    assert (np.abs(out[0][3] - expected) * scale).max() <= 1 / 255 + 1e-6
    np.testing.assert_array_equal(out[1], np.arange(4, dtype=np.float32))


# -- ImageRecordLoader ----------------------------------------------------------------------------


def test_image_record_loader_means_what_image_record_iter_means(rec):
    """Centre crop and mean/std in pixel units: ``(pixel - mean) / std``, no 1/255."""
    mean, std = (123.0, 117.0, 104.0), (58.0, 57.0, 57.0)
    loader = vision.ImageRecordLoader(
        rec,
        data_shape=(3, 64, 80),
        batch_size=4,
        preprocess_threads=0,
        mean_r=mean[0],
        mean_g=mean[1],
        mean_b=mean[2],
        std_r=std[0],
        std_g=std[1],
        std_b=std[2],
    )
    data, label = batches(loader)[0]
    image = mx.image.imdecode(mx.recordio.unpack(mx.recordio.MXRecordIO(rec, "r").read())[1])
    pixels = mx.image.center_crop(image, (80, 64), interp=1)[0].asnumpy().astype(np.float32)
    expected = ((pixels - np.float32(mean)) / np.float32(std)).transpose(2, 0, 1)
    np.testing.assert_allclose(data[0], expected, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(label, np.arange(4, dtype=np.float32))


def test_image_record_loader_augments_and_gives_a_dataiter(rec):
    kwargs = dict(
        data_shape=(3, 32, 32),
        batch_size=6,
        random_resized_crop=True,
        min_random_area=0.2,
        min_aspect_ratio=3 / 4,
        max_aspect_ratio=4 / 3,
        rand_mirror=True,
        shuffle=True,
        seed=3,
        preprocess_threads=2,
    )
    loader = vision.ImageRecordLoader(rec, **kwargs)
    assert loader.pipeline.steps[0].ratio == pytest.approx((3 / 4, 4 / 3))
    first = batches(loader)
    again = batches(vision.ImageRecordLoader(rec, thread_pool=True, **kwargs))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a[0], b[0])
    it = vision.image_record_iter(rec, **kwargs)
    assert it.provide_data[0].shape == (6, 3, 32, 32)
    assert it.provide_label[0].name == "softmax_label"
    pads = [batch.pad for batch in it]
    assert pads == [0, 0, 2]
    it.close()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(data_shape=(2, 8, 8)), "data_shape must be (channels, height, width) with 1 or 3"),
        (dict(output="float16"), "one of 'float32', 'uint8', 'device', got 'float16'"),
        (dict(rand_mirror="yes"), "rand_mirror"),  # 0 and 1 are bools, as in Gluon
        (dict(max_aspect_ratio=-1.0, random_resized_crop=True), "max_aspect_ratio must be >= 0"),
        (dict(inter_method=7), "inter_method must be one of 0, 1, 2, 3, 4 or 9, got 7"),
    ],
)
def test_image_record_loader_errors_name_the_argument(rec, kwargs, message):
    with pytest.raises((ValueError, TypeError)) as info:
        vision.ImageRecordLoader(rec, batch_size=2, **kwargs)
    assert message in str(info.value)


def test_grey_image_record_loader(rec):
    loader = vision.ImageRecordLoader(
        rec, data_shape=(1, 40, 40), batch_size=4, preprocess_threads=0, output="uint8"
    )
    data, _ = batches(loader)[0]
    assert data.shape == (4, 1, 40, 40) and data.dtype == np.uint8


def test_scaled_decoding_keeps_the_draws_and_nearly_the_pixels(tmp_path):
    """A crop shrunk 4x or more decodes at a reduced scale: the same boxes (same seed), and
    pixels close to the full-size decode's (two downscalers differ a little)."""
    import cv2

    # Smooth, without grain: a point-sampling resize and an averaging decode see grain alike.
    coarse = np.random.RandomState(0).rand(4, 20, 26, 3).astype(np.float32) * 255
    images = [cv2.resize(c, (1024, 768), interpolation=cv2.INTER_CUBIC) for c in coarse]
    rec = write_rec(tmp_path, [pil_jpeg(i.clip(0, 255).astype(np.uint8)) for i in images])
    chain = T.Compose([T.RandomResizedCrop(64, scale=(0.5, 1.0)), T.ToTensor()])
    dataset = ImageRecordDataset(rec).transform_first(chain)
    out = []
    for scaled in (True, False):
        fusion = vision.fuse(dataset, scaled_decode=scaled)
        assert fusion.pipeline.scaled_decode is scaled
        loader = ShardedDataLoader(fusion.dataset, 4, batchify_fn=fusion.batchify_fn, seed=1)
        out.append(batches(loader)[0][0])
    diff = np.abs(out[0] - out[1]) * 255
    assert out[0].shape == out[1].shape == (4, 3, 64, 64)
    assert 0 < diff.mean() < 3, diff.mean()


def test_nested_transform_first_and_a_final_cast_are_fused(rec):
    inner = ImageRecordDataset(rec).transform_first(T.Resize((40, 36)))
    dataset = inner.transform_first(T.Compose([T.ToTensor(), T.Cast("float16")]))
    fusion = vision.fuse(dataset)
    assert fusion.path == "fused", fusion.reason
    exact = batches(ShardedDataLoader(dataset, 4, **EXACT))
    fused = batches(ShardedDataLoader(fusion.dataset, 4, batchify_fn=fusion.batchify_fn))
    for a, b in zip(exact, fused):
        assert a[0].dtype == b[0].dtype == np.float16 and a[0].shape == b[0].shape
        assert np.abs(a[0].astype(np.float32) - b[0].astype(np.float32)).max() <= 1 / 255 + 1e-3


# -- colour jitters -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["brightness", "contrast", "saturation"])
@pytest.mark.parametrize("alpha", [0.6, 1.4])
def test_colour_adjustments_compute_as_mxnets_operators(kind, alpha):
    """With the factor fixed (min = max), MXNet's operator and the fused step agree to the
    pixel, on a natural image, saturation's quirk included."""
    from shardloader.vision import _color

    image = smooth_image(120, 150, 12)
    operator = getattr((mx.npx if MX2 else mx.nd).image, f"random_{kind}")
    theirs = operator(ARRAYS.array(image, dtype="uint8"), alpha, alpha).asnumpy()
    ours = getattr(_color, kind)(image, alpha)
    assert np.abs(theirs.astype(int) - ours).max() <= 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "make",
    [
        lambda: T.RandomBrightness(0.5),
        lambda: T.RandomContrast(0.5),
        lambda: T.RandomSaturation(0.5),
        lambda: T.RandomColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
        lambda: T.RandomLighting(0.1),
    ],
    ids=["brightness", "contrast", "saturation", "jitter", "lighting"],
)
def test_colour_jitters_follow_gluons_distribution(tmp_path, make):
    """Gluon's jitter and the fused one on the same image, from independent seeds: the
    per-channel means of the results agree (two-sample KS at the 0.1% level)."""
    n = 1000
    image = smooth_image(24, 24, 13)
    mx.random.seed(3)
    jitter = make()
    source = ARRAYS.array(image, dtype="uint8")
    theirs = np.stack([jitter(source).asnumpy() for _ in range(n)]).astype(np.float64)
    rec = write_rec(tmp_path, [_png(image)] * n)
    fusion = vision.fuse(ImageRecordDataset(rec).transform_first(make()))
    assert fusion.path == "fused", fusion.reason
    loader = ShardedDataLoader(fusion.dataset, 250, batchify_fn=fusion.batchify_fn, seed=4)
    ours = np.concatenate([x for x, _ in batches(loader)]).astype(np.float64)
    critical = 1.95 * math.sqrt(2 / n)
    for c in range(3):
        stat = _ks_statistic(ours[..., c].mean(axis=(1, 2)), theirs[..., c].mean(axis=(1, 2)))
        assert stat < critical, (c, stat)


def test_lighting_computes_as_mxnets_operator():
    from shardloader.vision import _color

    image = smooth_image(60, 70, 14)
    for alpha in ((0.1, -0.2, 0.05), (-0.9, 0.3, 0.5)):
        operator = (mx.npx if MX2 else mx.nd).image.adjust_lighting
        theirs = operator(ARRAYS.array(image, dtype="uint8"), alpha=alpha).asnumpy()
        assert np.abs(theirs.astype(int) - _color.lighting(image, alpha)).max() <= 1


def test_hue_stays_exact(rec):
    for transform, reason in (
        (T.RandomColorJitter(0.4, 0.4, 0.4, 0.1), "RandomColorJitter with hue > 0"),
        (T.RandomHue(0.1), "RandomHue"),
    ):
        fusion = vision.fuse(ImageRecordDataset(rec).transform_first(transform))
        assert fusion.path == "exact" and reason in fusion.reason


@requires_mx1("mx.mod.Module, which 2.x removed")
def test_module_fit_trains_from_image_record_iter(rec):
    it = vision.image_record_iter(
        rec, data_shape=(3, 16, 16), batch_size=6, rand_mirror=True, preprocess_threads=2, seed=0
    )
    data = mx.sym.Variable("data")
    net = mx.sym.FullyConnected(mx.sym.Flatten(data), num_hidden=16)
    net = mx.sym.SoftmaxOutput(net, name="softmax")
    module = mx.mod.Module(net, context=mx.cpu())
    module.fit(it, num_epoch=2, optimizer_params={"learning_rate": 0.01})
    score = dict(module.score(it, "acc"))
    assert 0.0 <= score["accuracy"] <= 1.0
    it.close()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(output="float64"),
            "output must be one of ('float32', 'uint8', 'hwc'), got 'float64'",
        ),
        (dict(random_resized_crop=True), "random_resized_crop needs size=, got size=None"),
        (dict(size=0, center_crop=True), "CenterCrop size must be a positive int or a (width"),
        (dict(size=8, center_crop=True, random_crop=True), "ask for one crop at most"),
        (dict(size=8, random_resized_crop=True, scale=(0.5, 0.1)), "0 <= min <= max"),
        (dict(mean=(1, 2)), "mean must have 1 or 3 values for 3-channel images, got 2"),
        (dict(std=0), "std must not contain 0"),
        (dict(interpolation=5), "Resize interpolation must be one of (0, 1, 2, 3, 4, 9), got 5"),
        (dict(flag=2), "flag must be 1 (colour) or 0 (grey), got 2"),
    ],
)
def test_image_pipeline_errors_name_the_argument(kwargs, message):
    kwargs.setdefault("resize", 16)
    with pytest.raises(ValueError) as info:
        vision.ImagePipeline(**kwargs)
    assert message in str(info.value)


class _Doubled(mx.gluon.nn.HybridSequential):
    """A Sequential whose forward is its own: its children do not describe it."""

    def forward(self, x, *args):
        out = super().forward(x, *args)
        return out + out


def test_a_sequential_subclass_with_its_own_forward_stays_exact(rec):
    chain = _Doubled()
    chain.add(T.Resize(16))
    fusion = vision.fuse(ImageRecordDataset(rec).transform_first(chain))
    assert (fusion.path, fusion.reason) == ("exact", "transform _Doubled is not fused")


# -- the loader ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["inline", "thread", "process"])
def test_the_loader_fuses_a_gluon_chain_by_itself(rec, backend):
    dataset = ImageRecordDataset(rec).transform_first(
        T.Compose([T.Resize((48, 40)), T.ToTensor(), T.Normalize(MEAN, STD)])
    )
    fused = ShardedDataLoader(dataset, 4, seed=1, **BACKENDS[backend])
    exact = ShardedDataLoader(dataset, 4, seed=1, fuse_transforms=False, **BACKENDS[backend])
    assert fused.stats()["image_path"] == "fused"
    assert exact.stats()["image_path"] == "exact: fuse_transforms=False"
    scale = np.asarray(STD).reshape(1, 3, 1, 1)
    for a, b in zip(batches(fused), batches(exact)):
        assert (np.abs(a[0] - b[0]) * scale).max() <= 1 / 255 + 1e-6
        np.testing.assert_array_equal(a[1], b[1])
    assert fused._dataset is dataset  # Gluon's attribute is still the user's dataset


def test_stats_say_why_a_chain_is_not_fused_and_other_datasets_are_exact(rec):
    chain = T.Compose([T.Resize(16), T.RandomRotation((-5, 5)), T.ToTensor()])
    with ShardedDataLoader(ImageRecordDataset(rec).transform_first(chain), 4) as loader:
        assert loader.stats()["image_path"] == "exact: transform RandomRotation is not fused"
        loader.reset_stats()
        assert loader.stats()["image_path"].startswith("exact: transform RandomRotation")
    with ShardedDataLoader(np.arange(8, dtype=np.float32), 4) as loader:
        assert loader.stats()["image_path"] == "exact"
    with vision.ImageRecordLoader(rec, data_shape=(3, 8, 8), batch_size=4) as loader:
        assert loader.stats()["image_path"] == "fused"


def test_fuse_transforms_must_be_a_bool(rec):
    with pytest.raises(TypeError) as info:
        ShardedDataLoader(np.arange(4), 2, fuse_transforms="yes")
    assert "fuse_transforms" in str(info.value) and "'yes'" in str(info.value)


def test_a_custom_batchify_keeps_the_exact_path(rec):
    dataset = ImageRecordDataset(rec).transform_first(T.Compose([T.Resize(16), T.ToTensor()]))

    def stack(samples):
        return np.stack([s[0].asnumpy() for s in samples]), [s[1] for s in samples]

    with ShardedDataLoader(dataset, 4, batchify_fn=stack) as loader:
        why = "exact: a custom batchify_fn (stack) expects the transformed samples"
        assert loader.stats()["image_path"] == why
        data, _ = next(iter(loader))
        assert data.shape == (4, 3, 16, 16)


class _Relabelled(ImageRecordDataset):
    """A subclass whose __getitem__ is its own: the fused path must not bypass it."""

    def __getitem__(self, idx):
        image, label = super().__getitem__(idx)
        return image, label + 100


def test_a_subclassed_image_dataset_stays_exact(rec):
    dataset = _Relabelled(rec).transform_first(T.ToTensor())
    fusion = vision.fuse(dataset)
    assert fusion.path == "exact" and "_Relabelled" in fusion.reason
