"""A run's results as JSON, markdown and a PNG plot, and the docs page they are published
to. The numbers come from ``benchmarks.summary`` (definitions there and in
docs/benchmarks.md), the targets from ``benchmarks.targets``."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .plot import plot
from .summary import (
    RECORDITER,
    W5_INLINE,
    W5_PROCESS,
    W5_THREAD,
    Cell,
    Target,
    cell_dict,
    comparisons,
    median,
    scaling,
    summarise,
    summarise_extras,
    w5_ideal,
)
from .targets import check_targets
from .workloads import CPP_LOADERS, LOADERS

__all__ = ["markdown", "write_results", "load_results", "publish"]


def _markers(section: str) -> Tuple[str, str]:
    """The comments that delimit ``section`` ("results", "results-mx2") in the docs page."""
    return (
        f"<!-- {section}:start (written by python -m benchmarks.run --publish) -->",
        f"<!-- {section}:end -->",
    )


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
    lines = _header_lines(machine, meta)
    lines += _target_lines(targets)
    lines += _cell_lines(cells, summary)
    lines += _problem_lines(summary, meta)
    lines += _w3_lines(summary, meta)
    lines += _w5_lines(summary, compared, extras, meta)
    lines += _stacking_lines(extras)
    if extras.get("errors"):
        lines += ["", "**Tasks that failed:**", ""] + [f"- {e}" for e in extras["errors"]]
    return "\n".join(lines) + "\n"


def _header_lines(machine: Dict[str, Any], meta: Dict[str, Any]) -> List[str]:
    lines = []
    if meta.get("quick"):
        lines += [
            "**A `--quick` smoke run**: small datasets and one round; the numbers show that "
            "the machinery works, not how fast anything is.",
            "",
        ]
    return lines + [
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
    ]


def _target_lines(targets: Sequence[Target]) -> List[str]:
    lines = [
        "",
        "**Targets** (median of per-round ratios, min-max in brackets; `num_workers=2`):",
        "",
        "| target | measured | need | set by | |",
        "|---|---|---|---|---|",
    ]
    for t in targets:
        measured, need = _fmt_target(t)
        lines.append(f"| {t.name} | {measured} | {need} | {t.source} | {t.status} |")
    return lines


def _cell_lines(cells: Sequence[Cell], summary: Dict[str, Any]) -> List[str]:
    lines = [
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
    return lines


def _problem_lines(summary: Dict[str, Any], meta: Dict[str, Any]) -> List[str]:
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
    if not problems:
        return []
    return ["", "**Problems seen during the run:**", ""] + [f"- {p}" for p in problems]


def _w3_lines(summary: Dict[str, Any], meta: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
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
    return lines


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
    meta["foreign_cores"] = median([r["result"].get("foreign_cores") for r in runs])
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
                "cells": [{**cell_dict(c), "key": c.key} for c in cells],
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
