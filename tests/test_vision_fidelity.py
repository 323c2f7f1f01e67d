"""The fused image path gives Gluon's images: deterministic steps within one uint8 level of
Gluon's transforms on the same JPEG, for every kind of JPEG (baseline, 4:4:4 and 4:2:2,
progressive, restart markers, grey, odd sizes, 4000x3000), under MXNet 1.9.1 and 2.0.0b1.

Each case writes real JPEGs (Pillow, OpenCV) into a ``.rec`` with ``mx.recordio``, reads it
through Gluon's chain (the exact path) and through ``shardloader.vision.fuse`` with the
loader, and compares the batches.
"""

from __future__ import annotations

import io

import mxnet as mx
import numpy as np
import pytest
from conftest import requires_mx1
from mxnet.gluon.data.vision import transforms as T

from shardloader import ShardedDataLoader, vision
from shardloader.recordio import ImageRecordDataset

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not vision.available(), reason="needs shardloader[vision]"),
]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
LEVEL = 1.0 / 255 + 1e-6  # one uint8 level after ToTensor


def smooth_image(height: int, width: int, seed: int) -> np.ndarray:
    """A natural-looking RGB image: smooth gradients plus grain, so every codec path and
    every interpolation has work to do."""
    import cv2

    rng = np.random.RandomState(seed)
    coarse = rng.rand(max(2, height // 16 + 2), max(2, width // 16 + 2), 3) * 255
    image = cv2.resize(coarse.astype(np.float32), (width, height), interpolation=cv2.INTER_CUBIC)
    image += rng.randn(height, width, 3) * 8
    return image.clip(0, 255).astype(np.uint8)


def pil_jpeg(image: np.ndarray, **options) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image).save(out, format="JPEG", quality=options.pop("quality", 90), **options)
    return out.getvalue()


def cv_jpeg(image: np.ndarray, *params) -> bytes:
    import cv2

    ok, data = cv2.imencode(".jpg", np.ascontiguousarray(image[:, :, ::-1]), list(params))
    assert ok
    return data.tobytes()


def write_rec(tmp_path, payloads, name="images"):
    """An indexed ``.rec`` holding ``payloads`` (encoded images), label = position."""
    rec, idx = str(tmp_path / f"{name}.rec"), str(tmp_path / f"{name}.idx")
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    for i, payload in enumerate(payloads):
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i), i, 0), payload))
    writer.close()
    return rec


def kinds():
    """Every kind of JPEG the issue names, as (name, encoded bytes)."""
    import cv2

    return [
        ("baseline 4:2:0", pil_jpeg(smooth_image(256, 320, 1))),
        ("4:4:4", pil_jpeg(smooth_image(240, 300, 2), subsampling=0)),
        ("4:2:2", pil_jpeg(smooth_image(250, 310, 3), subsampling=1)),
        ("progressive", pil_jpeg(smooth_image(256, 320, 4), progressive=True)),
        ("restart markers", cv_jpeg(smooth_image(240, 320, 5), cv2.IMWRITE_JPEG_RST_INTERVAL, 2)),
        ("odd 37x53", pil_jpeg(smooth_image(37, 53, 6))),
        ("1xN", pil_jpeg(smooth_image(1, 300, 7))),
        ("Nx1", pil_jpeg(smooth_image(300, 1, 8))),
        ("grey source", pil_jpeg(smooth_image(200, 260, 9)[:, :, 0].copy())),
    ]


def exact_and_fused(dataset, batch_size=None, **loader_kwargs):
    """All batches of ``dataset`` (a transform_first chain) through the exact path and the
    fused path, as numpy."""
    fusion = vision.fuse(dataset, scaled_decode=False)
    assert fusion.path == "fused", fusion.reason
    batch_size = batch_size or len(dataset)
    exact = ShardedDataLoader(dataset, batch_size, fuse_transforms=False, **loader_kwargs)
    fused = ShardedDataLoader(
        fusion.dataset, batch_size, batchify_fn=fusion.batchify_fn, **loader_kwargs
    )
    with exact, fused:
        return (
            [[f.asnumpy() for f in batch] for batch in exact],
            [[f.asnumpy() for f in batch] for batch in fused],
        )


def assert_within_a_level(exact, fused, std=1.0):
    """Images within one uint8 level (scaled by Normalize's std); labels equal."""
    assert len(exact) == len(fused)
    for (x_exact, y_exact), (x_fused, y_fused) in zip(exact, fused):
        assert x_fused.shape == x_exact.shape and x_fused.dtype == x_exact.dtype
        diff = np.abs(x_fused.astype(np.float64) - x_exact.astype(np.float64))
        if x_exact.dtype == np.uint8:
            assert diff.max() <= 1
        else:
            scale = np.asarray(std, np.float64).reshape(1, -1, 1, 1)
            assert (diff * scale).max() <= LEVEL
        np.testing.assert_array_equal(y_fused, y_exact)
        assert y_fused.dtype == y_exact.dtype


DETERMINISTIC = {
    "Resize": lambda: [T.Resize(224)],
    "Resize keep_ratio + CenterCrop": lambda: [T.Resize(256, keep_ratio=True), T.CenterCrop(224)],
    "CenterCrop": lambda: [T.CenterCrop((160, 120))],
    "Resize area": lambda: [T.Resize((100, 80), interpolation=3)],
    "Resize cubic": lambda: [T.Resize((300, 200), interpolation=2)],
}


@pytest.mark.parametrize("chain", sorted(DETERMINISTIC))
@pytest.mark.parametrize("flag", [1, 0])
def test_deterministic_chains_match_gluon_on_every_kind_of_jpeg(tmp_path, chain, flag):
    # Gluon's own CenterCrop fails on 1xN and Nx1 images (it shrinks the crop to an empty one).
    thin = chain == "CenterCrop"
    rec = write_rec(tmp_path, [data for name, data in kinds() if not (thin and "x1" in name)])
    mean, std = (MEAN, STD) if flag else (0.5, 0.25)
    steps = DETERMINISTIC[chain]() + [T.ToTensor(), T.Normalize(mean, std)]
    dataset = ImageRecordDataset(rec, flag=flag).transform_first(T.Compose(steps))
    # One image a batch: the odd sizes give different shapes without a crop.
    exact, fused = exact_and_fused(dataset, batch_size=1)
    assert_within_a_level(exact, fused, std)


@pytest.mark.parametrize("gluon_dataset", [False, True])
def test_pixels_without_tensor_and_tensor_without_normalize(tmp_path, gluon_dataset):
    rec = write_rec(tmp_path, [pil_jpeg(smooth_image(200, 240, s)) for s in range(6)])
    base = (
        mx.gluon.data.vision.ImageRecordDataset(rec) if gluon_dataset else ImageRecordDataset(rec)
    )
    for steps in ([T.CenterCrop(128)], [T.Resize(96), T.ToTensor()]):
        exact, fused = exact_and_fused(base.transform_first(T.Compose(steps)), batch_size=3)
        assert_within_a_level(exact, fused)


def test_a_large_jpeg_matches(tmp_path):
    rec = write_rec(tmp_path, [pil_jpeg(smooth_image(3000, 4000, 11))])
    chain = T.Compose([T.Resize(256, keep_ratio=True), T.CenterCrop(224), T.ToTensor()])
    exact, fused = exact_and_fused(ImageRecordDataset(rec).transform_first(chain))
    assert_within_a_level(exact, fused)


def test_a_fixed_crop_box_matches(tmp_path):
    rec = write_rec(tmp_path, [pil_jpeg(smooth_image(200, 240, s)) for s in range(4)])
    chain = T.Compose(
        [T.CropResize(10, 20, 150, 120, size=(64, 48), interpolation=1), T.ToTensor()]
    )
    exact, fused = exact_and_fused(ImageRecordDataset(rec).transform_first(chain))
    assert_within_a_level(exact, fused)


@requires_mx1("RandomResizedCrop drawing from Python's random (2.x draws in C++)")
@pytest.mark.parametrize("backend", [dict(num_workers=0), dict(num_workers=2)])
def test_seeded_random_resized_crop_draws_gluons_very_boxes(tmp_path, backend):
    """The fused step makes the calls ``mx.image.random_size_crop`` makes, on the same
    seeded ``random``: with ``seed=`` the crops are Gluon's own, pixel for pixel."""
    rec = write_rec(tmp_path, [pil_jpeg(smooth_image(256, 320, s)) for s in range(12)])
    chain = T.Compose([T.RandomResizedCrop(112), T.ToTensor(), T.Normalize(MEAN, STD)])
    exact, fused = exact_and_fused(
        ImageRecordDataset(rec).transform_first(chain),
        batch_size=4,
        seed=7,
        shuffle=True,
        **backend,
    )
    assert_within_a_level(exact, fused, STD)


def test_uint8_output_normalised_on_the_device_matches_float32(tmp_path):
    rec = write_rec(tmp_path, [pil_jpeg(smooth_image(200, 240, s)) for s in range(4)])
    pipeline_f = vision.ImagePipeline(96, center_crop=True, mean=MEAN, std=STD)
    pipeline_u = vision.ImagePipeline(96, center_crop=True, output="uint8")
    batches = []
    for pipeline in (pipeline_f, pipeline_u):
        fusion = vision.fuse(ImageRecordDataset(rec), pipeline=pipeline)
        with ShardedDataLoader(
            fusion.dataset, 4, batchify_fn=fusion.batchify_fn, ctx=mx.cpu(0)
        ) as loader:
            batches.append(next(iter(loader))[0])
    floats, pixels = batches
    assert pixels.dtype == np.uint8 and pixels.shape == (4, 3, 96, 96)
    on_device = vision.normalize(pixels, MEAN, STD)
    assert on_device.dtype == np.float32
    np.testing.assert_allclose(on_device.asnumpy(), floats.asnumpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("shards", [0, 2])
def test_output_device_normalises_after_placement(tmp_path, shards):
    rec = write_rec(tmp_path, [pil_jpeg(smooth_image(200, 240, s)) for s in range(8)])
    ctx = [mx.cpu(1), mx.cpu(2)] if shards else mx.cpu(1)
    common = dict(
        data_shape=(3, 96, 96), batch_size=4, mean_r=120, mean_g=110, mean_b=100, std_r=60,
        std_g=55, std_b=50, num_shards=shards,
    )  # fmt: skip
    with vision.ImageRecordLoader(rec, **common) as loader:
        floats = next(iter(loader))
    with vision.ImageRecordLoader(rec, output="device", ctx=ctx, **common) as loader:
        it = iter(loader)
        placed = next(it)
        assert it.epoch == 0 and loader.state_dict()["consumed"] == 1
    if not shards:
        floats, placed = [floats], [placed]
    for i, (want, got) in enumerate(zip(floats, placed)):
        data = got[0]
        assert data.dtype == np.float32 and data.context == (ctx[i] if shards else ctx)
        np.testing.assert_allclose(data.asnumpy(), want[0].asnumpy(), rtol=0, atol=1e-4)
        assert np.array_equal(got[1].asnumpy(), want[1].asnumpy())
