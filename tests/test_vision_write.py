"""The fused path's write into the batch (``shardloader/vision/_write.py``): ``_write.c``'s
one pass (flip, split into planes, ToTensor and Normalize's table) gives OpenCV's values
bit for bit, for every flip, colour and grey, float32 and uint8, from whole images and from
views into larger ones; what it does not take (another dtype) goes OpenCV's way; and a
seeded loader gives the same batches with and without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from mxnet.gluon.data.vision import transforms as T
from test_vision_fidelity import MEAN, STD, kinds, write_rec
from test_vision_region import with_and_without

from shardloader import ShardedDataLoader, vision
from shardloader.recordio import ImageRecordDataset
from shardloader.vision import ImagePipeline, _write

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not vision.available(), reason="needs shardloader[vision]"),
]

needs_write = pytest.mark.skipif(
    not _write.LIBRARY.available(build=True),
    reason=f"the one-pass write is unavailable: {_write.LIBRARY.why_unavailable()}",
)

FLIPS = [(False, False), (True, False), (False, True), (True, True)]


def opencv_way(pixels, flips, out, lut):
    """What ``_write.planes`` does without ``_write.c``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_write.LIBRARY, "functions", None)
        patch.setattr(_write.LIBRARY, "reason", "switched off by the test")
        _write.planes(pixels, flips, out, lut)


def reference(pixels, flips, lut):
    """The planes by numpy alone: flip, transpose, look up."""
    if flips[0]:
        pixels = pixels[:, ::-1]
    if flips[1]:
        pixels = pixels[::-1]
    planes = np.ascontiguousarray(pixels.transpose(2, 0, 1))
    if lut is None:
        return planes
    return np.stack([lut[c][planes[c]] for c in range(planes.shape[0])])


@needs_write
@pytest.mark.parametrize("flips", FLIPS)
@pytest.mark.parametrize("channels", [3, 1])
@pytest.mark.parametrize("output", ["float32", "uint8"])
@pytest.mark.parametrize("view", [False, True])
def test_the_one_pass_write_gives_opencvs_values(flips, channels, output, view):
    rng = np.random.default_rng(channels * 10 + len(output))
    height, width = 37, 53  # odd sizes: no row is a multiple of any vector width
    if view:  # a crop of a larger image, as a crop that needs no resize leaves it
        pixels = rng.integers(0, 256, (height + 9, width + 11, channels), np.uint8)[4:-5, 3:-8]
    else:
        pixels = rng.integers(0, 256, (height, width, channels), np.uint8)
    pipeline = ImagePipeline(mean=MEAN[:channels], std=STD[:channels], flag=int(channels == 3))
    lut = pipeline.lut if output == "float32" else None
    dtype = np.float32 if lut is not None else np.uint8
    ours = np.full((channels, height, width), 7, dtype)
    assert _write._native_planes(pixels, flips, ours, lut)  # written by _write.c
    theirs = np.full_like(ours, 9)
    opencv_way(pixels, flips, theirs, lut)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours, reference(pixels, flips, lut))


@pytest.mark.parametrize("flips", FLIPS)
def test_another_dtype_or_strided_pixels_go_opencvs_way(flips):
    """float16 output (``dtype='float16'``) and pixels whose channels are not adjacent are
    not ``_write.c``'s to take: the same values come from OpenCV's way."""
    rng = np.random.default_rng(3)
    lut = ImagePipeline(mean=MEAN, std=STD).lut
    pixels = rng.integers(0, 256, (20, 30, 3), np.uint8)
    half = np.empty((3, 20, 30), np.float16)
    assert not _write._native_planes(pixels, flips, half, lut)
    _write.planes(pixels, flips, half, lut)
    np.testing.assert_array_equal(half, reference(pixels, flips, lut).astype(np.float16))
    spread = np.zeros((20, 30, 6), np.uint8)
    spread[:, :, ::2] = pixels
    out = np.empty((3, 20, 30), np.float32)
    assert not _write._native_planes(spread[:, :, ::2], flips, out, lut)
    _write.planes(spread[:, :, ::2], flips, out, lut)
    np.testing.assert_array_equal(out, reference(pixels, flips, lut))


@needs_write
@pytest.mark.parametrize("output", ["float32", "uint8"])
def test_a_seeded_fused_loader_gives_the_same_batches_with_and_without_the_one_pass_write(
    tmp_path, output, no_leaks
):
    """W5's chain (RandomResizedCrop, flips both ways, ToTensor, Normalize) over JPEGs of
    every kind, 2 forked workers, seeded: the write changes no value."""
    rec = write_rec(tmp_path, [d for _, d in kinds()] * 3)
    steps = [T.RandomResizedCrop(64), T.RandomFlipLeftRight(), T.RandomFlipTopBottom()]
    if output == "float32":
        steps += [T.ToTensor(), T.Normalize(MEAN, STD)]
    chain = T.Compose(steps)

    def batches():
        dataset = ImageRecordDataset(rec).transform_first(chain)
        with ShardedDataLoader(dataset, 9, num_workers=2, seed=11) as loader:
            assert loader.stats()["image_path"] == "fused"
            return [x.asnumpy() for x, _ in loader]

    with_it, without = with_and_without(_write.LIBRARY, batches)
    assert len(with_it) == len(without) == 3
    for a, b in zip(with_it, without):
        np.testing.assert_array_equal(a, b)


@needs_write
def test_the_write_switch_turns_it_off_and_says_so(tmp_path):
    """``SHARDLOADER_NATIVE_WRITE=0``: ``vision.native()`` says the write is off and why,
    and region decode stays as it was."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, SHARDLOADER_NATIVE_WRITE="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.pop("SHARDLOADER_REGION_DECODE", None)
    script = "import json; from shardloader import vision; print(json.dumps(vision.native()))"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["write"] == "off: SHARDLOADER_NATIVE_WRITE=0"
    assert found["region_decode"] == vision.region_decode()


@needs_write
def test_making_a_fused_pipeline_builds_the_helpers_where_it_is_made(tmp_path):
    """``vision.fuse`` alone (a fused chain for any loader, Gluon's included) builds both
    helpers into an empty cache, in the process that calls it."""
    rec = write_rec(tmp_path, [d for _, d in kinds()[:2]])
    script = f"""
from mxnet.gluon.data.vision import transforms as T
from shardloader import vision
from shardloader.recordio import ImageRecordDataset
chain = T.Compose([T.RandomResizedCrop(32), T.ToTensor()])
print(vision.fuse(ImageRecordDataset({rec!r}).transform_first(chain)).path)
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    for name in ("SHARDLOADER_REGION_DECODE", "SHARDLOADER_NATIVE_WRITE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "fused"
    built = sorted(name.split("-")[0] for name in os.listdir(tmp_path / "cache" / "shardloader"))
    expected = ["region", "write"] if vision.region_decode() == "on" else ["write"]
    assert built == expected
