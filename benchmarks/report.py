"""Medians, ratios and targets from the raw runs; the JSON, markdown and PNG results.

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
  single-process rate of ``dataset[i]`` (timed in every round, in a fresh process).
- A **comparison** across cells or against another loader than Gluon (W5's ImageRecordIter,
  W5 thread against process, W2 process against inline) pairs the two runs of every round
  the same way.
- The **stacking** micro-benchmark reports each method's median seconds per batch over its
  calls in every round, and the target is ``ours / memcpy`` of those medians.
"""

from __future__ import annotations

import json
import operator
import os
import shutil
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .workloads import CPP_LOADERS, LOADERS

__all__ = [
    "Cell",
    "Target",
    "summarise",
    "comparisons",
    "summarise_extras",
    "check_targets",
    "write_results",
    "publish",
]


def _markers(section: str) -> Tuple[str, str]:
    """The comments that delimit ``section`` ("results", "results-mx2") in the docs page."""
    return (
        f"<!-- {section}:start (written by python -m benchmarks.run --publish) -->",
        f"<!-- {section}:end -->",
    )


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
    unit: str  # "x" for a ratio, "of ideal", "MB", "x memcpy" (a ratio of times)
    spread: Optional[Tuple[float, float]] = None
    higher_is_better: bool = True
    source: str = ""  # the issue that set the target

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


def _median(values: Sequence[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def summarise(cells: Sequence[Cell], runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Medians per (cell, loader), paired ratios against Gluon and per-batch overheads.

    ``runs`` are dicts with ``cell`` (the key), ``loader``, ``round`` and ``result``.
    """
    out: Dict[str, Any] = {}
    for cell in cells:
        mine = [r for r in runs if r["cell"] == cell.key]
        entry: Dict[str, Any] = {"cell": _cell_dict(cell), "loaders": {}, "ratios": {}}
        for loader in cell.loaders:
            ok = [r["result"] for r in mine if r["loader"] == loader and "error" not in r["result"]]
            errors = [
                r["result"]["error"]
                for r in mine
                if r["loader"] == loader and "error" in r["result"]
            ]
            med = {m: _median([res.get(m) for res in ok]) for m in _METRICS}
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


def _cell_dict(cell: Cell) -> Dict[str, Any]:
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


def _ratio(
    summary: Dict[str, Any], key: str, loader: str = "ours"
) -> Tuple[Optional[float], Optional[Tuple]]:
    ratio = summary.get(key, {}).get("ratios", {}).get(loader)
    if not ratio or ratio["median"] is None:
        return None, None
    return ratio["median"], (ratio["min"], ratio["max"])


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
RECORDITER = "recorditer"

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
    ("W5 ours thread / ImageRecordIter", (W5_THREAD, "ours"), (W5_PROCESS, RECORDITER)),
    ("W5 ours inline / ImageRecordIter", (W5_INLINE, "ours"), (W5_PROCESS, RECORDITER)),
    ("W5 ours thread / ours process", (W5_THREAD, "ours"), (W5_PROCESS, "ours")),
    ("W5 gluon thread / gluon process", (W5_THREAD, "gluon"), (W5_PROCESS, "gluon")),
    # MXNet 2.x, try_nopython=True: Gluon's C++ pipeline, run by either loader.
    ("W5 ours-cpp / gluon-cpp", (W5_PROCESS, "ours-cpp"), (W5_PROCESS, "gluon-cpp")),
    ("W5 ours-cpp / ImageRecordIter", (W5_PROCESS, "ours-cpp"), (W5_PROCESS, RECORDITER)),
    ("W5 gluon-cpp / ImageRecordIter", (W5_PROCESS, "gluon-cpp"), (W5_PROCESS, RECORDITER)),
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
        "median": _median(paired),
        "min": min(paired) if paired else None,
        "max": max(paired) if paired else None,
        "per_round": paired,
    }


def comparisons(runs: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Every ratio of :data:`COMPARISONS` whose two sides ran, paired per round."""
    out = {}
    for name, top, base in COMPARISONS:
        ratio = _paired(runs, top, base)
        if ratio["per_round"]:
            out[name] = ratio
    return out


def summarise_extras(extras: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Medians of the tasks that are not loader runs: W5's single-process rate
    (``jpeg_per_sample``) and the stacking micro-benchmark (``stacking``)."""
    out: Dict[str, Any] = {}
    ok = [e for e in extras if "error" not in e["result"]]
    probes = [e["result"] for e in ok if e["task"] == "jpeg_per_sample"]
    if probes:
        out["jpeg_per_sample"] = {
            "s_per_sample": _median([p["s_per_sample"] for p in probes]),
            "cpu_per_sample": _median([p.get("cpu_per_sample") for p in probes]),
            "samples": probes[0]["samples"],
            "reps": len(probes),
        }
    stacks = [e["result"] for e in ok if e["task"] == "stacking"]
    if stacks:
        methods = {}
        for name in stacks[0]["methods"]:
            calls = [t for s in stacks for t in s["methods"][name]["times"]]
            methods[name] = {"median_s": _median(calls), "calls": len(calls)}
        memcpy = methods.get("memcpy", {}).get("median_s")
        for name, m in methods.items():
            m["x_memcpy"] = m["median_s"] / memcpy if memcpy else None
            # The spread: the same ratio within each round (each task run) on its own.
            per_round = [
                _median(s["methods"][name]["times"]) / _median(s["methods"]["memcpy"]["times"])
                for s in stacks
                if "memcpy" in s["methods"]
            ]
            m["x_memcpy_spread"] = (min(per_round), max(per_round)) if per_round else None
        out["stacking"] = {"bytes": stacks[0]["bytes"], "methods": methods, "reps": len(stacks)}
    errors = [f"{e['task']}: {e['result']['error']}" for e in extras if "error" in e["result"]]
    if errors:
        out["errors"] = errors
    return out


def w5_ideal(extras: Dict[str, Any], num_workers: int) -> Optional[float]:
    """W5's ideal img/s with ``num_workers``: that many times the single-process rate."""
    probe = extras.get("jpeg_per_sample")
    if not probe or not probe.get("s_per_sample"):
        return None
    return max(1, num_workers) / probe["s_per_sample"]


# ---------------------------------------------------------------------------- targets
# (workload, issue 13's need, issue 4's need with pin_memory=True)
_RATIO_NEEDS = (("W1", 6.0, 4.0), ("W2", 6.0, 3.0), ("W4", 6.0, 2.0))


def check_targets(
    summary: Dict[str, Any],
    compared: Optional[Dict[str, Dict[str, Any]]] = None,
    extras: Optional[Dict[str, Any]] = None,
) -> List[Target]:
    """The performance targets of issues 4 and 13, on the medians of what ran.

    Issue 13 raised the headline (process workers, ``num_workers=2``) targets of W1, W2, W4
    (6x) and W3 (0.95 of the ideal) and added W2 process against inline, W5, W6 and the
    stacking micro-benchmark; the pinned and thread-pool targets are issue 4's.
    """
    compared = compared or {}
    extras = extras or {}
    targets: List[Target] = []

    def ran(key: str, loaders: Sequence[str] = ("gluon", "ours")) -> bool:
        measured = summary.get(key, {}).get("loaders", {})
        return all(measured.get(name, {}).get("reps") for name in loaders)

    def ratio_target(name: str, key: str, need: float, source: str) -> None:
        value, spread = _ratio(summary, key)
        targets.append(Target(name, value, need, "x", spread, source=source))

    def compared_target(name: str, need: float, source: str = "issue 13") -> None:
        ratio = compared.get(name)
        if ratio is not None:
            spread = (ratio["min"], ratio["max"])
            targets.append(Target(name, ratio["median"], need, "x", spread, source=source))

    for pin in (False, True):
        tag = " pin_memory" if pin else ""
        source = "issue 4" if pin else "issue 13"
        for workload, need, pinned_need in _RATIO_NEEDS:
            key = Cell(workload, 2, pin_memory=pin).key
            if not ran(key):
                continue
            ratio_target(f"{workload}{tag} ours/gluon", key, pinned_need if pin else need, source)
            if workload == "W2" and not pin:
                diff = summary[key].get("rss_diff") or {}
                targets.append(
                    Target(
                        "W2 peak RSS, ours - gluon",
                        diff.get("median"),
                        0.0,
                        "MB",
                        _spread(diff),
                        higher_is_better=False,
                        source="issue 4",
                    )
                )
                compared_target("W2 ours process / ours inline", 1.0)
        if ran(Cell("W3", 0).key) and ran(Cell("W3", 2, pin_memory=pin).key):
            frac, spread = scaling(summary, "ours", pin), None
            paired = compared.get(f"W3 ours process{' pin' if pin else ''} / ours inline")
            if paired and paired["median"] is not None:  # per round: the same rounds' runs
                frac, spread = paired["median"] / 2, (paired["min"] / 2, paired["max"] / 2)
            need = 0.9 if pin else 0.95
            targets.append(
                Target(
                    f"W3{tag} ours, fraction of ideal 2x",
                    frac,
                    need,
                    "of ideal",
                    spread,
                    source=source,
                )
            )
    for workload in ("W1", "W2", "W3"):
        key = Cell(workload, 2, thread_pool=True).key
        if ran(key):
            ratio_target(f"{workload} thread ours/gluon", key, 1.0, "issue 4")
    compared_target("W5 ours process / ImageRecordIter", 1.0)
    if ran(W5_INLINE):
        ratio_target("W5 inline ours/gluon", W5_INLINE, 1.2, "issue 13")
    compared_target("W5 ours thread / ours process", 0.9)
    if ran(Cell("W6", 2).key):
        ratio_target("W6 ours/gluon", Cell("W6", 2).key, 5.0, "issue 13")
    stack = extras.get("stacking", {}).get("methods", {})
    if stack.get("ours", {}).get("x_memcpy") is not None:
        targets.append(
            Target(
                "stacking ours / memcpy (time)",
                stack["ours"]["x_memcpy"],
                2.0,
                "x memcpy",
                stack["ours"].get("x_memcpy_spread"),
                higher_is_better=False,
                source="issue 13",
            )
        )
    return targets


# ---------------------------------------------------------------------------- output
def _one_line(error: str, limit: int = 160) -> str:
    """An error for a table cell: its last non-empty line (an MXNetError carries its C++
    traceback above it), without ``|``, at most ``limit`` characters."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    text = (lines[-1] if lines else error).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(value: Optional[float], digits: int = 0, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    value = value * scale
    if abs(value) >= 10_000 and digits == 0:
        return f"{value / 1000:,.1f}k"
    if digits == 0 and 0 < abs(value) < 10:
        return f"{value:.2g}"
    return f"{value:,.{digits}f}"


def _spread(paired: Dict[str, Any]) -> Optional[Tuple[float, float]]:
    if paired.get("min") is None:
        return None
    return paired["min"], paired["max"]


def _fmt_target(t: Target) -> Tuple[str, str]:
    """The measured cell (with the spread over rounds, min-max) and the need."""
    if t.measured is None:
        return "-", "-"
    low, high = t.spread or (None, None)
    if t.unit == "MB":
        measured, need = f"{t.measured:+.0f} MB", f"<= {t.threshold:g} MB"
        spread = f" ({low:+.0f} to {high:+.0f})" if t.spread else ""
    elif t.unit in ("x", "x memcpy"):
        measured = f"{t.measured:.2f}x"
        need = f"{'>=' if t.higher_is_better else '<='} {t.threshold:g}x"
        spread = f" ({low:.2f}-{high:.2f})" if t.spread else ""
    else:
        measured, need = f"{t.measured:.3f}", f">= {t.threshold:g}"
        spread = f" ({low:.3f}-{high:.3f})" if t.spread else ""
    return measured + spread, need


def markdown(
    cells: Sequence[Cell],
    summary: Dict[str, Any],
    targets: Sequence[Target],
    machine: Dict[str, Any],
    meta: Dict[str, Any],
    compared: Optional[Dict[str, Dict[str, Any]]] = None,
    extras: Optional[Dict[str, Any]] = None,
) -> str:
    """The results as markdown: the machine, the targets, the full table, W3 scaling, W5's
    pipeline table and the stacking micro-benchmark."""
    compared = compared or {}
    extras = extras or {}
    lines = []
    if meta.get("quick"):
        lines += [
            "**A `--quick` smoke run**: small datasets and one round; the numbers show that "
            "the machinery works, not how fast anything is.",
            "",
        ]
    lines += [
        f"Measured {meta['date']} on {machine['cpu']} ({machine['cores']} cores, "
        f"{machine['ram_gb']:.0f} GiB), Python {machine['python']}, MXNet {machine['mxnet']}, "
        f"numpy {machine['numpy']}{', torch ' + machine['torch'] if machine.get('torch') else ''}"
        f"; shardloader at commit {machine.get('shardloader_commit') or '?'}"
        f"{' with local changes' if machine.get('shardloader_dirty') else ''}."
        f" Run time {meta['total_s']:.0f} s, {meta['rounds']} rounds; load average "
        f"{meta['load_start']:.1f} at the start, {meta['load_end']:.1f} at the end"
        + (
            f"; other processes kept {meta['foreign_cores']:.2f} cores busy (median over runs)."
            if meta.get("foreign_cores") is not None
            else "."
        ),
        "",
        "**Targets** (median of per-round ratios, min-max in brackets; `num_workers=2`):",
        "",
        "| target | measured | need | set by | |",
        "|---|---|---|---|---|",
    ]
    for t in targets:
        measured, need = _fmt_target(t)
        lines.append(f"| {t.name} | {measured} | {need} | {t.source} | {t.status} |")
    lines += [
        "",
        "**All cells** (medians; ratio = ours/gluon samples/s, paired per round; other load ="
        " cores kept busy by other processes during the run):",
        "",
        "| cell | loader | reps | samples/s | batches/s | MB/s | overhead µs/batch "
        "| p50 ms | p99 ms | first batch ms | peak RSS MB | peak PSS MB | ratio | other load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        entry = summary[cell.key]
        for loader in cell.loaders:
            m = entry["loaders"][loader]
            ratio = entry["ratios"].get(loader)
            ratio_s = f"{ratio['median']:.2f}x" if ratio and ratio["median"] else ""
            if m["reps"] == 0:
                err = _one_line((m["errors"] or ["no runs"])[0])
                lines.append(f"| {cell.key} | {loader} | 0 | error: {err} |" + " |" * 10)
                continue
            lines.append(
                f"| {cell.key} | {loader} | {m['reps']} | {_fmt(m['samples_per_s'])} "
                f"| {_fmt(m['batches_per_s'])} | {_fmt(m['mb_per_s'])} "
                f"| {_fmt(m['overhead_us'])} | {_fmt(m['lat_p50_us'], 2, 1e-3)} "
                f"| {_fmt(m['lat_p99_us'], 2, 1e-3)} | {_fmt(m['first_batch_ms'])} "
                f"| {_fmt(m['peak_rss_mb'])} | {_fmt(m['peak_pss_mb'])} | {ratio_s} "
                f"| {_fmt(m['foreign_cores'], 2)} |"
            )
    problems = [
        f"{key} {loader}: {m['leftover_runs']} run(s) left worker processes behind"
        for key, entry in summary.items()
        for loader, m in entry["loaders"].items()
        if m.get("leftover_runs")
    ] + [
        f"{key} {loader}: {len(m['errors'])} failed run(s): {_one_line(m['errors'][0])}"
        for key, entry in summary.items()
        for loader, m in entry["loaders"].items()
        if m.get("errors")
    ]
    if meta.get("sources_changed_during_run"):
        problems.append(
            "shardloader's sources changed during the run (every run used the version from "
            "the start)"
        )
    if problems:
        lines += ["", "**Problems seen during the run:**", ""] + [f"- {p}" for p in problems]
    rows = []
    for loader in ("gluon", "ours", "torch"):
        for pin in (False, True):
            frac = scaling(summary, loader, pin)
            if frac is not None:
                rows.append(f"| {loader}{' pin' if pin else ''} | {2 * frac:.2f}x | {frac:.3f} |")
    if rows:
        lines += [
            "",
            "**W3 scaling** (`num_workers=2` over `num_workers=0`, same loader):",
            "",
            "| loader | speed-up | fraction of ideal 2x |",
            "|---|---|---|",
            *rows,
        ]
    cal = meta.get("calibration")
    if cal:
        lines += [
            "",
            f"W3 work calibrated to {cal['work_passes']} numpy passes over 32768 float64: "
            f"{cal['ms_per_sample']:.2f} ms per sample, fastest of 200 calls "
            f"(target {cal['target_ms']:.1f} ms).",
        ]
    lines += _w5_lines(summary, compared, extras, meta)
    lines += _stacking_lines(extras)
    if extras.get("errors"):
        lines += ["", "**Tasks that failed:**", ""] + [f"- {e}" for e in extras["errors"]]
    return "\n".join(lines) + "\n"


_W5_ROWS = (
    (W5_PROCESS, RECORDITER, "ImageRecordIter", "C++, preprocess_threads=2"),
    (W5_PROCESS, "gluon-cpp", "gluon, try_nopython=True", "C++, 2 threads"),
    (W5_PROCESS, "ours-cpp", "ours, try_nopython=True", "C++, 2 threads"),
    (W5_PROCESS, "gluon", "gluon", "process"),
    (W5_PROCESS, "ours", "ours", "process"),
    (W5_PROCESS, "torch", "torch", "process"),
    (W5_THREAD, "gluon", "gluon", "thread"),
    (W5_THREAD, "ours", "ours", "thread"),
    (W5_INLINE, "gluon", "gluon", "inline"),
    (W5_INLINE, "ours", "ours", "inline"),
)


def _fmt_ratio(ratio: Optional[Dict[str, Any]]) -> str:
    if not ratio or ratio.get("median") is None:
        return "-"
    return f"{ratio['median']:.2f}x"


def _w5_lines(
    summary: Dict[str, Any],
    compared: Dict[str, Dict[str, Any]],
    extras: Dict[str, Any],
    meta: Dict[str, Any],
) -> List[str]:
    if not any(key in summary for key in (W5_PROCESS, W5_THREAD, W5_INLINE)):
        return []
    probe = extras.get("jpeg_per_sample")
    recorditer = {
        (W5_PROCESS, "ours"): compared.get("W5 ours process / ImageRecordIter"),
        (W5_PROCESS, "gluon"): compared.get("W5 gluon process / ImageRecordIter"),
        (W5_THREAD, "ours"): compared.get("W5 ours thread / ImageRecordIter"),
        (W5_INLINE, "ours"): compared.get("W5 ours inline / ImageRecordIter"),
        (W5_PROCESS, "ours-cpp"): compared.get("W5 ours-cpp / ImageRecordIter"),
        (W5_PROCESS, "gluon-cpp"): compared.get("W5 gluon-cpp / ImageRecordIter"),
    }
    per_image = "not measured"
    if probe:
        cpu = probe.get("cpu_per_sample")
        per_image = (
            f"{probe['s_per_sample'] * 1e3:.2f} ms per image (median of {probe['reps']} "
            f"round(s) of {probe['samples']} `dataset[i]` calls"
            + (f"; {cpu * 1e3:.2f} ms of CPU)" if cpu else ")")
        )
    lines = [
        "",
        f"**W5, the JPEG pipeline** ({meta.get('samples', {}).get('W5', '?')} JPEGs of 320x256, "
        "batch 64, shuffled; img/s are medians, ratios paired per round; the ideal is "
        f"`max(1, num_workers)` times the single-process rate, {per_image}):",
        "",
        "| loader | workers | img/s | vs ImageRecordIter | vs gluon, same workers "
        "| ideal img/s | of ideal |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, loader, label, mode in _W5_ROWS:
        entry = summary.get(key)
        if entry is None or loader not in entry["loaders"]:
            continue
        m = entry["loaders"][loader]
        if not m["reps"]:
            err = _one_line((m["errors"] or ["no runs"])[0])
            lines.append(f"| {label} | {mode} | failed: {err} | | | | |")
            continue
        nw = entry["cell"]["num_workers"]
        native = loader == RECORDITER or loader in CPP_LOADERS
        ideal = None if native else w5_ideal(extras, nw)
        if loader == "ours-cpp":  # against Gluon's loader with the same switch
            vs_gluon = compared.get("W5 ours-cpp / gluon-cpp")
        elif loader in ("gluon", "gluon-cpp", RECORDITER):
            vs_gluon = None
        else:
            vs_gluon = entry["ratios"].get(loader)
        lines.append(
            f"| {label} | {mode} | {_fmt(m['samples_per_s'])} "
            f"| {_fmt_ratio(recorditer.get((key, loader)))} | {_fmt_ratio(vs_gluon)} "
            f"| {_fmt(ideal)} "
            f"| {_fmt(m['samples_per_s'] / ideal, 2) if ideal else '-'} |"
        )
    return lines


_STACK_LABELS = {
    "memcpy": "memcpy of the same bytes (floor)",
    "ours": "shardloader `default_batchify_fn`, reused buffer",
    "gluon": "Gluon `default_batchify_fn` (`nd.stack`)",
    "gluon_mp": "Gluon `default_mp_batchify_fn` (new `cpu_shared` array)",
}


def _stacking_lines(extras: Dict[str, Any]) -> List[str]:
    stack = extras.get("stacking")
    if not stack:
        return []
    lines = [
        "",
        f"**Stacking 64 NDArrays of float32 3x224x224** ({stack['bytes'] / 1e6:.1f} MB per "
        f"batch; median per call over {stack['reps']} round(s)):",
        "",
        "| method | ms per batch | GB/s | time / memcpy |",
        "|---|---|---|---|",
    ]
    for name, m in stack["methods"].items():
        rate = stack["bytes"] / m["median_s"] / 1e9 if m["median_s"] else None
        lines.append(
            f"| {_STACK_LABELS.get(name, name)} | {m['median_s'] * 1e3:.2f} | {_fmt(rate, 2)} "
            f"| {_fmt(m['x_memcpy'], 2)} |"
        )
    return lines


def plot(summary: Dict[str, Any], runs: Sequence[Dict[str, Any]], path: str) -> Optional[str]:
    """Throughput against ``num_workers`` for W1 and W2, every loader; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    workloads = [w for w in ("W1", "W2") if Cell(w, 1).key in summary]
    if not workloads:
        return None
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        for loader, style in (("gluon", "o--"), ("ours", "s-"), ("torch", "^:")):
            xs, ys, lo, hi = [], [], [], []
            for nw in (0, 1, 2, 4):
                key = Cell(workload, nw).key
                values = [
                    r["result"]["samples_per_s"]
                    for r in runs
                    if r["cell"] == key and r["loader"] == loader and "error" not in r["result"]
                ]
                if values:
                    med = statistics.median(values)
                    xs.append(nw)
                    ys.append(med)
                    lo.append(med - min(values))
                    hi.append(max(values) - med)
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, capsize=3, label=loader)
            if loader != "gluon":
                for x, y in zip(xs, ys):
                    ratio = summary[Cell(workload, x).key]["ratios"].get(loader) or {}
                    if ratio.get("median"):
                        ax.annotate(
                            f"{ratio['median']:.1f}x",
                            (x, y),
                            textcoords="offset points",
                            xytext=(6, 6),
                            fontsize=8,
                        )
        ax.set_title(f"{workload}: {_TITLES[workload]}")
        ax.set_xlabel("num_workers (process workers; 0 = inline)")
        ax.set_ylabel("samples/s (median, min-max; label: ratio to gluon)")
        ax.set_yscale("log")
        ax.set_xticks([0, 1, 2, 4])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_TITLES = {"W1": "64 float32, batch 32", "W2": "3x224x224 uint8, batch 64"}


def write_results(
    out_dir: str,
    cells: Sequence[Cell],
    runs: Sequence[Dict[str, Any]],
    machine: Dict[str, Any],
    meta: Dict[str, Any],
    extras: Sequence[Dict[str, Any]] = (),
) -> Dict[str, Any]:
    """Write results.json, results.md and throughput.png into ``out_dir``; return paths,
    summary and targets. ``extras`` are the runs of tasks that are not loaders (dicts with
    ``task``, ``round`` and ``result``)."""
    os.makedirs(out_dir, exist_ok=True)
    meta = dict(meta)
    meta["foreign_cores"] = _median([r["result"].get("foreign_cores") for r in runs])
    summary = summarise(cells, runs)
    compared = comparisons(runs)
    extra_summary = summarise_extras(extras)
    targets = check_targets(summary, compared, extra_summary)
    md = markdown(cells, summary, targets, machine, meta, compared, extra_summary)
    paths = {
        "json": os.path.join(out_dir, "results.json"),
        "md": os.path.join(out_dir, "results.md"),
        "png": os.path.join(out_dir, "throughput.png"),
    }
    with open(paths["md"], "w") as f:
        f.write(md)
    if plot(summary, runs, paths["png"]) is None:
        paths["png"] = None
    with open(paths["json"], "w") as f:
        json.dump(
            {
                "machine": machine,
                "meta": meta,
                "cells": [{**_cell_dict(c), "key": c.key} for c in cells],
                "summary": summary,
                "comparisons": compared,
                "extras_summary": extra_summary,
                "targets": [
                    {
                        "name": t.name,
                        "measured": t.measured,
                        "threshold": t.threshold,
                        "unit": t.unit,
                        "spread": t.spread,
                        "status": t.status,
                        "source": t.source,
                    }
                    for t in targets
                ],
                "runs": list(runs),
                "extras": list(extras),
            },
            f,
            indent=1,
        )
    return {
        "paths": paths,
        "summary": summary,
        "comparisons": compared,
        "extras": extra_summary,
        "targets": targets,
        "markdown": md,
    }


def load_results(path: str) -> Tuple[List[Cell], List[Dict[str, Any]], Dict[str, Any], Dict]:
    """The cells, raw runs, machine and meta of a results.json, to report them again (the
    extra tasks' runs are in ``meta["extras"]``)."""
    with open(path) as f:
        saved = json.load(f)
    fields = ("workload", "num_workers", "pin_memory", "thread_pool", "reps")
    loaders = {r["cell"]: [] for r in saved["runs"]}
    for r in saved["runs"]:
        if r["loader"] not in loaders[r["cell"]]:
            loaders[r["cell"]].append(r["loader"])
    cells = []
    for c in saved["cells"]:
        cell = Cell(*(c[k] for k in fields))
        order = [x for x in LOADERS if x in loaders.get(cell.key, [])]
        cells.append(Cell(*(c[k] for k in fields), tuple(order) or cell.loaders))
    meta = dict(saved["meta"], extras=saved.get("extras", []))
    return cells, saved["runs"], saved["machine"], meta


def publish(
    md: str, png: Optional[str], doc_path: str, img_path: str, section: str = "results"
) -> None:
    """Put the results table between the markers of ``section`` in ``doc_path`` (appended
    if missing) and copy the plot."""
    begin, finish = _markers(section)
    block = f"{begin}\n\n{md}\n{finish}"
    text = "# Benchmarks\n"
    if os.path.exists(doc_path):
        with open(doc_path) as f:
            text = f.read()
    start, end = text.find(begin), text.find(finish)
    if start < 0 or end < start:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    else:
        text = text[:start] + block + text[end + len(finish) :]
    with open(doc_path, "w") as f:
        f.write(text)
    if png is not None:
        os.makedirs(os.path.dirname(img_path), exist_ok=True)
        shutil.copyfile(png, img_path)
