"""Medians and paired ratios from the raw runs: what the report and the targets read.

Definitions (also in docs/benchmarks.md):

- Every number in a table is the **median over repetitions** of one cell (workload, mode,
  ``num_workers``, ``pin_memory``) for one loader.
- A **ratio** is the median over repetitions of ``ours / gluon`` from the same round: the two
  runs of a round are adjacent in time, so slow drifts in machine load cancel. The
  spread shown is the smallest and largest of those per-round ratios.
- **Per-batch overhead** is the wall time per batch beyond the ideal, which is the same
  loader's ``num_workers=0`` time per batch (same workload, no pinning) divided by
  ``max(1, num_workers)``. For W4 the reference is W2 (one step is one W2 batch).
- **Fraction of ideal** (W3) is ``samples/s at num_workers=2`` over twice the same loader's
  ``samples/s at num_workers=0``. For W5 the ideal is ``max(1, num_workers)`` times the
  single-process rate of the work the loader's image path does: ``dataset[i]`` through
  Gluon's transforms (the exact path), or decode + crop in shardloader's fused code (the
  **decode bound**); each is timed in the first rounds, in a fresh process.
- A **comparison** across cells or against another loader than Gluon (W5's ImageRecordIter,
  W5 thread against process, W2 process against inline) pairs the two runs of every round
  the same way; so do the **differences** of peak memory (W5 fused against exact).
- The **stacking** micro-benchmark reports each method's median seconds per batch over its
  calls in every round, and the target is ``ours / memcpy`` of those medians.
"""

from __future__ import annotations

import operator
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

__all__ = [
    "Cell",
    "Target",
    "COMPARISONS",
    "summarise",
    "comparisons",
    "summarise_extras",
    "scaling",
    "median",
    "cell_dict",
    "ratio_of",
    "spread_of",
    "w5_ideal",
    "w5_bound",
]


@dataclass(frozen=True)
class Cell:
    """One row group of the results: a workload under one set of options."""

    workload: str
    num_workers: int
    pin_memory: bool = False
    thread_pool: bool = False
    reps: int = 3
    loaders: Tuple[str, ...] = ("gluon", "ours")

    @property
    def mode(self) -> str:
        if self.num_workers == 0:
            return "inline"
        return "thread" if self.thread_pool else "process"

    @property
    def key(self) -> str:
        pin = " pin" if self.pin_memory else ""
        return f"{self.workload} {self.mode}{pin} nw={self.num_workers}"


@dataclass(frozen=True)
class Target:
    name: str
    measured: Optional[float]
    threshold: float
    unit: str  # "x" for a ratio, "of ideal", "of bound", "MB", "x memcpy" (a ratio of times)
    spread: Optional[Tuple[float, float]] = None
    higher_is_better: bool = True

    @property
    def status(self) -> str:
        if self.measured is None:
            return "n/a"
        ok = (
            self.measured >= self.threshold
            if self.higher_is_better
            else self.measured <= self.threshold
        )
        return "PASS" if ok else "MISS"


_METRICS = (
    "samples_per_s",
    "batches_per_s",
    "mb_per_s",
    "us_per_batch",
    "lat_p50_us",
    "lat_p99_us",
    "first_batch_ms",
    "peak_rss_mb",
    "peak_pss_mb",
    "foreign_cores",
)


def median(values: Sequence[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def summarise(cells: Sequence[Cell], runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Medians per (cell, loader), paired ratios against Gluon and per-batch overheads.

    ``runs`` are dicts with ``cell`` (the key), ``loader``, ``round`` and ``result``.
    """
    out: Dict[str, Any] = {}
    for cell in cells:
        mine = [r for r in runs if r["cell"] == cell.key]
        entry: Dict[str, Any] = {"cell": cell_dict(cell), "loaders": {}, "ratios": {}}
        for loader in cell.loaders:
            ok = [r["result"] for r in mine if r["loader"] == loader and "error" not in r["result"]]
            errors = [
                r["result"]["error"]
                for r in mine
                if r["loader"] == loader and "error" in r["result"]
            ]
            med = {m: median([res.get(m) for res in ok]) for m in _METRICS}
            rates = [res["samples_per_s"] for res in ok if res.get("samples_per_s")]
            med["samples_per_s_range"] = [min(rates), max(rates)] if rates else None
            med["image_path"] = _image_path(ok)
            med["reps"] = len(ok)
            med["errors"] = errors
            med["leftover_runs"] = sum(bool(res.get("leftover_processes")) for res in ok)
            entry["loaders"][loader] = med
        for loader in cell.loaders:
            if loader != "gluon":
                entry["ratios"][loader] = _paired(mine, (cell.key, loader), (cell.key, "gluon"))
        entry["rss_diff"] = _paired(
            mine, (cell.key, "ours"), (cell.key, "gluon"), "peak_rss_mb", operator.sub
        )
        out[cell.key] = entry
    _add_overheads(cells, out)
    return out


def _image_path(results: Sequence[Dict[str, Any]]) -> Optional[str]:
    """Which image path shardloader's runs took (``stats()["image_path"]``: "fused", "exact"
    or "exact: <why>"); the paths joined by " / " if the runs disagree."""
    paths = []
    for res in results:
        path = (res.get("loader_stats") or {}).get("image_path")
        if path is not None and path not in paths:
            paths.append(str(path))
    return " / ".join(paths) if paths else None


def cell_dict(cell: Cell) -> Dict[str, Any]:
    return {
        "workload": cell.workload,
        "mode": cell.mode,
        "num_workers": cell.num_workers,
        "pin_memory": cell.pin_memory,
        "thread_pool": cell.thread_pool,
        "reps": cell.reps,
    }


def _add_overheads(cells: Sequence[Cell], out: Dict[str, Any]) -> None:
    for cell in cells:
        ref_workload = "W2" if cell.workload == "W4" else cell.workload
        ref_key = Cell(ref_workload, 0).key
        for loader, med in out[cell.key]["loaders"].items():
            ref = out.get(ref_key, {}).get("loaders", {}).get(loader, {}).get("us_per_batch")
            now = med.get("us_per_batch")
            if ref is None or now is None:
                med["overhead_us"] = None
            else:
                med["overhead_us"] = now - ref / max(1, cell.num_workers)


def ratio_of(
    summary: Dict[str, Any], key: str, loader: str = "ours"
) -> Tuple[Optional[float], Optional[Tuple]]:
    """``loader``'s paired ratio to Gluon in cell ``key``: the median and (min, max)."""
    ratio = summary.get(key, {}).get("ratios", {}).get(loader)
    if not ratio or ratio["median"] is None:
        return None, None
    return ratio["median"], (ratio["min"], ratio["max"])


def spread_of(paired: Dict[str, Any]) -> Optional[Tuple[float, float]]:
    """The (min, max) of a paired comparison, None if nothing was paired."""
    if paired.get("min") is None:
        return None
    return paired["min"], paired["max"]


def scaling(summary: Dict[str, Any], loader: str, pin: bool = False) -> Optional[float]:
    """W3 samples/s at 2 workers over twice the same loader's inline samples/s."""
    two = summary.get(Cell("W3", 2, pin_memory=pin).key, {}).get("loaders", {}).get(loader, {})
    zero = summary.get(Cell("W3", 0).key, {}).get("loaders", {}).get(loader, {})
    if not two.get("samples_per_s") or not zero.get("samples_per_s"):
        return None
    return two["samples_per_s"] / (2 * zero["samples_per_s"])


# ---------------------------------------------------------------------------- comparisons
W5_PROCESS = Cell("W5", 2).key
W5_THREAD = Cell("W5", 2, thread_pool=True).key
W5_INLINE = Cell("W5", 0).key
W7_PROCESS = Cell("W7", 2).key
RECORDITER = "recorditer"
EXACT = "ours-exact"
UINT8 = "ours-uint8"

# (name, (cell, loader), (base cell, base loader)): ratios of samples/s paired per round.
COMPARISONS: Tuple[Tuple[str, Tuple[str, str], Tuple[str, str]], ...] = (
    ("W2 ours process / ours inline", (Cell("W2", 2).key, "ours"), (Cell("W2", 0).key, "ours")),
    # W3's speed-up over the same loader inline, per round (the fraction of ideal is half).
    ("W3 ours process / ours inline", (Cell("W3", 2).key, "ours"), (Cell("W3", 0).key, "ours")),
    (
        "W3 ours process pin / ours inline",
        (Cell("W3", 2, pin_memory=True).key, "ours"),
        (Cell("W3", 0).key, "ours"),
    ),
    ("W5 ours process / ImageRecordIter", (W5_PROCESS, "ours"), (W5_PROCESS, RECORDITER)),
    ("W5 gluon process / ImageRecordIter", (W5_PROCESS, "gluon"), (W5_PROCESS, RECORDITER)),
    ("W5 ours-exact process / ImageRecordIter", (W5_PROCESS, EXACT), (W5_PROCESS, RECORDITER)),
    ("W5 ours-uint8 process / ImageRecordIter", (W5_PROCESS, UINT8), (W5_PROCESS, RECORDITER)),
    ("W5 ours process / ours-exact process", (W5_PROCESS, "ours"), (W5_PROCESS, EXACT)),
    ("W5 ours thread / ImageRecordIter", (W5_THREAD, "ours"), (W5_PROCESS, RECORDITER)),
    ("W5 ours inline / ImageRecordIter", (W5_INLINE, "ours"), (W5_PROCESS, RECORDITER)),
    ("W5 ours thread / ours process", (W5_THREAD, "ours"), (W5_PROCESS, "ours")),
    ("W5 gluon thread / gluon process", (W5_THREAD, "gluon"), (W5_PROCESS, "gluon")),
    # MXNet 2.x, try_nopython=True: Gluon's C++ pipeline, run by either loader.
    ("W5 ours-cpp / gluon-cpp", (W5_PROCESS, "ours-cpp"), (W5_PROCESS, "gluon-cpp")),
    ("W5 ours-cpp / ImageRecordIter", (W5_PROCESS, "ours-cpp"), (W5_PROCESS, RECORDITER)),
    ("W5 gluon-cpp / ImageRecordIter", (W5_PROCESS, "gluon-cpp"), (W5_PROCESS, RECORDITER)),
)
# (name, metric, (cell, loader), (base cell, base loader)): differences, paired per round.
DIFFERENCES: Tuple[Tuple[str, str, Tuple[str, str], Tuple[str, str]], ...] = (
    ("W5 peak RSS, ours - ours-exact", "peak_rss_mb", (W5_PROCESS, "ours"), (W5_PROCESS, EXACT)),
    ("W5 peak PSS, ours - ours-exact", "peak_pss_mb", (W5_PROCESS, "ours"), (W5_PROCESS, EXACT)),
)


def _paired(
    runs: Sequence[Dict[str, Any]],
    top: Tuple[str, str],
    base: Tuple[str, str],
    metric: str = "samples_per_s",
    combine: Callable[[float, float], float] = operator.truediv,
) -> Dict[str, Any]:
    """``combine(top's metric, base's metric)`` in every round that measured both, where
    ``top`` and ``base`` are ``(cell key, loader)`` (a ratio by default; ``operator.sub``
    for a difference): the median, the min-max and the per-round values."""
    values: Dict[Tuple[str, str], Dict[int, float]] = {top: {}, base: {}}
    for r in runs:
        which = (r["cell"], r["loader"])
        value = r["result"].get(metric)
        if which in values and "error" not in r["result"] and value is not None:
            values[which][r["round"]] = value
    paired = [
        combine(v, values[base][k])
        for k, v in sorted(values[top].items())
        if k in values[base] and (values[base][k] or combine is not operator.truediv)
    ]
    return {
        "median": median(paired),
        "min": min(paired) if paired else None,
        "max": max(paired) if paired else None,
        "per_round": paired,
    }


def comparisons(runs: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Every ratio of :data:`COMPARISONS` and difference of :data:`DIFFERENCES` whose two
    sides ran, paired per round."""
    out = {}
    for name, top, base in COMPARISONS:
        ratio = _paired(runs, top, base)
        if ratio["per_round"]:
            out[name] = ratio
    for name, metric, top, base in DIFFERENCES:
        diff = _paired(runs, top, base, metric, operator.sub)
        if diff["per_round"]:
            out[name] = diff
    return out


def summarise_extras(extras: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Medians of the tasks that are not loader runs: W5's single-process rate
    (``jpeg_per_sample``) and the stacking micro-benchmark (``stacking``)."""
    out: Dict[str, Any] = {}
    ok = [e for e in extras if "error" not in e["result"]]
    for task in ("jpeg_per_sample", "fused_per_sample"):
        probes = [e["result"] for e in ok if e["task"] == task]
        if probes:
            out[task] = {
                "s_per_sample": median([p["s_per_sample"] for p in probes]),
                "cpu_per_sample": median([p.get("cpu_per_sample") for p in probes]),
                "samples": probes[0]["samples"],
                "reps": len(probes),
            }
    stacks = [e["result"] for e in ok if e["task"] == "stacking"]
    if stacks:
        methods = {}
        for name in stacks[0]["methods"]:
            calls = [t for s in stacks for t in s["methods"][name]["times"]]
            methods[name] = {"median_s": median(calls), "calls": len(calls)}
        memcpy = methods.get("memcpy", {}).get("median_s")
        for name, m in methods.items():
            m["x_memcpy"] = m["median_s"] / memcpy if memcpy else None
            # The spread: the same ratio within each round (each task run) on its own.
            per_round = [
                median(s["methods"][name]["times"]) / median(s["methods"]["memcpy"]["times"])
                for s in stacks
                if "memcpy" in s["methods"]
            ]
            m["x_memcpy_spread"] = (min(per_round), max(per_round)) if per_round else None
        out["stacking"] = {"bytes": stacks[0]["bytes"], "methods": methods, "reps": len(stacks)}
    errors = [f"{e['task']}: {e['result']['error']}" for e in extras if "error" in e["result"]]
    if errors:
        out["errors"] = errors
    return out


def w5_ideal(
    extras: Dict[str, Any], num_workers: int, task: str = "jpeg_per_sample"
) -> Optional[float]:
    """W5's ideal img/s with ``num_workers``: that many times the single-process rate of
    ``task`` (``jpeg_per_sample``: Gluon's pipeline; ``fused_per_sample``: decode + crop in
    shardloader's fused code, the decode bound)."""
    probe = extras.get(task)
    if not probe or not probe.get("s_per_sample"):
        return None
    return max(1, num_workers) / probe["s_per_sample"]


def w5_bound(extras: Dict[str, Any], num_workers: int) -> Optional[float]:
    """The decode bound: ``num_workers`` over one process's time per image for decode +
    crop in the fused code."""
    return w5_ideal(extras, num_workers, "fused_per_sample")
