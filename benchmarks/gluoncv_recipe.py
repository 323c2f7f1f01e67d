"""gluon-cv's ImageNet recipe (``scripts/classification/imagenet/train_imagenet.py
--use-rec``), converted to shardloader by changing only its calls' name.

The script is gluon-cv's, given by path (it is not part of gluon-cv's wheel, nor of this
repository): ``convert`` replaces its two ``mx.io.ImageRecordIter(`` calls with
``vision.image_record_iter(`` and adds the import, keeping every argument, jitters included.
``python -m benchmarks.gluoncv_recipe SCRIPT`` writes a small ImageNet-like ``.rec`` pair
(class-coloured JPEGs), then runs the original and the converted script under a deadline,
with each seed, and prints each run's validation error per epoch and the seconds per epoch
its training loop waited for batches (the time inside the iterator's ``next``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List

import numpy as np

CALL = "mx.io.ImageRecordIter("
# Seeds Python, numpy and MXNet, times every DataIter's ``next`` per epoch (an epoch starts at
# ``reset``), then runs the script as ``__main__``; the times go to a JSON file at exit.
_WRAPPER = """
import atexit, json, random, runpy, sys, time
import numpy as np, mxnet as mx
from shardloader.dataiter import LoaderDataIter
seed, out, script = int(sys.argv[1]), sys.argv[2], sys.argv[3]
random.seed(seed); np.random.seed(seed); mx.random.seed(seed)
waits = {}
def timed(cls):
    inner_next, inner_reset = cls.next, cls.reset
    def next_(self):
        tic = time.perf_counter()
        try:
            return inner_next(self)
        finally:
            waits.setdefault(id(self), [0.0])[-1] += time.perf_counter() - tic
    def reset(self):
        waits.setdefault(id(self), [0.0]).append(0.0)
        return inner_reset(self)
    cls.next, cls.reset = next_, reset
timed(mx.io.MXDataIter); timed(LoaderDataIter)
atexit.register(lambda: json.dump(list(waits.values()), open(out, "w")))
sys.argv = [script] + sys.argv[4:]
runpy.run_path(script, run_name="__main__")
"""


def convert(text: str) -> str:
    """``text`` with its ``mx.io.ImageRecordIter(`` calls renamed ``vision.image_record_iter(``
    and ``from shardloader import vision`` after ``import mxnet as mx``."""
    count = text.count(CALL)
    if count == 0 or "import mxnet as mx\n" not in text:
        raise ValueError(f"expected {CALL!r} calls and 'import mxnet as mx' in the script")
    text = text.replace(CALL, "vision.image_record_iter(")
    return text.replace(
        "import mxnet as mx\n", "import mxnet as mx\nfrom shardloader import vision\n", 1
    )


def write_records(folder: str, classes: int, per_class: int, seed: int, name: str) -> str:
    """An indexed ``.rec`` of ``classes * per_class`` JPEGs of 96x120: class ``c`` is a
    colour of its own with smooth noise, so a small network learns it in a few epochs."""
    import cv2
    import mxnet as mx

    rng = np.random.RandomState(seed)
    hues = np.linspace(0, 180, classes, endpoint=False)
    rec, idx = os.path.join(folder, name + ".rec"), os.path.join(folder, name + ".idx")
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    for i in range(classes * per_class):
        label = i % classes
        hsv = np.empty((96, 120, 3), np.float32)
        hsv[..., 0] = hues[label] + rng.randn() * 3
        hsv[..., 1] = 120 + 100 * cv2.resize(rng.rand(6, 8).astype(np.float32), (120, 96))
        hsv[..., 2] = 60 + 180 * cv2.resize(rng.rand(6, 8).astype(np.float32), (120, 96))
        bgr = cv2.cvtColor(hsv.clip(0, 255).astype(np.uint8), cv2.COLOR_HSV2BGR)
        ok, jpeg = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 90])
        header = mx.recordio.IRHeader(0, float(label), i, 0)
        writer.write_idx(i, mx.recordio.pack(header, jpeg.tobytes()))
    writer.close()
    return rec


def run(script: str, seed: int, data: Dict[str, str], args: List[str], deadline: float) -> dict:
    """One run of ``script`` in a fresh process: validation top-1 error per epoch and the
    training iterator's wait per epoch."""
    with tempfile.TemporaryDirectory() as tmp:
        waits, log = os.path.join(tmp, "waits.json"), os.path.join(tmp, "train.log")
        argv = [
            *("--use-rec", "--rec-train", data["train"], "--rec-train-idx", data["train_idx"]),
            *("--rec-val", data["val"], "--rec-val-idx", data["val_idx"]),
            *("--logging-file", log, "--save-dir", os.path.join(tmp, "params")),
            *args,
        ]
        cmd = [sys.executable, "-c", _WRAPPER, str(seed), waits, script, *argv]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=deadline, cwd=tmp)
        if done.returncode != 0:
            raise RuntimeError(f"{script} failed:\n{done.stderr[-3000:]}")
        with open(log) as f:
            text = f.read()
        with open(waits) as f:
            iters = json.load(f)
    errors = [float(e) for e in re.findall(r"validation: err-top1=([0-9.]+)", text)]
    train = iters[0][1:]  # the training iterator: created first; [0] is before any reset
    return {"err_top1": errors, "train_wait_s": [round(t, 2) for t in train]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gluoncv_recipe")
    parser.add_argument(
        "script", help="gluon-cv's scripts/classification/imagenet/train_imagenet.py"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--deadline-s", type=float, default=900)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--per-class", type=int, default=48)
    parser.add_argument(
        "--recipe-args",
        default="--model mobilenet0.25 --mode hybrid --input-size 64 --batch-size 32 -j 2 "
        "--num-epochs 4 --lr 0.1 --num-training-samples 480 --log-interval 0 "
        "--save-frequency 100",
    )
    opts = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="gluoncv-recipe-")
    data = {
        "train": write_records(folder, opts.classes, opts.per_class, 0, "train"),
        "val": write_records(folder, opts.classes, opts.per_class // 4, 1, "val"),
    }
    data["train_idx"], data["val_idx"] = data["train"][:-3] + "idx", data["val"][:-3] + "idx"
    with open(opts.script) as f:
        original = f.read()
    converted = os.path.join(folder, "train_imagenet_shardloader.py")
    with open(converted, "w") as f:
        f.write(convert(original))
    results = []
    for seed in opts.seeds:
        for name, script in (("ImageRecordIter", opts.script), ("image_record_iter", converted)):
            result = run(script, seed, data, opts.recipe_args.split(), opts.deadline_s)
            results.append({"iterator": name, "seed": seed, **result})
            print(json.dumps(results[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
