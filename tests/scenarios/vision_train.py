"""Scenario 12: train a small CNN from JPEGs in a .rec through the fused image path.

The program writes coloured-pattern JPEGs of four classes into an indexed .rec with
``mx.recordio``, trains a small Conv2D net for a few dozen steps from
``ImageRecordDataset(...).transform_first(Compose([RandomResizedCrop, RandomFlipLeftRight,
ToTensor, Normalize]))`` (the loader fuses the chain: ``stats()['image_path'] == 'fused'``),
and validates after each epoch through a loader on the exact path (``fuse_transforms=False``),
whose batches must match the fused path's within one uint8 level: a centre crop, then a
resize, so the fused validation runs region decode and the one-pass write where they are
built (a C compiler here means they must be). The net must learn.

    python tests/scenarios/vision_train.py --workers inline|thread|process
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import Scenario, check  # noqa: E402

CLASSES = 4
BATCH = 32
EPOCHS = 4  # 4 x 8 = 32 training steps
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# A difference after Normalize, in uint8 levels.
LEVELS = 255 * np.array(STD)[None, :, None, None]


def picture(label: int, rng: np.random.RandomState) -> bytes:
    """A 48x56 JPEG whose class is its dominant colour, with texture and noise."""
    from PIL import Image

    image = rng.randint(0, 90, (48, 56, 3)).astype(np.int32)
    image[:, :, label % 3] += 140
    if label == 3:
        image[::4] = 255  # stripes tell the fourth class apart
    out = io.BytesIO()
    Image.fromarray(image.clip(0, 255).astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def write_rec(path: str, count: int, seed: int) -> str:
    import mxnet as mx

    rng = np.random.RandomState(seed)
    writer = mx.recordio.MXIndexedRecordIO(path[:-4] + ".idx", path, "w")
    for i in range(count):
        label = i % CLASSES
        header = mx.recordio.IRHeader(0, float(label), i, 0)
        writer.write_idx(i, mx.recordio.pack(header, picture(label, rng)))
    writer.close()
    return path


def main() -> None:
    args = _common.parser(__doc__).parse_args()
    with Scenario(f"vision_train[{args.workers}]", args.start_method) as sc:
        import mxnet as mx
        from mxnet import autograd, gluon
        from mxnet.gluon.data.vision import transforms as T

        from shardloader import DataLoader, vision
        from shardloader.recordio import ImageRecordDataset

        check(vision.available(), "the vision extra is not installed")
        folder = tempfile.mkdtemp(prefix="vision_train_")
        train_rec = write_rec(os.path.join(folder, "train.rec"), 256, seed=1)
        val_rec = write_rec(os.path.join(folder, "val.rec"), 64, seed=2)
        train_chain = T.Compose(
            [
                T.RandomResizedCrop(32, scale=(0.5, 1.0)),
                T.RandomFlipLeftRight(),
                T.ToTensor(),
                T.Normalize(MEAN, STD),
            ]
        )
        # A crop first: the fused validation decodes only its box (region decode) and writes
        # each image in one pass where those helpers are built, against Gluon's operators.
        val_chain = T.Compose(
            [T.CenterCrop(40), T.Resize(32), T.ToTensor(), T.Normalize(MEAN, STD)]
        )
        helpers = vision.native()  # builds them, as the first fused loader would
        sc.phase(f"compiled helpers: {helpers}")
        if shutil.which(os.environ.get("CC", "cc")):
            check(helpers["write"] == "on", f"a C compiler is here, yet {helpers}")
            if os.path.exists("/usr/include/jpeglib.h"):
                check(helpers["region_decode"] == "on", f"libjpeg's headers are here: {helpers}")
        kwargs = _common.worker_kwargs(args.workers, args.start_method)
        train_records, val_records = ImageRecordDataset(train_rec), ImageRecordDataset(val_rec)
        train = DataLoader(
            train_records.transform_first(train_chain),
            batch_size=BATCH,
            shuffle=True,
            seed=0,
            **kwargs,
        )
        val_data = val_records.transform_first(val_chain)
        val = DataLoader(val_data, batch_size=BATCH, fuse_transforms=False, **kwargs)
        val_fused = DataLoader(val_data, batch_size=BATCH, **kwargs)
        check(train.stats()["image_path"] == "fused", f"train: {train.stats()['image_path']}")
        check(val.stats()["image_path"].startswith("exact"), f"val: {val.stats()['image_path']}")
        check(val_fused.stats()["image_path"] == "fused", f"{val_fused.stats()['image_path']}")

        net = _common.conv_classifier(CLASSES)
        trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        accuracy = 0.0
        for epoch in range(EPOCHS):
            steps = 0
            for data, label in train:
                check(data.shape[1:] == (3, 32, 32), f"train batch of shape {data.shape}")
                with autograd.record():
                    loss = loss_fn(net(data), label)
                loss.backward()
                trainer.step(data.shape[0])
                steps += 1
            correct = seen = 0
            for (data, label), (fused, fused_label) in zip(val, val_fused):
                levels = np.abs(data.asnumpy() - fused.asnumpy()) * LEVELS
                check(levels.max() <= 1 + 1e-4, f"val batches differ by {levels.max()} levels")
                check((label.asnumpy() == fused_label.asnumpy()).all(), "val labels differ")
                correct += int((net(data).argmax(axis=1) == label).asnumpy().sum())
                seen += data.shape[0]
            accuracy = correct / seen
            sc.phase(f"epoch {epoch}: {steps} steps, val accuracy {accuracy:.3f}")
        mx.nd.waitall()
        check(accuracy > 0.6, f"the net did not learn: val accuracy {accuracy}")
        check(train.stats()["image_path"] == "fused", "train left the fused path")
        for loader in (train, val, val_fused):
            loader.close()
        for records in (train_records, val_records):
            records.close()  # inline and thread loaders read the files in this process
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
