"""The fused image path's promises about what it runs and where it writes: a fused batch in a
process worker is written into its shared-memory slot once (``uses_batch_allocator``); a
transform whose Block state the fused step would skip (hooks) keeps the exact path; a subclass
of a recognised dataset that replaces nothing the fused path replaces is fused (gluon-cv's
``ImageNet`` under the one-import swap), and one that does is not."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon.data.vision import transforms as T
from test_vision_fidelity import MEAN, STD, pil_jpeg, smooth_image, write_rec

from shardloader import ShardedDataLoader, batchify, vision
from shardloader._engine.ipc import slots

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not vision.available(), reason="needs shardloader[vision]"),
]


def chain():
    return T.Compose(
        [T.RandomResizedCrop(32), T.RandomFlipLeftRight(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    folder = tmp_path_factory.mktemp("paths")
    return write_rec(folder, [pil_jpeg(smooth_image(48, 60, s)) for s in range(12)])


# -- every byte written once ------------------------------------------------------------------


def test_the_fused_batchify_declares_the_batch_allocator(rec):
    from shardloader.recordio import ImageRecordDataset

    fusion = vision.fuse(ImageRecordDataset(rec).transform_first(chain()))
    assert fusion.path == "fused" and batchify.is_native(fusion.batchify_fn)
    # a capability, not a list of classes: any batchify function may declare it
    assert not batchify.is_native(lambda samples: samples)
    assert batchify.is_native(batchify.Tuple(fusion.batchify_fn, batchify.Stack()))


def test_a_fused_batch_in_a_process_worker_is_written_into_its_slot(
    rec, tmp_path, monkeypatch, no_leaks
):
    """The images of every batch the fork worker packs lie in its slot already: none is
    copied in (before, the float32 images were built in private memory and copied)."""
    from shardloader.recordio import ImageRecordDataset

    log = tmp_path / "placed"  # one line per array the forked worker packs
    place = slots.SlotRing._place

    def counting(self, slot, arr, kind):
        in_place = isinstance(arr, np.ndarray) and self._offset_in(slot, arr) is not None
        with open(log, "a") as f:
            f.write(f"{'in place' if in_place else 'copied'} {arr.shape}\n")
        return place(self, slot, arr, kind)

    monkeypatch.setattr(slots.SlotRing, "_place", counting)
    dataset = ImageRecordDataset(rec).transform_first(chain())
    with ShardedDataLoader(dataset, 4, num_workers=1, start_method="fork", seed=0) as loader:
        shapes = [tuple(data.shape) for data, label in loader]
        assert loader.stats()["image_path"] == "fused"
    assert shapes == [(4, 3, 32, 32)] * 3
    images = [line for line in log.read_text().splitlines() if "(4, 3, 32, 32)" in line]
    # (labels of 16 bytes are below the slot's alignment and copied, by design)
    assert images == ["in place (4, 3, 32, 32)"] * 3
