"""``python -m benchmarks.gpu``: placement on a GPU, shardloader against Gluon's recipe.

What a Gluon user does to get batches onto a GPU is ``split_and_load`` on every batch, with
or without ``pin_memory=True``. shardloader also takes ``ctx=`` (one device, or one per
shard), which copies on a background thread ahead of the loop. This measures each way on
the same data, in paired rounds (a fresh process per run, the order alternating between
rounds), and reports samples per second and each way's ratio to Gluon's plain recipe.

Workloads (the data of :mod:`benchmarks.workloads`, shuffled, ``--workers`` process workers):

* W1: 64 float32 and a label per sample, batches of 32: the per-batch cost of placement;
* W2: uint8 3x224x224 images, batches of 64 (9.6 MB): the copy itself;
* W4: W2 as two shards of 32 for two devices. With one GPU both shards go to ``gpu(0)``:
  the same two copies a step as on two devices, against ``split_and_load`` onto the same
  two contexts.

Ways (``VARIANTS``): ``gluon`` (Gluon's DataLoader, then ``split_and_load``), ``gluon-pin``
(the same with ``pin_memory=True``), ``ours`` and ``ours-pin`` (shardloader as a drop-in,
the loop unchanged), ``ours-ctx`` (shardloader with ``ctx=``; no ``split_and_load``). Every
step is waited for on the device (``wait_to_read``), and the first step of every epoch is
checked to be on the right device.

``--device cpu`` runs the same cells on ``mx.cpu(1)`` (what the tests and a machine without
a GPU can run); the published figures are from ``--device gpu`` (docs/benchmarks.md, "On a
GPU").

Examples
--------
    python -m benchmarks.gpu --rounds 3 --out gpu.json
    python -m benchmarks.gpu --device cpu --rounds 1 --samples 2048
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .workloads import WORKLOADS, ImageDataset, TinyDataset

__all__ = ["CELLS", "VARIANTS", "placement", "main"]

VARIANTS = ("gluon", "gluon-pin", "ours", "ours-pin", "ours-ctx")
# Gluon has no sharded loader, so W4's drop-in rows would be Gluon's recipe again.
CELLS: Tuple[Tuple[str, str], ...] = tuple(
    [(w, v) for w in ("W1", "W2") for v in VARIANTS]
    + [("W4", v) for v in ("gluon", "gluon-pin", "ours-ctx")]
)
_SAMPLES = {"W1": 20_000, "W2": 2_048, "W4": 2_048}


def _contexts(device: str, workload: str) -> List[Any]:
    import mxnet as mx

    one = mx.gpu(0) if device == "gpu" else mx.cpu(1)
    return [one, one] if workload == "W4" else [one]


def _flat_arrays(step: Any) -> List[Any]:
    if isinstance(step, (list, tuple)):
        return [a for part in step for a in _flat_arrays(part)]
    return [step]


def _build(
    workload: str, variant: str, device: str, workers: int, samples: int
) -> Tuple[Callable[[], Any], Optional[Callable[[Any], Any]], Callable[[Any], None]]:
    """The loader factory, the loop's per-step work (``split_and_load``) and the check."""
    from mxnet.gluon.data import DataLoader as GluonLoader
    from mxnet.gluon.utils import split_and_load

    from shardloader import ShardedDataLoader

    ctxs = _contexts(device, workload)
    dataset = TinyDataset(samples) if workload == "W1" else ImageDataset(samples)
    batch = WORKLOADS[workload].batch_size
    common: Dict[str, Any] = {"shuffle": True, "num_workers": workers}
    adapt: Optional[Callable[[Any], Any]] = None
    if variant == "ours-ctx":
        if workload == "W4":
            common.update(batch_size=batch // 2, num_shards=2, ctx=ctxs)
        else:
            common.update(batch_size=batch, ctx=ctxs[0])

        def factory() -> Any:
            return ShardedDataLoader(dataset, **common)

    else:
        cls = GluonLoader if variant.startswith("gluon") else ShardedDataLoader
        common.update(batch_size=batch, pin_memory=variant.endswith("-pin"))

        def factory() -> Any:
            return cls(dataset, **common)

        def adapt(step: Any) -> Any:
            data, label = step
            return list(zip(split_and_load(data, ctxs), split_and_load(label, ctxs)))

    def check(step: Any) -> None:  # the step as the loop sees it: after adapt
        placed = _flat_arrays(step)
        wrong = [a.context for a in placed if a.context != ctxs[0]]
        if len(placed) != 2 * len(ctxs) or wrong:
            raise RuntimeError(
                f"{workload} {variant}: {len(placed)} arrays, expected {2 * len(ctxs)} on "
                f"{ctxs[0]}; found some on {wrong}"
            )

    return factory, adapt, check


def placement(
    workload: str, variant: str, device: str, workers: int, samples: int, min_time_s: float
) -> Dict[str, Any]:
    """One cell, timed by :func:`benchmarks.harness.time_loader` (run in a fresh process by
    :func:`benchmarks.harness.run_isolated`, as the task ``placement``)."""
    from .harness import time_loader

    if device == "gpu":
        import mxnet as mx

        if mx.context.num_gpus() < 1:
            raise RuntimeError("--device gpu, but MXNet sees no GPU (mx.context.num_gpus() == 0)")
    factory, adapt, check = _build(workload, variant, device, workers, samples)
    return time_loader(
        factory, adapt=adapt, check=check, expect_samples=samples, min_time_s=min_time_s
    )


def _summary(values: Sequence[float], digits: int = 0) -> str:
    fmt = f"{{:,.{digits}f}}"
    return (
        f"{fmt.format(statistics.median(values))} "
        f"({fmt.format(min(values))}-{fmt.format(max(values))})"
    )


def _report(runs: Dict[str, List[Dict[str, Any]]], rounds: int) -> str:
    lines = [
        "| workload | way | samples/s, median (range) | / gluon, paired | / gluon-pin, paired |",
        "|---|---|---|---|---|",
    ]
    for workload, variant in CELLS:
        mine = runs[f"{workload} {variant}"]
        rate = [r.get("samples_per_s") for r in mine]
        if any(v is None for v in rate):
            errors = sorted({r.get("error", "?") for r in mine if "error" in r})
            lines.append(f"| {workload} | {variant} | failed: {'; '.join(errors)} | | |")
            continue
        cells = [_summary(rate)]
        for base in ("gluon", "gluon-pin"):
            theirs = [r.get("samples_per_s") for r in runs[f"{workload} {base}"]]
            paired = [m / t for m, t in zip(rate, theirs) if t]
            cells.append(f"{_summary(paired, 2)}x" if len(paired) == rounds else "")
        lines.append(f"| {workload} | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__)
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds (default 3)")
    parser.add_argument("--workers", type=int, default=4, help="process workers (default 4)")
    parser.add_argument(
        "--samples", type=int, default=None, help="samples per epoch (default: W1 20000, W2 2048)"
    )
    parser.add_argument(
        "--min-time-s", type=float, default=0.5, help="timed epochs add up to this (default 0.5)"
    )
    parser.add_argument("--out", default=None, help="write every run's result here (JSON)")
    args = parser.parse_args(argv)
    for option in ("rounds", "workers", "samples"):
        value = getattr(args, option)
        if value is not None and value < 1:
            parser.error(f"--{option} must be >= 1, got {value}")
    if args.min_time_s <= 0:
        parser.error(f"--min-time-s must be > 0, got {args.min_time_s}")
    from .harness import run_isolated

    runs: Dict[str, List[Dict[str, Any]]] = {f"{w} {v}": [] for w, v in CELLS}
    for round_ in range(args.rounds):
        order = CELLS if round_ % 2 == 0 else CELLS[::-1]
        for workload, variant in order:
            samples = args.samples or _SAMPLES[workload]
            task = {
                "task": "placement",
                "workload": workload,
                "variant": variant,
                "device": args.device,
                "workers": args.workers,
                "samples": samples - samples % WORKLOADS[workload].batch_size,
                "min_time_s": args.min_time_s,
            }
            result = run_isolated(task, timeout_s=120.0)
            runs[f"{workload} {variant}"].append(result)
            rate = result.get("samples_per_s")
            said = f"{rate:,.0f} samples/s" if rate else f"ERROR {result.get('error')}"
            print(f"[{round_ + 1}/{args.rounds}] {workload} {variant:<9} {said}", flush=True)
    print()
    print(_report(runs, args.rounds))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f, indent=1)
    failed = [key for key, results in runs.items() if any("error" in r for r in results)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
