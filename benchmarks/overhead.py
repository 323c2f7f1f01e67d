"""``python -m benchmarks.overhead REV [REV ...]``: W1's time per batch, paired across revisions.

W1 (64 float32 and a label per sample, batches of 32, 2 process workers) measures what the
loader itself costs per batch. This compares that cost across git revisions of shardloader
in one run, with Gluon's DataLoader on the same data as the reference:

* each revision's ``shardloader`` package is extracted once (``git archive``) into a
  temporary directory;
* a round runs every revision and Gluon once, each in a fresh process, in an order that
  alternates between rounds; a run makes one warm-up epoch, then times ``--epochs`` epochs
  of the loop ``for x, y in loader: pass``;
* the report gives each one's median microseconds per batch with its range, each
  revision's speed-up over Gluon and its ratio to the first revision, both paired by round
  (medians of the per-round ratios, with their ranges).

The dataset and the loop are this checkout's (``benchmarks.workloads.TinyDataset``), so
every revision loads exactly the same thing.

Examples
--------
    python -m benchmarks.overhead 216df86 HEAD            # before the refactor, and now
    python -m benchmarks.overhead --rounds 7 HEAD~3 HEAD
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)

# What one measurement runs, in a fresh process: argv[1] is "gluon" or the directory that
# holds a revision's shardloader package, argv[2] the epochs to time, argv[3] the samples.
_CHILD = r"""
import json, sys, time
which, epochs, samples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if which != "gluon":
    sys.path.insert(0, which)
from benchmarks.workloads import TinyDataset
if which == "gluon":
    from mxnet.gluon.data import DataLoader
else:
    import shardloader
    assert shardloader.__file__.startswith(which), shardloader.__file__
    DataLoader = shardloader.DataLoader
loader = DataLoader(TinyDataset(samples), batch_size=32, shuffle=True, num_workers=2)
for _ in loader:
    pass
batches, start = 0, time.perf_counter()
for _ in range(epochs):
    for x, y in loader:
        batches += 1
print(json.dumps({"us": (time.perf_counter() - start) / batches * 1e6}))
"""


def _extract(rev: str, target: str) -> str:
    """``rev``'s shardloader package, under ``target``; returns ``target``."""
    os.makedirs(target)
    archive = subprocess.run(
        ["git", "-C", _ROOT, "archive", rev, "shardloader"], capture_output=True
    )
    if archive.returncode != 0:
        raise SystemExit(
            f"cannot read shardloader at revision {rev!r}: {archive.stderr.decode().strip()}"
        )
    subprocess.run(["tar", "-x", "-C", target], input=archive.stdout, check=True)
    return target


def _measure(which: str, epochs: int, samples: int) -> float:
    env = dict(os.environ, PYTHONPATH=_ROOT)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, which, str(epochs), str(samples)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=_ROOT,
        timeout=600,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["us"]


def _summary(values: Sequence[float], digits: int = 0) -> str:
    fmt = f"{{:.{digits}f}}"
    return (
        f"{fmt.format(statistics.median(values))} "
        f"({fmt.format(min(values))}-{fmt.format(max(values))})"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__)
    parser.add_argument("revs", nargs="+", help="git revisions to compare (the first is the base)")
    parser.add_argument("--rounds", type=int, default=5, help="paired rounds (default 5)")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per run (default 3)")
    parser.add_argument(
        "--samples", type=int, default=20_000, help="samples per epoch (default 20000, as W1)"
    )
    args = parser.parse_args(argv)
    for option in ("rounds", "epochs", "samples"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be >= 1, got {getattr(args, option)}")
    if len(set(args.revs)) < len(args.revs) or "gluon" in args.revs:
        parser.error(f"revs must be distinct and not 'gluon', got {args.revs}")
    names = list(args.revs) + ["gluon"]
    times: Dict[str, List[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="shardloader-overhead-") as tmp:
        where = {rev: _extract(rev, os.path.join(tmp, str(i))) for i, rev in enumerate(args.revs)}
        where["gluon"] = "gluon"
        for round_ in range(args.rounds):
            order = names if round_ % 2 == 0 else names[::-1]
            for name in order:
                times[name].append(_measure(where[name], args.epochs, args.samples))
            line = ", ".join(f"{n} {times[n][-1]:.0f}" for n in names)
            print(f"round {round_ + 1}/{args.rounds}: us per batch: {line}", flush=True)
    base = times[names[0]]
    print(f"\nW1, 2 process workers, us per batch over {args.rounds} rounds: median (range)")
    gluon = times["gluon"]
    for name in names:
        ratios = ""
        if name != "gluon":
            speedup = [g / t for g, t in zip(gluon, times[name])]
            ratios = f"   Gluon's time / this: {_summary(speedup, 2)}x"
        if name not in (names[0], "gluon"):
            paired = [t / b for t, b in zip(times[name], base)]
            ratios += f"   this / {names[0]}: {_summary(paired, 2)}"
        print(f"  {name:>12}: {_summary(times[name])}{ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
