"""``python -m benchmarks.peers``: shardloader against the image loaders a user would pick
instead, side by side, in the same run.

On W7's JPEG folder: shardloader (fused), Gluon's ``DataLoader`` (the anchor), PyTorch's
``DataLoader`` with torchvision's own pipeline (``decode_jpeg``, ``transforms.v2`` on uint8
tensors) and FFCV on its ``.beton`` written from the same JPEGs. On W5's ``.rec``:
shardloader (fused, float32 and uint8 output) and ``mx.io.ImageRecordIter``; torchvision
has no reader for it. Every loader: ``RandomResizedCrop(224)``, random horizontal flip,
float32 normalised with ImageNet's mean and std (shardloader's uint8 row leaves that to the
device), batch 64, shuffled, two workers.

The run goes in rounds. A round runs every loader once, each in a fresh process, in an
order that reverses from one round to the next, so the loaders of a pair are measured
minutes apart at most and the ratios are taken within a round (median and min-max over
rounds). The MXNet loaders run in processes forked from :mod:`benchmarks.harness`'s fork
server and are timed by :func:`~benchmarks.harness.time_loader`; the peers run in their own
venv (``.venv-peers``: ``make bench-peers`` makes it) through
``benchmarks/peers_runner.py``, which times them the same way and imports nothing of
MXNet's. Each round also measures the **decode bound** right beside W5's shardloader run,
just before and just after it: one process's decode + crop in the fused code
(:func:`benchmarks.images.fused_per_sample`). The fraction of that round's loader rate over
``workers x`` the bound (the mean of the two probes) is reported per round.

Examples
--------
    python -m benchmarks.peers                      # 3 rounds, about 4 minutes on 2 cores
    python -m benchmarks.peers --rounds 5
    python -m benchmarks.peers --loaders w7-ours,w7-torch --rounds 2
    python -m benchmarks.peers --background train   # beside a CNN training on the CPU

It prints a markdown table and writes it, with every run, to ``<out>/peers[-BACKGROUND].md``
and ``.json`` (``benchmarks/results/`` by default; W5's and W7's JPEGs are cached under its
``data/``, shared with ``benchmarks.run``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .background import BACKGROUNDS, background
from .harness import run_isolated
from .summary import median
from .tables import fmt

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_RUNNER = os.path.join(_HERE, "peers_runner.py")
PEERS_PYTHON = os.path.join(_ROOT, ".venv-peers", "bin", "python")
WORKERS = 2
_N = 2048  # W5's and W7's images
_TIMEOUT_S = 240.0
_FLOOR_IMAGES = 384

# id -> (what the tables call it, the data it reads, how it runs it)
LOADERS: Dict[str, Tuple[str, str, str]] = {
    "w7-ours": ("shardloader (fused)", "W7", "mxnet"),
    "w7-torch": ("torchvision + torch DataLoader", "W7", "peer"),
    "ffcv": ("FFCV (.beton of W7's JPEGs)", "W7", "peer"),
    "w7-gluon": ("Gluon DataLoader", "W7", "mxnet"),
    "w5-ours": ("shardloader (fused)", "W5", "mxnet"),
    "w5-uint8": ("shardloader, uint8 output", "W5", "mxnet"),
    "w5-recorditer": ("mx.io.ImageRecordIter", "W5", "mxnet"),
}
FLOOR = "floor"  # the decode bound's probe, run before and after w5-ours
# The Case each MXNet loader id runs (benchmarks.workloads).
_CASES = {
    "w7-ours": ("W7", "ours"),
    "w7-gluon": ("W7", "gluon"),
    "w5-ours": ("W5", "ours"),
    "w5-uint8": ("W5", "ours-uint8"),
    "w5-recorditer": ("W5", "recorditer"),
}
# (name, top, base, need): paired ratios of img/s, and the targets (None: shown only).
RATIOS: Tuple[Tuple[str, str, str, Optional[float]], ...] = (
    ("W7 shardloader / torchvision", "w7-ours", "w7-torch", 1.5),
    ("W7 shardloader / FFCV", "w7-ours", "ffcv", 1.0),
    ("W5 shardloader / FFCV", "w5-ours", "ffcv", 1.0),
    ("W5 shardloader / ImageRecordIter", "w5-ours", "w5-recorditer", 2.5),
    ("W5 shardloader uint8 / ImageRecordIter", "w5-uint8", "w5-recorditer", None),
    ("W7 shardloader / Gluon", "w7-ours", "w7-gluon", None),
    ("W7 torchvision / Gluon", "w7-torch", "w7-gluon", None),
    ("W7 FFCV / torchvision", "ffcv", "w7-torch", None),
)
FRACTION_NEED = 0.85
FRACTION_SPREAD = 0.1


# ---------------------------------------------------------------------------- the plan
def round_order(loaders: Sequence[str], round_: int) -> List[str]:
    """The runs of round ``round_``: ``loaders`` in their order (reversed in odd rounds),
    with the decode bound's probe just before and just after ``w5-ours``."""
    order: List[str] = []
    for loader in loaders if round_ % 2 == 0 else list(reversed(loaders)):
        order += [FLOOR, loader, FLOOR] if loader == "w5-ours" else [loader]
    return order


def parse_loaders(text: str) -> List[str]:
    """``--loaders``: comma-separated ids, in :data:`LOADERS`' order; ValueError names the
    unknown ones and the ids there are."""
    asked = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in asked if x not in LOADERS]
    if unknown or not asked:
        raise ValueError(
            f"--loaders takes a comma-separated list of {', '.join(LOADERS)}; "
            f"got {text!r}" + (f" ({', '.join(unknown)} unknown)" if unknown else "")
        )
    return [x for x in LOADERS if x in asked]


# ---------------------------------------------------------------------------- statistics
def rates(runs: Sequence[Dict[str, Any]], loader: str) -> Dict[int, float]:
    """``loader``'s img/s per round, over the runs that did not fail."""
    return {
        r["round"]: r["result"]["samples_per_s"]
        for r in runs
        if r["loader"] == loader and "error" not in r["result"]
    }


def paired(top: Dict[int, float], base: Dict[int, float]) -> Dict[str, Any]:
    """``top / base`` in every round that has both: median, min, max and per round."""
    per_round = {k: top[k] / base[k] for k in sorted(top) if base.get(k)}
    values = list(per_round.values())
    return {
        "median": median(values),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "per_round": per_round,
    }


def _result(runs: Sequence[Dict[str, Any]], loader: str, round_: int) -> Dict[str, Any]:
    for r in runs:
        if r["loader"] == loader and r["round"] == round_ and "error" not in r["result"]:
            return r["result"]
    return {}


def bounds(runs: Sequence[Dict[str, Any]], workers: int = WORKERS) -> Dict[int, Dict[str, Any]]:
    """Per round: the decode bound, from its probes, and how near W5's and W7's shardloader
    runs came to it.

    The probes run just before and just after the loader. Load from elsewhere only ever
    slows a probe down, so each bound takes the faster of the two:

    - ``bound``: ``workers`` over the lone process's time per image (the issue's definition);
    - ``bound_together``: the img/s of ``workers`` probes at once (the same load, caches and
      memory bandwidth as the workers);
    - ``fraction``, ``fraction_together``: the loader's img/s over each;
    - ``cpu_fraction``: the lone probe's CPU time per image over the loader's (all its
      processes): the share of the loader's CPU that decode + crop itself takes, a figure
      that other load changes little;
    - ``cores``: the cores the loader kept busy (img/s x CPU per image).
    """
    out: Dict[int, Dict[str, Any]] = {}
    for r in runs:
        if r["loader"] == FLOOR and "error" not in r["result"]:
            entry = out.setdefault(
                r["round"], {"probe_ms": [], "probe_cpu_ms": [], "together_per_s": []}
            )
            entry["probe_ms"].append(r["result"]["s_per_sample"] * 1e3)
            entry["probe_cpu_ms"].append(r["result"]["cpu_per_sample"] * 1e3)
            if "together_per_s" in r["result"]:
                entry["together_per_s"].append(r["result"]["together_per_s"])
    for round_, entry in out.items():
        together = entry["together_per_s"]
        entry["bound"] = workers * 1e3 / min(entry["probe_ms"])
        entry["bound_together"] = max(together) if together else None
        for key in ("fraction", "fraction_together", "cpu_fraction", "cores"):
            entry[key] = {}
        for loader in ("w5-ours", "w7-ours"):
            res = _result(runs, loader, round_)
            rate, cpu_ms = res.get("samples_per_s"), res.get("cpu_ms_per_sample")
            entry["cores"][loader] = _cores(res)
            for key, bound in (
                ("fraction", entry["bound"]),
                ("fraction_together", entry["bound_together"]),
            ):
                entry[key][loader] = rate / bound if rate and bound else None
            entry["cpu_fraction"][loader] = min(entry["probe_cpu_ms"]) / cpu_ms if cpu_ms else None
    return out


def fraction_summary(
    per_round: Dict[int, Dict[str, Any]], loader: str, key: str = "fraction"
) -> Dict[str, Any]:
    """A fraction of the decode bound (``key``: ``fraction`` or ``fraction_together``) over
    rounds: median, min-max, and whether every round is within ±:data:`FRACTION_SPREAD` of
    the median (``steady``)."""
    values = [e[key][loader] for e in per_round.values() if e[key].get(loader) is not None]
    mid = median(values)
    steady = None if mid is None else all(abs(v - mid) <= FRACTION_SPREAD for v in values)
    return {
        "median": mid,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "steady": steady,
    }


def _cores(result: Dict[str, Any]) -> Optional[float]:
    """The cores a run kept busy: img/s x CPU seconds per image."""
    rate, cpu_ms = result.get("samples_per_s"), result.get("cpu_ms_per_sample")
    return rate * cpu_ms / 1e3 if rate and cpu_ms else None


def summarise(runs: Sequence[Dict[str, Any]], loaders: Sequence[str]) -> Dict[str, Any]:
    """Medians per loader, the paired ratios of :data:`RATIOS` and the decode bound."""
    per_loader = {}
    for loader in loaders:
        mine = rates(runs, loader)
        errors = [
            r["result"]["error"] for r in runs if r["loader"] == loader and "error" in r["result"]
        ]
        per_loader[loader] = {
            "median": median(list(mine.values())),
            "min": min(mine.values()) if mine else None,
            "max": max(mine.values()) if mine else None,
            "rounds": len(mine),
            "errors": errors,
            "cpu_ms": median(
                [r["result"].get("cpu_ms_per_sample") for r in runs if r["loader"] == loader]
            ),
            "cores": median([_cores(r["result"]) for r in runs if r["loader"] == loader]),
            "foreign_cores": median(
                [r["result"].get("foreign_cores") for r in runs if r["loader"] == loader]
            ),
        }
    ratios = {}
    for name, top, base, need in RATIOS:
        if top in loaders and base in loaders:
            ratio = paired(rates(runs, top), rates(runs, base))
            ratio["need"] = need
            ratios[name] = ratio
    per_round = bounds(runs)
    return {
        "loaders": per_loader,
        "ratios": ratios,
        "bound_per_round": per_round,
        "fraction": {
            f"{loader} {key}": fraction_summary(per_round, loader, key)
            for key in ("fraction", "fraction_together", "cpu_fraction")
            for loader in ("w5-ours", "w7-ours")
        },
    }


# ---------------------------------------------------------------------------- running
def _busy_cpu_s() -> float:
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def run_peer(python: str, case: Dict[str, Any], timeout_s: float) -> Dict[str, Any]:
    """Run ``peers_runner.py`` with ``case`` under ``python`` (the peers' venv) in its own
    process group; its JSON line, or ``{"error": ...}`` if it failed, died or timed out."""
    started, cpu = time.perf_counter(), _busy_cpu_s()
    proc = subprocess.Popen(
        [python, _RUNNER, json.dumps(case)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,  # its own group (a timeout kills its workers with it), our session
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        _kill_group(proc)
        raise
    wall = time.perf_counter() - started
    lines = [line for line in out.splitlines() if line.startswith("{")]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = " / ".join(err.strip().splitlines()[-3:])
        result = {"error": f"the runner exited with {proc.returncode} and no result: {tail}"}
    if "tree_cpu_s" in result:
        result["foreign_cores"] = max(0.0, _busy_cpu_s() - cpu - result["tree_cpu_s"]) / wall
    result["process_s"] = wall
    return result


def _kill_group(proc: subprocess.Popen[str]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(5)
            return
        except (ProcessLookupError, PermissionError):
            return
        except subprocess.TimeoutExpired:
            continue


def peer_versions(python: str) -> Dict[str, Optional[str]]:
    """The peers' venv's versions of torch, torchvision, FFCV, numba and numpy (None: not
    installed); ValueError if ``python`` is not there."""
    if not os.path.isfile(python):
        raise ValueError(
            f"the peers' Python {python} does not exist: run `make bench-peers` (it makes "
            "the venv, about 5.5 GB), or pass --peers-python, or leave the peers out "
            "(--loaders without w7-torch and ffcv)"
        )
    script = (
        "import json\nfrom importlib.metadata import version, PackageNotFoundError\n"
        "def v(n):\n    try:\n        return version(n)\n"
        "    except PackageNotFoundError:\n        return None\n"
        "print(json.dumps({n: v(n) for n in "
        "('torch', 'torchvision', 'ffcv', 'numba', 'numpy', 'opencv-python')}))"
    )
    out = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def _case(loader: str, args: argparse.Namespace, data: Dict[str, str]) -> Dict[str, Any]:
    if loader == FLOOR:
        return {"task": "fused_per_sample", "rec_path": data["rec"], "count": args.floor_images}
    if LOADERS[loader][2] == "peer":
        case = {"loader": loader.replace("w7-", ""), "folder": data["folder"]}
        return {
            **case,
            "beton": data["beton"],
            "num_workers": WORKERS,
            "min_time_s": args.min_time_s,
        }
    workload, kind = _CASES[loader]
    where = {"rec_path": data["rec"]} if workload == "W5" else {"folder": data["folder"]}
    return {"workload": workload, "loader": kind, "num_workers": WORKERS, **where}


def probe(case: Dict[str, Any], timeout_s: float, together: int = WORKERS) -> Dict[str, Any]:
    """The decode bound's probe: ``case`` (``fused_per_sample``) in one process, then in
    ``together`` processes at once. The result is the lone process's, plus ``together_per_s``:
    the img/s of the processes run at once, added up (what that many workers' decoding
    reaches on this machine now, whatever else runs on it), or ``together_error``."""
    from concurrent.futures import ThreadPoolExecutor

    result = run_isolated(case, timeout_s=timeout_s)
    with ThreadPoolExecutor(together) as pool:
        runs = list(pool.map(lambda _: run_isolated(case, timeout_s=timeout_s), range(together)))
    failed = [r["error"] for r in runs if "error" in r]
    if failed:
        result["together_error"] = failed[0]
    else:
        result["together_per_s"] = sum(r["samples_per_s"] for r in runs)
    return result


def _measure(loader: str, args: argparse.Namespace, data: Dict[str, str]) -> Dict[str, Any]:
    case = _case(loader, args, data)
    if loader == FLOOR:
        return probe(case, args.timeout_s)
    if LOADERS[loader][2] == "peer":
        return run_peer(args.peers_python, case, args.timeout_s)
    # No memory sampling: its thread would take a share of the cores that the peers,
    # timed without one, do not pay.
    return run_isolated(case, min_time_s=args.min_time_s, timeout_s=args.timeout_s, memory=False)


def _line(loader: str, round_: int, rounds: int, result: Dict[str, Any]) -> str:
    head = f"[{round_ + 1}/{rounds}] {loader:<14}"
    if "error" in result:
        return f"{head} ERROR {result['error']}"
    if loader == FLOOR:
        return (
            f"{head} {result['s_per_sample'] * 1e3:.3f} ms per image ({result['process_s']:.1f} s)"
        )
    return f"{head} {result['samples_per_s']:>8,.0f} img/s ({result['process_s']:.1f} s)"


def run_rounds(args: argparse.Namespace, data: Dict[str, str]) -> Dict[str, Any]:
    runs: List[Dict[str, Any]] = []
    loads = []
    for round_ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        print(f"-- round {round_ + 1}/{args.rounds}, load average {loads[-1]:.1f}", flush=True)
        for loader in round_order(args.loaders, round_):
            result = _measure(loader, args, data)
            runs.append({"loader": loader, "round": round_, "result": result})
            print(_line(loader, round_, args.rounds, result), flush=True)
    return {"runs": runs, "loads": loads}


# ---------------------------------------------------------------------------- data
def prepare(args: argparse.Namespace, need_beton: bool) -> Dict[str, str]:
    """W5's records, W7's folders (written once under ``<out>/data``) and FFCV's beton."""
    folder = os.path.join(args.out, "data")
    made = run_isolated(
        {"task": "jpeg_folder", "folder": folder, "n": _N}, timeout_s=args.timeout_s
    )
    if "error" in made:
        raise RuntimeError(f"could not write W5's and W7's JPEGs: {made['error']}")
    rec = run_isolated({"task": "jpeg_records", "folder": folder, "n": _N}, timeout_s=60)
    data = {"folder": made["folder"], "rec": rec["rec_path"], "beton": made["folder"] + ".beton"}
    if need_beton and not os.path.isfile(data["beton"]):
        t = time.perf_counter()
        case = {"loader": "beton", "folder": data["folder"], "beton": data["beton"]}
        result = run_peer(args.peers_python, case, args.timeout_s)
        if "error" in result:
            print(f"FFCV: could not write the .beton: {result['error']}", file=sys.stderr)
        else:
            print(f"FFCV: wrote {data['beton']} ({time.perf_counter() - t:.1f} s)")
    return data


# ---------------------------------------------------------------------------- report
def _ratio_text(ratio: Dict[str, Any]) -> str:
    if ratio.get("median") is None:
        return "-"
    return f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})"


def _beside(meta: Dict[str, Any]) -> str:
    """What ran beside the rounds, and how fast it went (benchmarks.background's info)."""
    info = meta.get("background_info") or {}
    text = info.get("what") or meta["background"]
    if info.get("steps_per_s"):
        text += f" ({info['steps_per_s']:.2f} steps/s meanwhile)"
    return text


def markdown(summary: Dict[str, Any], meta: Dict[str, Any]) -> str:
    loaders = summary["loaders"]
    v = meta["versions"]
    lines = [
        f"Measured {meta['date']} on {meta['cpu']} ({meta['cores']} cores), "
        f"{meta['rounds']} rounds, {meta['total_s']:.0f} s; background: {_beside(meta)}; "
        f"load average {meta['load_start']:.1f} at the start, {meta['load_end']:.1f} at the end "
        f"(per round: {', '.join(f'{x:.1f}' for x in meta['loads'])}). MXNet {meta['mxnet']}"
        + (
            f"; torch {v.get('torch')}, torchvision {v.get('torchvision')}, FFCV "
            f"{v.get('ffcv') or 'not installed'} (numba {v.get('numba')})"
            if v
            else ""
        )
        + f"; shardloader at {meta.get('commit') or '?'}. "
        f"Batch 64, {WORKERS} workers, 2,048 JPEGs of 320x256; img/s are medians over rounds "
        "(min-max in brackets), ratios paired per round.",
        "",
        "| data | loader | img/s | shardloader over it | CPU ms per image | cores busy | "
        "other load (cores) |",
        "|---|---|---|---|---|---|---|",
    ]
    base_of = {"W7": "w7-ours", "W5": "w5-ours"}
    for loader, entry in loaders.items():
        name, data, _ = LOADERS[loader]
        if entry["median"] is None:
            cell = "failed: " + (entry["errors"][-1][:120] if entry["errors"] else "no run")
            lines.append(f"| {data} | {name} | {cell.replace('|', '/')} | | | | |")
            continue
        ours = base_of[data] if loader != "ffcv" else "w7-ours"
        over = "-"
        if ours != loader and ours in loaders:
            over = _ratio_text(paired(rates(meta["runs"], ours), rates(meta["runs"], loader)))
        lines.append(
            f"| {data} | {name} | {fmt(entry['median'])} ({fmt(entry['min'])}-"
            f"{fmt(entry['max'])}) | {over} | {fmt(entry['cpu_ms'], 2)} | "
            f"{fmt(entry['cores'], 2)} | {fmt(entry['foreign_cores'], 2)} |"
        )
    lines += ["", "| target | measured | need | |", "|---|---|---|---|"]
    for name, ratio in summary["ratios"].items():
        need = ratio["need"]
        status = (
            ""
            if need is None or ratio["median"] is None
            else ("met" if ratio["median"] >= need else "missed")
        )
        need_text = f">= {need}x" if need is not None else "-"
        lines.append(f"| {name} | {_ratio_text(ratio)} | {need_text} | {status} |")
    what = {
        "fraction": "fraction of the decode bound (2 x one process)",
        "fraction_together": "fraction of the decode bound (2 processes at once)",
        "cpu_fraction": "CPU per image, decode + crop over the loader's (not a target)",
    }
    for name, frac in summary["fraction"].items():
        if frac["median"] is None:
            continue
        loader, key = name.split()
        need, status = f">= {FRACTION_NEED}, rounds within ±{FRACTION_SPREAD}", ""
        if key == "cpu_fraction":
            need = "-"
        else:
            status = "met" if frac["median"] >= FRACTION_NEED and frac["steady"] else "missed"
        lines.append(
            f"| {loader[:2].upper()} shardloader, {what[key]} | {frac['median']:.2f} "
            f"({frac['min']:.2f}-{frac['max']:.2f}) | {need} | {status} |"
        )
    if summary["bound_per_round"]:
        lines += [
            "",
            f"**The decode bound, per round**: one process's decode + crop in the fused code "
            f"({meta['floor_images']} images), then {WORKERS} such processes at once, just "
            f"before and just after W5's shardloader run. The bound is {WORKERS} over the "
            f"faster lone probe's time per image; *together* is the faster img/s of "
            f"{WORKERS} probes at once; *CPU* is the lone probe's CPU time per image over the "
            "loader's (all its processes); *cores* are the cores the loader kept busy.",
            "",
            "| round | lone probes, ms per image | bound img/s | together img/s | "
            "W5 img/s | W5 fraction (together) | W5 CPU | W5 cores | W7 fraction (together) | "
            "W7 CPU | W7 cores |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        w5 = rates(meta["runs"], "w5-ours")

        def two(e: Dict[str, Any], loader: str) -> str:
            a, b = e["fraction"][loader], e["fraction_together"][loader]
            return "-" if a is None else f"{a:.2f}" + ("" if b is None else f" ({b:.2f})")

        def num(value: Optional[float]) -> str:
            return "-" if value is None else f"{value:.2f}"

        for round_, e in sorted(summary["bound_per_round"].items()):
            probes = " / ".join(f"{ms:.3f}" for ms in e["probe_ms"])
            per_loader = [
                f"{two(e, x)} | {num(e['cpu_fraction'][x])} | {num(e['cores'][x])}"
                for x in ("w5-ours", "w7-ours")
            ]
            lines.append(
                f"| {round_ + 1} | {probes} | {fmt(e['bound'])} | {fmt(e['bound_together'])} | "
                f"{fmt(w5.get(round_))} | {per_loader[0]} | {per_loader[1]} |"
            )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- command line
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers",
        description="shardloader against torchvision, FFCV, Gluon and ImageRecordIter on "
        "W5/W7's JPEGs, side by side.",
    )
    parser.add_argument("--rounds", type=int, default=3, help="default %(default)s")
    parser.add_argument(
        "--loaders", default=",".join(LOADERS), help=f"comma-separated, of {', '.join(LOADERS)}"
    )
    parser.add_argument(
        "--background",
        default="none",
        choices=BACKGROUNDS,
        help="what runs beside the measured rounds (benchmarks.background)",
    )
    parser.add_argument(
        "--min-time-s",
        type=float,
        default=1.5,
        help="timed epochs add up to at least this (default %(default)s)",
    )
    parser.add_argument(
        "--floor-images",
        type=int,
        default=_FLOOR_IMAGES,
        help="images per decode-bound probe (default %(default)s)",
    )
    parser.add_argument("--timeout-s", type=float, default=_TIMEOUT_S)
    parser.add_argument(
        "--peers-python",
        default=PEERS_PYTHON,
        help="the peers' venv's Python (default .venv-peers/bin/python)",
    )
    parser.add_argument("--out", default=os.path.join(_HERE, "results"))
    parser.add_argument(
        "--from-json",
        metavar="PATH",
        help="measure nothing: print the tables of the runs saved in a peers JSON file",
    )
    args = parser.parse_args(argv)
    try:
        args.loaders = parse_loaders(args.loaders)
    except ValueError as exc:
        parser.error(str(exc))
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.floor_images < 64:
        parser.error(f"--floor-images must be >= 64 (one batch), got {args.floor_images}")
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            meta = json.load(f)["meta"]
        print(markdown(summarise(meta["runs"], meta["loaders"]), meta))
        return 0
    signal.signal(signal.SIGTERM, _interrupt)
    with_peers = any(LOADERS[x][2] == "peer" for x in args.loaders)
    versions = peer_versions(args.peers_python) if with_peers else {}
    if "ffcv" in args.loaders and not versions.get("ffcv"):
        print(f"FFCV is not installed in {args.peers_python}: leaving it out", file=sys.stderr)
        args.loaders.remove("ffcv")
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    data = prepare(args, "ffcv" in args.loaders)
    beside: Dict[str, Any] = {"name": "none"}
    if args.background == "none":
        done = run_rounds(args, data)
    else:
        # "loader": a second shardloader over W5's records, as another job's input pipeline.
        where = {"rec": data["rec"]} if args.background == "loader" else {}
        with background(args.background, **where) as beside:
            done = run_rounds(args, data)
    from .run import machine_info  # imports nothing of MXNet's here

    machine = machine_info()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": machine["cpu"],
        "cores": machine["cores"],
        "mxnet": machine["mxnet"],
        "commit": machine["shardloader_commit"],
        "versions": versions,
        "background": args.background,
        "background_info": beside,
        "rounds": args.rounds,
        "loaders": args.loaders,
        "floor_images": args.floor_images,
        "total_s": time.perf_counter() - started,
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "loads": done["loads"],
        "runs": done["runs"],
    }
    summary = summarise(done["runs"], args.loaders)
    md = markdown(summary, meta)
    print()
    print(md)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(
        args.out, "peers" + ("" if args.background == "none" else "-" + args.background)
    )
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "summary": summary}, f, indent=1, default=str)
    with open(stem + ".md", "w") as f:
        f.write(md)
    print(f"wrote {stem}.md and {stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
