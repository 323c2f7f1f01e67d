"""Decoding only the crop (``shardloader/vision/_region.py``): the region decode gives the
full decode's very pixels in the crop's box, for every kind of JPEG; damaged bytes fail it
and the image is decoded whole as before; without a compiler or libjpeg-turbo's headers, or
with ``SHARDLOADER_REGION_DECODE=0``, the fused path decodes whole images and says why."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mxnet.gluon.data.vision import transforms as T
from test_vision_fidelity import MEAN, STD, kinds, pil_jpeg, smooth_image, write_rec

from shardloader import ShardedDataLoader, vision
from shardloader.recordio import ImageRecordDataset
from shardloader.vision import _codecs, _region

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not vision.available(), reason="needs shardloader[vision]"),
]

needs_region = pytest.mark.skipif(
    not _region.available(build=True),
    reason=f"region decode unavailable: {_region.why_unavailable()}",
)


def boxes(height, width, rng, count=25):
    """Random boxes, and the corners and the whole image."""
    found = [(0, 0, width, height), (0, 0, 1, 1), (width - 1, height - 1, 1, 1)]
    for _ in range(count):
        w, h = rng.randint(1, width + 1), rng.randint(1, height + 1)
        found.append((rng.randint(0, width - w + 1), rng.randint(0, height - h + 1), w, h))
    return found


def with_and_without(library, batches):
    """``batches()`` run with a compiled helper (``_native.Library``), then with it switched
    off in this process (as ``available()`` is when it cannot be built); forked workers
    inherit either."""
    assert library.available()
    with_it = batches()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(library, "functions", None)
        patch.setattr(library, "reason", "switched off by the test")
        assert not library.available()
        return with_it, batches()


def with_and_without_region(batches):
    return with_and_without(_region.LIBRARY, batches)


@needs_region
@pytest.mark.parametrize("flag", [1, 0])
@pytest.mark.parametrize("kind", [name for name, _ in kinds()])
def test_a_region_decode_is_the_full_decodes_pixels_in_the_box(kind, flag):
    data = dict(kinds())[kind]
    full = _codecs.decode_jpeg(data, flag)
    height, width = full.shape[:2]
    rng = np.random.RandomState(len(kind) + flag)
    for x0, y0, w, h in boxes(height, width, rng):
        out = np.full((height, width, full.shape[2]), 7, np.uint8)
        _region.decode(data, flag, (height, width), (x0, y0, w, h), out)
        np.testing.assert_array_equal(
            out[y0 : y0 + h, x0 : x0 + w],
            full[y0 : y0 + h, x0 : x0 + w],
            err_msg=str((x0, y0, w, h)),
        )


@needs_region
def test_damaged_bytes_fail_the_region_decode_and_are_decoded_whole_as_before(tmp_path):
    """Truncated JPEGs: a region decode that reaches the damage fails with libjpeg's message;
    the fused loader then decodes the image whole, and its batches are the batches of the
    fused path without region decode."""
    data = pil_jpeg(smooth_image(256, 320, 11))
    full_shape = (256, 320, 3)
    with pytest.raises(ValueError, match=r"(?i)premature|corrupt|data|marker"):
        _region.decode(
            data[: len(data) // 2], 1, (256, 320), (0, 200, 320, 56), np.empty(full_shape, np.uint8)
        )
    damaged = [data[: len(data) * k // 8] for k in (2, 4, 6, 7)] + [data]
    rec = write_rec(tmp_path, damaged)
    chain = T.Compose([T.RandomResizedCrop(128), T.ToTensor(), T.Normalize(MEAN, STD)])

    def batches():
        dataset = ImageRecordDataset(rec).transform_first(chain)
        with ShardedDataLoader(dataset, len(damaged), seed=3) as loader:
            assert loader.stats()["image_path"] == "fused"
            return [x.asnumpy() for x, _ in loader]

    with_region, without = with_and_without_region(batches)
    np.testing.assert_array_equal(with_region[0], without[0])


@pytest.mark.timeout(120)
def test_without_a_compiler_the_fused_path_decodes_whole_images_and_says_why(tmp_path):
    """A fresh interpreter with no usable C compiler and an empty cache:
    ``vision.region_decode()`` says it is off and why (and ``vision.native()`` that the
    one-pass write is off too), the loader takes the fused path and decodes whole images,
    and ``SHARDLOADER_REGION_DECODE=0`` gives the same batches."""
    import subprocess
    import sys

    script = f"""
import numpy as np
from shardloader.vision import _region
from shardloader import ShardedDataLoader
from shardloader.recordio import ImageRecordDataset
from mxnet.gluon.data.vision import transforms as T
from shardloader import vision
print(vision.native()["write"])
print(vision.region_decode())
chain = T.Compose([T.RandomResizedCrop(96), T.ToTensor()])
dataset = ImageRecordDataset({str(write_rec(tmp_path, [d for _, d in kinds()[:4]]))!r})
with ShardedDataLoader(dataset.transform_first(chain), 4, seed=5) as loader:
    np.save({str(tmp_path / "batch.npy")!r}, next(iter(loader))[0].asnumpy())
    print(loader.stats()["image_path"])
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, CC="false", XDG_CACHE_HOME=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.pop("SHARDLOADER_REGION_DECODE", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr[-2000:]
    write, first, path = done.stdout.strip().splitlines()[-3:]
    assert first.startswith("off: compiling it failed") and "C compiler" in first, first
    assert write.startswith("off: compiling it failed") and "C compiler" in write, write
    assert path == "fused"
    assert not os.listdir(tmp_path / "cache" / "shardloader")  # no half-built library left
    env = dict(env, SHARDLOADER_REGION_DECODE="0")
    done = subprocess.run(
        [sys.executable, "-c", script.replace("batch.npy", "off.npy")],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-2] == "off: SHARDLOADER_REGION_DECODE=0"
    np.testing.assert_array_equal(np.load(tmp_path / "batch.npy"), np.load(tmp_path / "off.npy"))


@needs_region
def test_a_fresh_cache_gets_one_build_and_the_same_batches(tmp_path):
    """With an empty cache folder, the first fused loader builds the library there, once,
    and its batches (2 spawned workers, which load builds and never make them) are those of
    a run with SHARDLOADER_REGION_DECODE=0."""
    import subprocess
    import sys

    rec = write_rec(tmp_path, [d for _, d in kinds()[:4]] * 2)
    script = f"""
import sys
import numpy as np
from mxnet.gluon.data.vision import transforms as T
from shardloader import ShardedDataLoader, vision
from shardloader.recordio import ImageRecordDataset
chain = T.Compose([T.RandomResizedCrop(96), T.ToTensor()])
dataset = ImageRecordDataset({rec!r}).transform_first(chain)
with ShardedDataLoader(dataset, 4, num_workers=2, seed=5, start_method="spawn") as loader:
    np.save(sys.argv[1], np.concatenate([x.asnumpy() for x, _ in loader]))
print(vision.region_decode())
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    outputs = {}
    for setting in ("1", "0"):
        env["SHARDLOADER_REGION_DECODE"] = setting
        out = str(tmp_path / f"batches-{setting}.npy")
        done = subprocess.run(
            [sys.executable, "-c", script, out],
            env=env,
            capture_output=True,
            text=True,
            timeout=100,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[setting] = (done.stdout.strip().splitlines()[-1], np.load(out))
    assert outputs["1"][0] == "on" and outputs["0"][0] == "off: SHARDLOADER_REGION_DECODE=0"
    built = sorted(os.listdir(tmp_path / "cache" / "shardloader"))
    assert [name.split("-")[0] for name in built] == ["region", "write"], built
    assert all(name.endswith(".so") for name in built)
    np.testing.assert_array_equal(outputs["1"][1], outputs["0"][1])


@needs_region
@pytest.mark.parametrize("flag", [1, 0])
def test_a_seeded_fused_loader_gives_the_same_batches_with_and_without_region_decode(
    tmp_path, flag, no_leaks
):
    """W5's chain (RandomResizedCrop, a flip, ToTensor, Normalize) over JPEGs of every
    kind, 2 forked workers, seeded: region decode changes no pixel."""
    rec = write_rec(tmp_path, [d for _, d in kinds()] * 3)
    mean, std = (MEAN, STD) if flag else (0.5, 0.25)
    chain = T.Compose(
        [T.RandomResizedCrop(64), T.RandomFlipLeftRight(), T.ToTensor(), T.Normalize(mean, std)]
    )

    def batches():
        dataset = ImageRecordDataset(rec, flag=flag).transform_first(chain)
        with ShardedDataLoader(dataset, 9, num_workers=2, seed=11) as loader:
            assert loader.stats()["image_path"] == "fused"
            return [x.asnumpy() for x, _ in loader]

    with_region, without = with_and_without_region(batches)
    assert len(with_region) == len(without) == 3
    for a, b in zip(with_region, without):
        np.testing.assert_array_equal(a, b)
