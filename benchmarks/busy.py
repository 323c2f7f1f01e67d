"""W5 against ``mx.io.ImageRecordIter`` on a busy machine: paired rounds beside each background.

For each background of :mod:`benchmarks.background` (``none``, ``train``, ``loader``), started
once and kept in its steady state for all its rounds, every round measures, each in a fresh
process (:func:`benchmarks.harness.run_isolated`, W5's full epoch timed after a warm-up one):

- ``ours``: ``ShardedDataLoader`` on W5 (Gluon's ``ImageRecordDataset`` and its four
  transforms, the fused path), 2 process workers, batch 64;
- ``recorditer``: ``mx.io.ImageRecordIter`` on W5's file, ``preprocess_threads=2``;
- ``ours-cv2pool`` (with ``--cv2-pool``): ``ours`` with ``SHARDLOADER_CV2_THREADS=keep``, each
  worker keeping OpenCV's own thread pool: the loader as it was before workers ran OpenCV on
  one thread (docs/vision.md).
- ``ours-whole`` (with ``--whole-decode``): ``ours`` with ``SHARDLOADER_REGION_DECODE=0``,
  decoding whole images instead of the crop's region (docs/vision.md).
- ``ours-opencv-write`` (with ``--opencv-write``): ``ours`` with
  ``SHARDLOADER_NATIVE_WRITE=0``, writing each image into the batch OpenCV's way (a flip, a
  split, a lookup per plane) instead of ``_write.c``'s one pass (docs/vision.md).

The order of the loaders alternates from round to round. A round's ratio is ours over
recorditer in that round; the table gives each background's median ratio and its spread
(lowest to highest), the median rates, the load average around the rounds and the
background's own rate. The JSON (every run) goes to ``--out``.

    python -m benchmarks.busy --background none train train-job loader --rounds 5 --cv2-pool
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence

from .background import BACKGROUNDS, background

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)

# Variants of ours, each compared with ours in the same round: its option, what it changes
# (the table's words), and the environment it runs ours with.
VARIANTS = {
    "ours-cv2pool": ("--cv2-pool", "OpenCV pool kept", {"SHARDLOADER_CV2_THREADS": "keep"}),
    "ours-whole": ("--whole-decode", "whole decode", {"SHARDLOADER_REGION_DECODE": "0"}),
    "ours-opencv-write": ("--opencv-write", "OpenCV's write", {"SHARDLOADER_NATIVE_WRITE": "0"}),
}
_LOADERS = {
    "ours": {"loader": "ours", "env": {}},
    "recorditer": {"loader": "recorditer", "env": {}},
    **{name: {"loader": "ours", "env": env} for name, (_, _, env) in VARIANTS.items()},
}


def _case(name: str, rec: str, samples: Optional[int], workers: int) -> Dict[str, Any]:
    spec = _LOADERS[name]
    case = {"workload": "W5", "loader": spec["loader"], "num_workers": workers, "rec_path": rec}
    if samples is not None:
        case["samples"] = samples
    if spec["env"]:
        case["env"] = spec["env"]
    return case


def run_background(
    name: str,
    rec: str,
    loaders: Sequence[str],
    rounds: int,
    samples: Optional[int] = None,
    workers: int = 2,
    log: Any = print,
) -> Dict[str, Any]:
    """``rounds`` paired rounds of ``loaders`` beside the background ``name``."""
    from .harness import run_isolated

    runs: List[Dict[str, Any]] = []
    with background(name, rec=rec) as bg:
        load_before = os.getloadavg()
        for r in range(rounds):
            order = list(loaders) if r % 2 == 0 else list(reversed(loaders))
            for loader in order:
                result = run_isolated(_case(loader, rec, samples, workers), timeout_s=300)
                rate = result.get("samples_per_s")
                runs.append({"round": r, "loader": loader, **_brief(result)})
                shown = f"{rate:8.1f} img/s" if rate else f"error: {result.get('error')}"
                log(f"  [{name}] round {r + 1}/{rounds} {loader:>13}: {shown}")
        load_after = os.getloadavg()
    return {
        "background": name,
        "what": bg["what"],
        "background_steps_per_s": bg.get("steps_per_s"),
        "background_killed": bg.get("killed"),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "runs": runs,
        "summary": summarise(runs, loaders),
    }


def _brief(result: Dict[str, Any]) -> Dict[str, Any]:
    keep = ("samples_per_s", "epochs", "samples", "timed_s", "foreign_cores", "error")
    return {k: result[k] for k in keep if k in result}


def summarise(runs: List[Dict[str, Any]], loaders: Sequence[str]) -> Dict[str, Any]:
    """Median rate per loader, and per round the ratio of each loader to recorditer."""
    by_round: Dict[int, Dict[str, float]] = {}
    for run in runs:
        if run.get("samples_per_s"):
            by_round.setdefault(run["round"], {})[run["loader"]] = run["samples_per_s"]
    out: Dict[str, Any] = {}
    for loader in loaders:
        rates = [r[loader] for r in by_round.values() if loader in r]
        out[loader] = {"median_img_s": statistics.median(rates) if rates else None}
        if loader == "recorditer":
            continue
        ratios = [
            r[loader] / r["recorditer"]
            for r in by_round.values()
            if {loader, "recorditer"} <= r.keys()
        ]
        out[loader].update(_spread("ratio", ratios))
    paired = {v: [r for r in by_round.values() if {"ours", v} <= r.keys()] for v in VARIANTS}
    out["gains"] = {
        v: _spread("gain", [r["ours"] / r[v] for r in paired[v]]) for v in VARIANTS if v in loaders
    }
    return out


def _spread(key: str, values: List[float]) -> Dict[str, Any]:
    if not values:
        return {key: None}
    return {
        key: statistics.median(values),
        f"{key}_min": min(values),
        f"{key}_max": max(values),
        f"{key}s": values,
    }


def table(results: List[Dict[str, Any]], loaders: Sequence[str]) -> str:
    """The results as a markdown table (one row per background)."""
    variants = [v for v in VARIANTS if v in loaders]
    head = [
        "beside the loaders",
        "ours img/s",
        "ImageRecordIter img/s",
        "ratio (median)",
        "ratio spread",
    ]
    for variant in variants:
        head += [f"ours, {VARIANTS[variant][1]}: ratio", f"ours over it ({VARIANTS[variant][1]})"]
    head += ["load average (1 min) before / after", "background steps/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for res in results:
        s = res["summary"]
        ours, rec = s["ours"], s["recorditer"]
        row = [
            res["background"],
            _num(ours["median_img_s"], 0),
            _num(rec["median_img_s"], 0),
            _num(ours.get("ratio"), 2, "×"),
            f"{_num(ours.get('ratio_min'), 2)}–{_num(ours.get('ratio_max'), 2)}",
        ]
        for variant in variants:
            row += [
                _num(s[variant].get("ratio"), 2, "×"),
                _num(s["gains"][variant].get("gain"), 2, "×"),
            ]
        row += [
            f"{res['loadavg_before'][0]:.2f} / {res['loadavg_after'][0]:.2f}",
            _num(res["background_steps_per_s"], 2),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _num(value: Optional[float], digits: int, unit: str = "") -> str:
    return "—" if value is None else f"{value:,.{digits}f}{unit}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.busy", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--background", nargs="+", choices=BACKGROUNDS, default=list(BACKGROUNDS))
    parser.add_argument("--rounds", type=int, default=5)
    for option, words, env in VARIANTS.values():
        settings = " ".join(f"{key}={value}" for key, value in env.items())
        parser.add_argument(
            option, action="store_true", help=f"also run ours, {words} ({settings})"
        )
    parser.add_argument("--samples", type=int, help="W5 images (default: all 2,048)")
    parser.add_argument("--rec", help="W5's .rec (default: written under --out/data)")
    parser.add_argument("--out", default=os.path.join(_HERE, "results"), help="results folder")
    args = parser.parse_args(argv)
    from .images import jpeg_records
    from .workloads import WORKLOADS

    rec = args.rec or jpeg_records(os.path.join(args.out, "data"), WORKLOADS["W5"].samples)
    loaders = ["ours", "recorditer"]
    loaders += [
        v for v, (option, _, _) in VARIANTS.items() if getattr(args, option[2:].replace("-", "_"))
    ]
    started = datetime.datetime.now(datetime.timezone.utc)
    results = []
    for name in args.background:
        print(f"beside {name}:", flush=True)
        results.append(run_background(name, rec, loaders, args.rounds, args.samples, log=_flush))
    print()
    print(table(results, loaders))
    meta = {
        "started_utc": started.isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "rec": rec,
        "samples": args.samples,
        "workers": 2,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"busy-{started:%Y%m%d-%H%M}.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    print(f"\nwrote {os.path.relpath(path, _ROOT)}")
    return 0


def _flush(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
