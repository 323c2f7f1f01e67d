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
  ``samples/s at num_workers=0``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["Cell", "Target", "summarise", "check_targets", "write_results", "publish"]

_DOC_START = "<!-- results:start (written by python -m benchmarks.run --publish) -->"
_DOC_END = "<!-- results:end -->"


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
    unit: str  # "x" for a ratio, "of ideal", "MB"
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
        return "PASS" if ok else "FAIL"


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
                entry["ratios"][loader] = _paired_ratio(mine, loader, "gluon", "samples_per_s")
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


def _paired_ratio(
    runs: Sequence[Dict[str, Any]], loader: str, base: str, metric: str
) -> Dict[str, Any]:
    by_round: Dict[int, Dict[str, float]] = {}
    for r in runs:
        value = r["result"].get(metric)
        if "error" not in r["result"] and value:
            by_round.setdefault(r["round"], {})[r["loader"]] = value
    ratios = [v[loader] / v[base] for v in by_round.values() if loader in v and base in v]
    return {
        "median": _median(ratios),
        "min": min(ratios) if ratios else None,
        "max": max(ratios) if ratios else None,
        "per_round": ratios,
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


def _ratio(summary: Dict[str, Any], key: str) -> Tuple[Optional[float], Optional[Tuple]]:
    ratio = summary.get(key, {}).get("ratios", {}).get("ours")
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


def check_targets(summary: Dict[str, Any]) -> List[Target]:
    """The performance targets of issue 4, evaluated on the medians of the cells that ran."""
    targets: List[Target] = []

    def ran(key: str) -> bool:
        loaders = summary.get(key, {}).get("loaders", {})
        return bool(loaders) and all(m.get("reps") for m in loaders.values())

    for pin in (False, True):
        tag = " pin_memory" if pin else ""
        for workload, need in (("W1", 4.0), ("W2", 3.0), ("W4", 2.0)):
            key = Cell(workload, 2, pin_memory=pin).key
            if not ran(key):
                continue
            value, spread = _ratio(summary, key)
            targets.append(Target(f"{workload}{tag} ours/gluon", value, need, "x", spread))
            if workload == "W2" and not pin:
                loaders = summary[key]["loaders"]
                diff = loaders["ours"]["peak_rss_mb"] - loaders["gluon"]["peak_rss_mb"]
                targets.append(
                    Target("W2 peak RSS, ours - gluon", diff, 0.0, "MB", higher_is_better=False)
                )
        if ran(Cell("W3", 0).key) and ran(Cell("W3", 2, pin_memory=pin).key):
            frac = scaling(summary, "ours", pin)
            targets.append(Target(f"W3{tag} ours, fraction of ideal 2x", frac, 0.9, "of ideal"))
    for workload in ("W1", "W2", "W3"):
        key = Cell(workload, 2, thread_pool=True).key
        if ran(key):
            value, spread = _ratio(summary, key)
            targets.append(Target(f"{workload} thread ours/gluon", value, 1.0, "x", spread))
    return targets


# ---------------------------------------------------------------------------- output
def _fmt(value: Optional[float], digits: int = 0, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    value = value * scale
    if abs(value) >= 10_000 and digits == 0:
        return f"{value / 1000:,.1f}k"
    if digits == 0 and 0 < abs(value) < 10:
        return f"{value:.2g}"
    return f"{value:,.{digits}f}"


def _fmt_target(t: Target) -> Tuple[str, str]:
    if t.measured is None:
        return "-", "-"
    if t.unit == "x":
        measured = f"{t.measured:.2f}x"
        if t.spread:
            measured += f" ({t.spread[0]:.2f}-{t.spread[1]:.2f})"
        return measured, f">= {t.threshold:g}x"
    if t.unit == "MB":
        return f"{t.measured:+.0f} MB", f"<= {t.threshold:g} MB"
    return f"{t.measured:.3f}", f">= {t.threshold:g}"


def markdown(
    cells: Sequence[Cell],
    summary: Dict[str, Any],
    targets: Sequence[Target],
    machine: Dict[str, Any],
    meta: Dict[str, Any],
) -> str:
    """The results as markdown: the machine, the targets, the full table and W3 scaling."""
    lines = [
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
        "| target | measured | need | |",
        "|---|---|---|---|",
    ]
    for t in targets:
        measured, need = _fmt_target(t)
        lines.append(f"| {t.name} | {measured} | {need} | {t.status} |")
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
                err = (m["errors"] or ["no runs"])[0]
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
        f"{key} {loader}: {len(m['errors'])} failed run(s): {m['errors'][0]}"
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
    return "\n".join(lines) + "\n"


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
) -> Dict[str, Any]:
    """Write results.json, results.md and throughput.png into ``out_dir``; return paths,
    summary and targets."""
    os.makedirs(out_dir, exist_ok=True)
    meta = dict(meta)
    meta["foreign_cores"] = _median([r["result"].get("foreign_cores") for r in runs])
    summary = summarise(cells, runs)
    targets = check_targets(summary)
    md = markdown(cells, summary, targets, machine, meta)
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
                "targets": [
                    {
                        "name": t.name,
                        "measured": t.measured,
                        "threshold": t.threshold,
                        "unit": t.unit,
                        "spread": t.spread,
                        "status": t.status,
                    }
                    for t in targets
                ],
                "runs": list(runs),
            },
            f,
            indent=1,
        )
    return {"paths": paths, "summary": summary, "targets": targets, "markdown": md}


def load_results(path: str) -> Tuple[List[Cell], List[Dict[str, Any]], Dict[str, Any], Dict]:
    """The cells, raw runs, machine and meta of a results.json, to report them again."""
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
        order = [x for x in ("gluon", "ours", "torch") if x in loaders.get(cell.key, [])]
        cells.append(Cell(*(c[k] for k in fields), tuple(order) or cell.loaders))
    return cells, saved["runs"], saved["machine"], saved["meta"]


def publish(md: str, png: Optional[str], doc_path: str, img_path: str) -> None:
    """Put the results table between the markers of ``doc_path`` and copy the plot."""
    block = f"{_DOC_START}\n\n{md}\n{_DOC_END}"
    if os.path.exists(doc_path):
        with open(doc_path) as f:
            text = f.read()
    else:
        text = f"# Benchmarks\n\n{_DOC_START}\n{_DOC_END}\n"
    start, end = text.find(_DOC_START), text.find(_DOC_END)
    if start < 0 or end < start:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    else:
        text = text[:start] + block + text[end + len(_DOC_END) :]
    with open(doc_path, "w") as f:
        f.write(text)
    if png is not None:
        os.makedirs(os.path.dirname(img_path), exist_ok=True)
        shutil.copyfile(png, img_path)
