"""Where W5's time goes: ``python -m benchmarks.profile_w5 [--quick] [--engines ...]``.

A diagnostic, not part of ``make bench``. It runs W5's pipeline (Gluon's
``ImageRecordDataset`` + ``RandomResizedCrop(224)``, flip, ``ToTensor``, ``Normalize``) with
every stage timed by ``time.perf_counter``, waiting for each stage's NDArray so that
MXNet's asynchronous engine cannot move its cost into the next stage:

1. **in one process**, stage by stage, and the transforms unfused (each MXNet operator of
   the pipeline on its own), for the cost of each step of the work;
2. **in shardloader's worker processes** (``num_workers=2``, batch 64, shuffled): each worker
   sums its stages (read, unpack, decode, crop, the fused flip/ToTensor/Normalize block,
   stacking the batch) and sends the sums with the batch, as a third field; the loop adds
   its own wall time, so the difference between the wall time and the workers' busy time
   over two workers is what hand-off, transport and scheduling cost.

Waiting after every stage costs a little (the engine cannot overlap two stages of one
sample), so the totals run a few percent above an unprofiled pipeline's.

Each engine in ``--engines`` (``threaded``: MXNet's default ``ThreadedEnginePerDevice``;
``naive``: ``NaiveEngine``, every operator run on the calling thread) gets its own fresh
process, since MXNet picks its engine when it is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_ENGINES = {"threaded": "ThreadedEnginePerDevice", "naive": "NaiveEngine"}
STAGES = ("read", "unpack", "decode", "crop", "flip+tensor+normalize", "stack")
# Seconds per stage, summed in this process (each worker process has its own copy, and the
# dataset and the batchify function reach it however they were handed to the worker).
_TIMES: Dict[str, float] = dict.fromkeys(STAGES, 0.0)


def _reset() -> None:
    for stage in STAGES:
        _TIMES[stage] = 0.0


class ProfiledJpegDataset:
    """W5's dataset, doing what Gluon's ``ImageRecordDataset(...).transform_first(...)``
    does, with the time of every stage added to this process's ``_TIMES``."""

    def __init__(self, rec_path: str) -> None:
        from mxnet.gluon.data.vision import ImageRecordDataset

        from .images import jpeg_transform

        self._base = ImageRecordDataset(rec_path)
        self._steps = list(jpeg_transform()._children.values())  # crop, then the fused block

    def __len__(self) -> int:
        return len(self._base)

    def __getitem__(self, idx: int) -> Any:
        from mxnet import image, recordio

        times, clock = _TIMES, time.perf_counter
        t0 = clock()
        record = self._base._record.read_idx(self._base._record.keys[idx])
        t1 = clock()
        header, payload = recordio.unpack(record)
        t2 = clock()
        x = image.imdecode(payload, 1)
        x.wait_to_read()
        t3 = clock()
        x = self._steps[0](x)
        x.wait_to_read()
        t4 = clock()
        for step in self._steps[1:]:
            x = step(x)
        x.wait_to_read()
        t5 = clock()
        times["read"] += t1 - t0
        times["unpack"] += t2 - t1
        times["decode"] += t3 - t2
        times["crop"] += t4 - t3
        times["flip+tensor+normalize"] += t5 - t4
        return x, header.label


class _TimedBatchify:
    """shardloader's default batchify, timed, with the worker's stage sums since its last
    batch appended as a third field (a 1 x len(STAGES) + 1 array: the stages, then the
    worker's CPU seconds)."""

    def __init__(self) -> None:
        self._cpu: Optional[float] = None

    def __call__(self, samples: List[Any]) -> Any:
        from shardloader.batchify import default_batchify_fn

        start = time.perf_counter()
        batch = default_batchify_fn(samples)
        _TIMES["stack"] += time.perf_counter() - start
        cpu = time.process_time()
        spent = cpu - self._cpu if self._cpu is not None else float("nan")
        self._cpu = cpu
        sums = np.array([[_TIMES[s] for s in STAGES] + [spent]], dtype=np.float64)
        _reset()
        return [*batch, default_batchify_fn([sums[0]])]


def _unfused(rec_path: str, count: int) -> Dict[str, float]:
    """Milliseconds per image of each MXNet operator of the pipeline, run on its own."""
    import mxnet as mx
    from mxnet import image, recordio
    from mxnet.gluon.data.vision import ImageRecordDataset

    from .images import JPEG_CROP, MEAN, STD

    base = ImageRecordDataset(rec_path)
    payloads = [recordio.unpack(_raw(base, i))[1] for i in range(count)]
    sums = dict.fromkeys(("imdecode", "crop (slice)", "imresize", "flip", "to_tensor",
                          "normalize"), 0.0)  # fmt: skip
    clock = time.perf_counter
    rng = np.random.default_rng(0)
    for payload in payloads:
        t0 = clock()
        x = image.imdecode(payload, 1)
        x.wait_to_read()
        t1 = clock()
        h, w = x.shape[:2]
        ch, cw = int(h * rng.uniform(0.5, 1.0)), int(w * rng.uniform(0.5, 1.0))
        y0, x0 = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        x = mx.nd.slice(x, begin=(y0, x0, 0), end=(y0 + ch, x0 + cw, 3))
        x.wait_to_read()
        t2 = clock()
        x = image.imresize(x, JPEG_CROP, JPEG_CROP, 1)
        x.wait_to_read()
        t3 = clock()
        x = mx.nd.image.flip_left_right(x)
        x.wait_to_read()
        t4 = clock()
        x = mx.nd.image.to_tensor(x)
        x.wait_to_read()
        t5 = clock()
        x = mx.nd.image.normalize(x, mean=MEAN, std=STD)
        x.wait_to_read()
        t6 = clock()
        for name, span in zip(sums, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
            sums[name] += span
    return {name: total / count * 1e3 for name, total in sums.items()}


def _raw(base: Any, i: int) -> bytes:
    return base._record.read_idx(base._record.keys[i % len(base)])


def _single(rec_path: str, count: int) -> Dict[str, Any]:
    dataset = ProfiledJpegDataset(rec_path)
    for i in range(10):
        dataset[i]
    _reset()
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(count):
        dataset[i % len(dataset)]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stages = {s: v / count * 1e3 for s, v in _TIMES.items() if s != "stack"}
    return {"stages_ms": stages, "wall_ms": wall / count * 1e3, "cpu_ms": cpu / count * 1e3}


def _in_workers(rec_path: str, num_workers: int, batches: int) -> Dict[str, Any]:
    """Stage sums from shardloader's workers, and the loop's wall time, over ``batches``
    batches after a warm-up epoch's first 4."""
    from shardloader import ShardedDataLoader

    dataset = ProfiledJpegDataset(rec_path)
    loader = ShardedDataLoader(
        dataset,
        batch_size=64,
        shuffle=True,
        num_workers=num_workers,
        batchify_fn=_TimedBatchify(),
    )
    sums = np.zeros(len(STAGES) + 1)
    samples = got = 0
    waited = 0.0
    try:
        it = iter(loader)
        for _ in range(4):  # warm-up: worker start-up, first calls
            next(it)
        start = time.perf_counter()
        while got < batches:
            asked = time.perf_counter()
            try:
                data, _label, timing = next(it)
            except StopIteration:
                it = iter(loader)
                continue
            data.wait_to_read()
            waited += time.perf_counter() - asked
            row = timing.asnumpy()[0]
            if not np.isnan(row[-1]):
                sums += row
            samples += data.shape[0]
            got += 1
        wall = time.perf_counter() - start
    finally:
        loader.close()
    per = {s: sums[k] / samples * 1e3 for k, s in enumerate(STAGES)}
    busy = sum(per.values())
    return {
        "stages_ms": per,
        "worker_busy_ms": busy,
        "worker_cpu_ms": sums[-1] / samples * 1e3,
        "wall_ms": wall / samples * 1e3,
        "waited_ms": waited / samples * 1e3,
        "num_workers": num_workers,
        "samples": samples,
        "img_per_s": samples / wall,
    }


def _child(args: argparse.Namespace) -> None:
    """One engine's measurements, printed as JSON on the last line."""
    out = {
        "engine": os.environ.get("MXNET_ENGINE_TYPE", "ThreadedEnginePerDevice"),
        "single": _single(args.rec, args.samples),
        "unfused_ms": _unfused(args.rec, args.samples),
        "workers": _in_workers(args.rec, 2, args.batches),
    }
    print(json.dumps(out))


def _table(results: Sequence[Dict[str, Any]]) -> str:
    engines = [r["engine"] for r in results]
    lines = [
        "ms per image           " + "".join(f"{e[:22]:>24}" for e in engines),
        "-" * (23 + 24 * len(engines)),
        "one process, stage by stage:",
    ]

    def row(label: str, values: Sequence[Optional[float]]) -> None:
        cells = "".join(f"{'-' if v is None else f'{v:.3f}':>24}" for v in values)
        lines.append(f"  {label:<21}{cells}")

    for stage in STAGES[:-1]:
        row(stage, [r["single"]["stages_ms"][stage] for r in results])
    row("wall (sum)", [r["single"]["wall_ms"] for r in results])
    row("CPU, all threads", [r["single"]["cpu_ms"] for r in results])
    lines.append("one process, the operators unfused:")
    for op in results[0]["unfused_ms"]:
        row(op, [r["unfused_ms"][op] for r in results])
    lines.append("in shardloader's 2 worker processes (per image, summed in each worker):")
    for stage in STAGES:
        row(stage, [r["workers"]["stages_ms"][stage] for r in results])
    row("worker busy (sum)", [r["workers"]["worker_busy_ms"] for r in results])
    row("worker CPU", [r["workers"]["worker_cpu_ms"] for r in results])
    row("busy / 2 workers", [r["workers"]["worker_busy_ms"] / 2 for r in results])
    row("loop wall", [r["workers"]["wall_ms"] for r in results])
    row("loop waiting", [r["workers"]["waited_ms"] for r in results])
    row(
        "wall - busy/2",
        [r["workers"]["wall_ms"] - r["workers"]["worker_busy_ms"] / 2 for r in results],
    )
    lines.append("")
    lines.append(
        "img/s in workers: "
        + ", ".join(f"{r['engine']} {r['workers']['img_per_s']:,.0f}" for r in results)
    )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_w5", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="256 images, fewer samples")
    parser.add_argument("--engines", default="threaded,naive", help="comma-separated")
    parser.add_argument("--rec", help=argparse.SUPPRESS)  # set for the child processes
    parser.add_argument("--samples", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(_HERE, "results"), help="results folder")
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    from .images import jpeg_records
    from .workloads import WORKLOADS

    n = WORKLOADS["W5"].quick_samples if args.quick else WORKLOADS["W5"].samples
    rec = jpeg_records(os.path.join(args.out, "data"), n)
    samples, batches = (64, 8) if args.quick else (300, 24)
    results = []
    for name in args.engines.split(","):
        env = dict(os.environ, MXNET_ENGINE_TYPE=_ENGINES[name.strip()])
        cmd = [sys.executable, "-m", "benchmarks.profile_w5", "--child", "--rec", rec]
        cmd += ["--samples", str(samples), "--batches", str(batches)]
        proc = subprocess.run(cmd, cwd=_ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(_table(results))
    path = os.path.join(args.out, "profile_w5.json")
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {os.path.relpath(path, _ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
