"""``python -m benchmarks.run``: shardloader against Gluon's DataLoader, side by side.

What ``make bench`` runs. Every cell (workload x options) is measured for every loader in
rounds: a round runs each cell once per loader, the loaders of a cell back to back (their
order alternates between rounds), each in a fresh process (:func:`harness.run_isolated`).
Spreading the repetitions of a cell over the whole run, and pairing the loaders within a
round, keeps a burst of load on a shared machine from deciding a ratio.

Examples
--------
    python -m benchmarks.run                   # the full run (about 11 minutes on 2 cores)
    python -m benchmarks.run --quick           # a smoke run in two to three minutes
    python -m benchmarks.run --quick --workloads W5   # one workload: about a minute
    python -m benchmarks.run --workloads W1,W3 --reps 5
    python -m benchmarks.run --workloads W5,STACK --quick
    python -m benchmarks.run --publish         # also update docs/benchmarks.md and its plot

Besides the loader cells, the first rounds run tasks in fresh processes when their
workloads are asked for: W5's single-process rates (``jpeg_per_sample``, Gluon's pipeline,
for the exact path's ideal; ``fused_per_sample``, decode + crop in shardloader's fused code,
for the decode bound) and the NDArray stacking micro-benchmark (``STACK``,
:mod:`benchmarks.micro`). W5's records and W7's folders are generated once, before the
first round, into ``<out>/data`` (and reused by later runs).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import report
from .harness import run_isolated
from .summary import Cell
from .workloads import (
    CPP_LOADERS,
    IMAGE_WORKLOADS,
    WORKLOADS,
    calibrate_cpu_work,
    mxnet_2,
    torch_available,
)

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_DOC = os.path.join(_ROOT, "docs", "benchmarks.md")
# The appendix: how the numbers are made, and every cell of each published run.
_DOC_DETAILS = os.path.join(_ROOT, "docs", "benchmarks-method.md")
# Per MXNet generation: the results directory, the section of docs/benchmarks.md and the plot.
# Under MXNet 2.x (make bench-mx2) the run has its own table, beside 1.9.1's.
_OUTPUTS = {
    False: (os.path.join(_HERE, "results"), "results", "throughput.png"),
    True: (os.path.join(_HERE, "results-mx2"), "results-mx2", "throughput-mx2.png"),
}

_HEADLINE_REPS = 5
_REPS = 3
_BUDGET_S = 660.0  # no rounds past the minimum beyond this (make bench: about 11 minutes)
_RUN_TIMEOUT_S = 180.0
_W3_TARGET_S = 1e-3
# Not a loader workload: the NDArray stacking micro-benchmark (benchmarks.micro).
STACK = "STACK"
# The tasks' sizes: (full, --quick).
_PROBE_SAMPLES = (300, 48)
_STACK_ROUNDS = (25, 5)


def build_plan(
    workloads: Sequence[str],
    reps: Optional[int],
    headline_reps: int,
    with_torch: bool,
    mx2: bool = False,
) -> List[Cell]:
    """The cells to measure. ``num_workers=2`` with process workers is the headline.

    W1-W4 run with and without ``pin_memory`` and (W1-W3) with thread workers; W1 and W2
    sweep ``num_workers``. W5 runs inline, with process workers (where ImageRecordIter, with
    ``preprocess_threads=2``, shardloader's exact path and its uint8 output join the two
    loaders) and with thread workers. W6 runs inline and with process workers, W7 with
    process workers. Under MXNet 2.x (``mx2``), W5's headline cell also runs both loaders
    with ``try_nopython=True`` (``gluon-cpp``, ``ours-cpp``). ``STACK`` is not a cell (see
    :func:`build_tasks`).
    """
    cells: List[Cell] = []

    def add(workload: str, nw: int, pin: bool = False, thread: bool = False) -> None:
        headline = nw == 2 and not pin and not thread
        n = reps if reps is not None else (headline_reps if headline else _REPS)
        loaders: Tuple[str, ...] = ("gluon", "ours")
        if workload == "W5" and headline:
            loaders += ("recorditer", "ours-exact", "ours-uint8") + (CPP_LOADERS if mx2 else ())
        if with_torch and workload != "W4" and not pin and not thread and nw > 0:
            loaders += ("torch",)
        cells.append(Cell(workload, nw, pin, thread, n, loaders))

    for workload in workloads:
        if workload == STACK:
            continue
        if workload in ("W1", "W2"):
            for nw in (0, 1, 2, 4):  # the sweep for the plot
                add(workload, nw)
        elif workload in ("W3", "W5", "W6"):
            add(workload, 0)
            add(workload, 2)
        else:  # W4, W7
            add(workload, 2)
        if workload in ("W1", "W2", "W3", "W4"):
            add(workload, 2, pin=True)
        if workload in ("W1", "W2", "W3", "W5"):
            add(workload, 2, thread=True)
    return cells


def build_tasks(
    workloads: Sequence[str], quick: bool, case_extra: Dict[str, Dict[str, Any]]
) -> List[Dict[str, Any]]:
    """The tasks the first rounds run besides the cells: W5's single-process rates, of
    Gluon's pipeline and of the fused decode + crop (with W5), and the stacking
    micro-benchmark (with ``STACK``)."""
    tasks: List[Dict[str, Any]] = []
    if "W5" in workloads:
        count = _PROBE_SAMPLES[1 if quick else 0]
        rec_path = case_extra["W5"]["rec_path"]
        for task in ("jpeg_per_sample", "fused_per_sample"):
            tasks.append({"task": task, "rec_path": rec_path, "count": count})
    if STACK in workloads:
        tasks.append({"task": "stacking", "rounds": _STACK_ROUNDS[1 if quick else 0]})
    return tasks


def machine_info() -> Dict[str, Any]:
    """Where the numbers came from."""
    import psutil

    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python 3.7
        from importlib_metadata import PackageNotFoundError, version  # type: ignore

    def ver(name: str) -> Optional[str]:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gb": psutil.virtual_memory().total / 2**30,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "mxnet": ver("mxnet"),
        "numpy": ver("numpy"),
        "psutil": ver("psutil"),
        "matplotlib": ver("matplotlib"),
        "torch": ver("torch"),
        "shardloader_commit": _git("rev-parse", "--short", "HEAD"),
        "shardloader_dirty": bool(_git("status", "--porcelain", "--", "shardloader")),
    }


def source_fingerprint() -> str:
    """A hash of shardloader's sources (every module, subpackages included), to tell
    whether they changed during the run."""
    digest = hashlib.sha1()
    package = os.path.join(_ROOT, "shardloader")
    for folder, dirs, files in os.walk(package):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    digest.update(os.path.relpath(path, package).encode() + b"\0" + f.read())
    return digest.hexdigest()[:12]


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", *args], cwd=_ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _loader_order(cell: Cell, index: int, round_: int) -> Sequence[str]:
    shift = (index + round_) % len(cell.loaders)
    return cell.loaders[shift:] + cell.loaders[:shift]


def _line(cell: Cell, loader: str, round_: int, rounds: int, result: Dict[str, Any]) -> str:
    head = f"[{round_ + 1}/{rounds}] {cell.key:<24} {loader:<6}"
    if "error" in result:
        return f"{head} ERROR {result['error']}"
    return (
        f"{head} {result['samples_per_s']:>10,.0f} samples/s  p50 "
        f"{result['lat_p50_us'] / 1e3:7.2f} ms  RSS {result['peak_rss_mb']:5.0f} MB  "
        f"({result['process_s']:.1f} s)"
    )


def _task_line(task: Dict[str, Any], round_: int, rounds: int, result: Dict[str, Any]) -> str:
    head = f"[{round_ + 1}/{rounds}] {'task ' + task['task']:<31}"
    if "error" in result:
        return f"{head} ERROR {result['error']}"
    if task["task"] in ("jpeg_per_sample", "fused_per_sample"):
        return (
            f"{head} {result['s_per_sample'] * 1e3:.2f} ms per image in one process "
            f"({result['samples_per_s']:,.0f} img/s)  ({result['process_s']:.1f} s)"
        )
    medians = ", ".join(
        f"{name} {m['median_s'] * 1e3:.1f}" for name, m in result.get("methods", {}).items()
    )
    return f"{head} ms per batch: {medians}  ({result['process_s']:.1f} s)"


def run_rounds(
    cells: Sequence[Cell],
    case_extra: Dict[str, Any],
    budget_s: float,
    min_rounds: int,
    started: float,
    timeout_s: float,
    raw_path: str,
    tasks: Sequence[Dict[str, Any]] = (),
    task_rounds: int = _REPS,
) -> Dict[str, Any]:
    """Run every cell's repetitions, one round at a time; stop adding rounds past the
    minimum when the next one would overrun ``budget_s``. The raw runs so far are saved
    to ``raw_path`` after every round. ``tasks`` (see :func:`build_tasks`) run at the start
    of each of the first ``task_rounds`` rounds."""
    runs: List[Dict[str, Any]] = []
    extras: List[Dict[str, Any]] = []
    rounds = max([c.reps for c in cells] + ([task_rounds] if tasks else [1]))
    cell_cost: Dict[str, float] = {}
    loads: List[float] = []
    skipped = 0
    for round_ in range(rounds):
        todo = [c for c in cells if c.reps > round_]
        todo_tasks = list(tasks) if round_ < task_rounds else []
        elapsed = time.perf_counter() - started
        estimate = sum(cell_cost.get(c.key, 0.0) for c in todo)
        estimate += sum(cell_cost.get("task " + t["task"], 0.0) for t in todo_tasks)
        if round_ >= min_rounds and elapsed + estimate > budget_s:
            skipped = rounds - round_
            print(
                f"-- skipping the last {skipped} round(s): {elapsed:.0f} s spent, the next "
                f"would take ~{estimate:.0f} s, over the {budget_s:.0f} s budget"
            )
            break
        loads.append(os.getloadavg()[0])
        print(
            f"-- round {round_ + 1}/{rounds}: {len(todo)} cells"
            f"{f', {len(todo_tasks)} tasks' if todo_tasks else ''}, load average {loads[-1]:.1f}"
        )
        for task in todo_tasks:
            result = run_isolated(task, timeout_s=timeout_s)
            cell_cost["task " + task["task"]] = result.get("process_s", 0.0)
            extras.append({"task": task["task"], "round": round_, "result": result})
            print(_task_line(task, round_, rounds, result), flush=True)
        for index, cell in enumerate(todo):
            spent = 0.0
            for loader in _loader_order(cell, index, round_):
                case = {
                    "workload": cell.workload,
                    "loader": loader,
                    "num_workers": cell.num_workers,
                    "pin_memory": cell.pin_memory,
                    "thread_pool": cell.thread_pool,
                    **case_extra.get(cell.workload, {}),
                }
                result = run_isolated(case, timeout_s=timeout_s)
                spent += result.get("process_s", 0.0)
                runs.append({"cell": cell.key, "loader": loader, "round": round_, "result": result})
                print(_line(cell, loader, round_, rounds, result), flush=True)
            cell_cost[cell.key] = spent
        os.makedirs(os.path.dirname(raw_path), exist_ok=True)
        with open(raw_path, "w") as f:
            json.dump({"runs": runs, "extras": extras}, f)
    return {
        "runs": runs,
        "extras": extras,
        "rounds": rounds - skipped,
        "skipped_rounds": skipped,
        "loads": loads,
    }


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="shardloader against Gluon's (and torch's) DataLoader, side by side.",
    )
    parser.add_argument("--quick", action="store_true", help="few samples, 1 repetition")
    parser.add_argument(
        "--workloads",
        default=",".join([*WORKLOADS, STACK]),
        help="comma-separated, e.g. W1,W3; STACK is the NDArray stacking micro-benchmark "
        "(default: all)",
    )
    parser.add_argument("--reps", type=int, help="repetitions of every cell (default 5/3)")
    parser.add_argument(
        "--publish",
        action="store_true",
        help="update docs/benchmarks.md and docs/benchmarks-method.md",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=_BUDGET_S,
        help="no rounds past the third once this is spent (default %(default)s)",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=_RUN_TIMEOUT_S,
        help="a run taking longer is killed and reported (default %(default)s)",
    )
    parser.add_argument(
        "--out",
        default=_OUTPUTS[mxnet_2()][0],
        help="results directory (default benchmarks/results, or results-mx2 under MXNet 2.x)",
    )
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if installed")
    parser.add_argument(
        "--from-json",
        metavar="PATH",
        help="measure nothing: report (and --publish) the runs saved in a results.json",
    )
    args = parser.parse_args(argv)
    args.workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(args.workloads) - set(WORKLOADS) - {STACK})
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {[*sorted(WORKLOADS), STACK]}")
    if args.reps is not None and args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _finish(args: argparse.Namespace, cells, runs, machine, meta) -> int:
    meta = dict(meta)
    extras = meta.pop("extras", [])
    out = report.write_results(args.out, cells, runs, machine, meta, extras)
    print()
    print(out["markdown"])
    for path in out["paths"].values():
        if path:
            print(f"wrote {os.path.relpath(path, _ROOT)}")
    if args.publish:
        _, section, image = _OUTPUTS[str(machine.get("mxnet") or "1").startswith("2")]
        img_path = os.path.join(_ROOT, "docs", "img", image)
        report.publish(out["markdown"], out["paths"]["png"], _DOC, img_path, section, _DOC_DETAILS)
        print(
            f"published to {os.path.relpath(_DOC, _ROOT)} ({section}), "
            f"{os.path.relpath(_DOC_DETAILS, _ROOT)} ({section}-cells) and "
            f"{os.path.relpath(img_path, _ROOT)}"
        )
    missed = [t.name for t in out["targets"] if t.status == "MISS"]
    print(
        f"total {meta['total_s']:.0f} s; targets: "
        f"{sum(t.status == 'PASS' for t in out['targets'])} pass, {len(missed)} missed"
        + (f" ({', '.join(missed)})" if missed else "")
    )
    return 0


def _image_data(workload: str, args: argparse.Namespace, extra: Dict[str, Dict]) -> bool:
    """Write W5's records or W7's folders (once: later runs reuse them) and put their path
    into ``extra``; False, with the error printed, if that failed."""
    n = WORKLOADS[workload].quick_samples if args.quick else WORKLOADS[workload].samples
    task, key = ("jpeg_records", "rec_path") if workload == "W5" else ("jpeg_folder", "folder")
    t = time.perf_counter()
    # In a fresh process, like every measurement: this one never imports MXNet.
    made = run_isolated(
        {"task": task, "folder": os.path.join(args.out, "data"), "n": n},
        timeout_s=args.timeout_s,
    )
    if "error" in made:
        print(f"{workload}: could not write the JPEGs: {made['error']}", file=sys.stderr)
        return False
    extra.setdefault(workload, {}).update({key: made[key], "samples": n})
    where = os.path.relpath(made[key], _ROOT)
    print(f"{workload}: {n} JPEGs of 320x256 in {where} ({time.perf_counter() - t:.1f} s)")
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse(argv)
    if args.from_json:
        cells, runs, machine, meta = report.load_results(args.from_json)
        return _finish(args, cells, runs, machine, meta)
    # SIGTERM unwinds like Ctrl-C, so the run in flight is killed with its workers.
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    machine = machine_info()
    fingerprint = source_fingerprint()
    with_torch = not args.no_torch and torch_available()
    reps = 1 if args.quick and args.reps is None else args.reps
    cells = build_plan(args.workloads, reps, _HEADLINE_REPS, with_torch, mxnet_2())
    case_extra: Dict[str, Dict[str, Any]] = {}
    loader_workloads = [w for w in args.workloads if w in WORKLOADS]
    if args.quick:
        for w in loader_workloads:
            case_extra[w] = {"samples": WORKLOADS[w].quick_samples}
    for workload in IMAGE_WORKLOADS:
        if workload in args.workloads and not _image_data(workload, args, case_extra):
            return 1
    tasks = build_tasks(args.workloads, args.quick, case_extra)
    calibration = None
    if "W3" in args.workloads:
        passes, seconds = calibrate_cpu_work(_W3_TARGET_S)
        calibration = {
            "work_passes": passes,
            "ms_per_sample": seconds * 1e3,
            "target_ms": _W3_TARGET_S * 1e3,
        }
        case_extra.setdefault("W3", {})["work_passes"] = passes
        print(f"W3: {passes} numpy passes per sample = {seconds * 1e3:.2f} ms (fastest of 200)")
    print(
        f"{len(cells)} cells, loaders gluon, ours"
        f"{', ImageRecordIter (W5)' if 'W5' in args.workloads else ''}"
        f"{', torch' if with_torch else ''}; "
        f"{machine['cpu']}, {machine['cores']} cores, load average {load_start:.1f}"
    )
    task_rounds = reps if reps is not None else _REPS
    done = run_rounds(
        cells,
        case_extra,
        args.budget_s,
        min(_REPS, max([c.reps for c in cells] + [task_rounds])),
        started,
        args.timeout_s,
        os.path.join(args.out, "runs.partial.json"),
        tasks,
        task_rounds,
    )
    changed = source_fingerprint() != fingerprint
    if changed:
        print(
            "warning: shardloader's sources changed during the run; every run used the "
            "version from the start (the fork server preloaded it), but rerun to measure "
            "the new one"
        )
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "shardloader_sources": fingerprint,
        "sources_changed_during_run": changed,
        "argv": list(sys.argv[1:] if argv is None else argv),
        "quick": args.quick,
        "total_s": time.perf_counter() - started,
        "rounds": done["rounds"],
        "skipped_rounds": done["skipped_rounds"],
        "round_loads": done["loads"],
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "calibration": calibration,
        "samples": {
            w: case_extra.get(w, {}).get("samples", WORKLOADS[w].samples) for w in loader_workloads
        },
        "extras": done["extras"],
    }
    return _finish(args, cells, done["runs"], machine, meta)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc or 'Ctrl-C'}); the run in flight was stopped", file=sys.stderr)
        sys.exit(130)
