"""A run's results as markdown: the tables of docs/benchmarks.md, in the page's order.

1. the conditions (machine, versions, load);
2. **at a glance**: every workload's headline cell, shardloader against Gluon's DataLoader;
3. **the image pipeline**: W5 (every loader and mode, against ``mx.io.ImageRecordIter``, with
   its ideal or bound and memory) and W7;
4. **targets**: met or missed, with the spread over the rounds;
5. every cell, the problems seen, W3's scaling and the stacking micro-benchmark.

The numbers come from ``benchmarks.summary``; nothing here measures or reads a clock, so a
saved run reports to the same text every time.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .summary import (
    EXACT,
    RECORDITER,
    UINT8,
    W5_INLINE,
    W5_PROCESS,
    W5_THREAD,
    W7_PROCESS,
    Cell,
    Target,
    scaling,
    w5_bound,
    w5_ideal,
)
from .targets import GLUON, SHARDLOADER
from .workloads import CPP_LOADERS, WORKLOADS

__all__ = ["markdown", "LOADER_NAMES"]

# The loaders as the tables name them (the JSON keeps the short names).
LOADER_NAMES = {
    "gluon": f"{GLUON} DataLoader",
    "ours": SHARDLOADER,
    "torch": "torch DataLoader",
    RECORDITER: "ImageRecordIter",
    "gluon-cpp": f"{GLUON} DataLoader, try_nopython",
    "ours-cpp": f"{SHARDLOADER}, try_nopython",
    EXACT: f"{SHARDLOADER}, exact path",
    UINT8: f"{SHARDLOADER}, uint8 output",
}
_STATUS = {"PASS": "met", "MISS": "missed", "n/a": "n/a"}
_GLANCE = ("W1", "W2", "W3", "W4", "W5", "W6", "W7")


def name(loader: str) -> str:
    """A loader's name in the tables."""
    return LOADER_NAMES.get(loader, loader)


def one_line(error: str, limit: int = 160) -> str:
    """An error for a table cell: its last non-empty line (an MXNetError carries its C++
    traceback above it), without ``|``, at most ``limit`` characters."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    text = (lines[-1] if lines else error).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fmt(value: Optional[float], digits: int = 0, scale: float = 1.0) -> str:
    """A number for a table: thousands as ``12.3k``, small ones to two significant digits."""
    if value is None:
        return "-"
    value = value * scale
    if abs(value) >= 10_000 and digits == 0:
        return f"{value / 1000:,.1f}k"
    if digits == 0 and 0 < abs(value) < 10:
        return f"{value:.2g}"
    return f"{value:,.{digits}f}"


def fmt_ratio(ratio: Optional[Dict[str, Any]], spread: bool = False) -> str:
    """A paired ratio's median, and with ``spread`` its min-max."""
    if not ratio or ratio.get("median") is None:
        return "-"
    text = f"{ratio['median']:.2f}x"
    if spread and ratio.get("min") is not None:
        text += f" ({ratio['min']:.2f}-{ratio['max']:.2f})"
    return text


def fmt_target(t: Target) -> Tuple[str, str]:
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
    else:  # a fraction of an ideal or of a bound
        measured, need = f"{t.measured:.3f}", f">= {t.threshold:g}"
        spread = f" ({low:.3f}-{high:.3f})" if t.spread else ""
    return measured + spread, need


# The first line of the run's details (every cell, problems, W3's scaling, stacking): published
# on the appendix page (docs/benchmarks-method.md), the headline tables before it on
# docs/benchmarks.md.
DETAILS_START = "**All cells**"


def split(md: str) -> Tuple[str, str]:
    """``md`` (from :func:`markdown`) as its headline tables and its details."""
    at = md.find("\n" + DETAILS_START)
    if at < 0:
        return md, ""
    return md[: at + 1], md[at + 1 :]


def markdown(
    cells: Sequence[Cell],
    summary: Dict[str, Any],
    targets: Sequence[Target],
    machine: Dict[str, Any],
    meta: Dict[str, Any],
    compared: Optional[Dict[str, Dict[str, Any]]] = None,
    extras: Optional[Dict[str, Any]] = None,
) -> str:
    """The results as markdown, in the order of the module docstring."""
    compared = compared or {}
    extras = extras or {}
    lines = _header_lines(machine, meta)
    lines += _glance_lines(summary, compared)
    lines += _w5_lines(summary, compared, extras, meta)
    lines += _w7_lines(summary, meta)
    lines += _target_lines(targets)
    lines += _cell_lines(cells, summary)
    lines += _problem_lines(summary, meta)
    lines += _w3_lines(summary, meta)
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


def _glance_lines(summary: Dict[str, Any], compared: Dict[str, Dict[str, Any]]) -> List[str]:
    """One row per workload: its headline cell (two process workers), both loaders."""
    rows = []
    for workload in _GLANCE:
        entry = summary.get(Cell(workload, 2).key)
        if entry is None or "ours" not in entry["loaders"]:
            continue
        ours, gluon = entry["loaders"]["ours"], entry["loaders"].get("gluon", {})
        other = "-"
        if workload == "W5" and compared.get("W5 ours process / ImageRecordIter"):
            recorditer = entry["loaders"].get(RECORDITER, {})
            other = (
                f"ImageRecordIter {fmt(recorditer.get('samples_per_s'))}: "
                f"{fmt_ratio(compared['W5 ours process / ImageRecordIter'], True)}"
            )
        rows.append(
            f"| {workload} | {WORKLOADS[workload].title} "
            f"| {fmt(ours.get('samples_per_s'))} | {fmt(gluon.get('samples_per_s'))} "
            f"| {fmt_ratio(entry['ratios'].get('ours'), True)} | {other} |"
        )
    if not rows:
        return []
    return [
        "",
        f"**At a glance** (samples/s, `num_workers=2` process workers, medians; the ratio is "
        f"{SHARDLOADER} over {name('gluon')}, paired per round, min-max in brackets):",
        "",
        f"| workload | data | {SHARDLOADER} | {name('gluon')} | ratio | other loaders |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


def _target_lines(targets: Sequence[Target]) -> List[str]:
    if not targets:
        return []
    lines = [
        "",
        "**Targets** (medians of paired per-round ratios or differences, min-max in brackets; "
        "`num_workers=2` process workers unless named):",
        "",
        "| target | measured | need | |",
        "|---|---|---|---|",
    ]
    for t in targets:
        measured, need = fmt_target(t)
        lines.append(f"| {t.name} | {measured} | {need} | {_STATUS[t.status]} |")
    return lines


def _cell_lines(cells: Sequence[Cell], summary: Dict[str, Any]) -> List[str]:
    lines = [
        "",
        f"**All cells** (medians; ratio = loader over {name('gluon')} samples/s, paired per "
        "round; other load = cores kept busy by other processes during the run):",
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
                err = one_line((m["errors"] or ["no runs"])[0])
                lines.append(f"| {cell.key} | {name(loader)} | 0 | error: {err} |" + " |" * 10)
                continue
            lines.append(
                f"| {cell.key} | {name(loader)} | {m['reps']} | {fmt(m['samples_per_s'])} "
                f"| {fmt(m['batches_per_s'])} | {fmt(m['mb_per_s'])} "
                f"| {fmt(m['overhead_us'])} | {fmt(m['lat_p50_us'], 2, 1e-3)} "
                f"| {fmt(m['lat_p99_us'], 2, 1e-3)} | {fmt(m['first_batch_ms'])} "
                f"| {fmt(m['peak_rss_mb'])} | {fmt(m['peak_pss_mb'])} | {ratio_s} "
                f"| {fmt(m['foreign_cores'], 2)} |"
            )
    return lines


def _problem_lines(summary: Dict[str, Any], meta: Dict[str, Any]) -> List[str]:
    problems = [
        f"{key} {name(loader)}: {m['leftover_runs']} run(s) left worker processes behind"
        for key, entry in summary.items()
        for loader, m in entry["loaders"].items()
        if m.get("leftover_runs")
    ] + [
        f"{key} {name(loader)}: {len(m['errors'])} failed run(s): {one_line(m['errors'][0])}"
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
                label = f"{name(loader)}{', pin_memory' if pin else ''}"
                rows.append(f"| {label} | {2 * frac:.2f}x | {frac:.3f} |")
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


# (cell, loader, workers): the rows of the W5 table, in order.
_W5_ROWS = (
    (W5_PROCESS, RECORDITER, "C++, preprocess_threads=2"),
    (W5_PROCESS, "gluon-cpp", "C++, 2 threads"),
    (W5_PROCESS, "ours-cpp", "C++, 2 threads"),
    (W5_PROCESS, "ours", "process"),
    (W5_PROCESS, UINT8, "process"),
    (W5_PROCESS, EXACT, "process"),
    (W5_PROCESS, "gluon", "process"),
    (W5_PROCESS, "torch", "process"),
    (W5_THREAD, "ours", "thread"),
    (W5_THREAD, "gluon", "thread"),
    (W5_INLINE, "ours", "inline"),
    (W5_INLINE, "gluon", "inline"),
)
# Each row's ratio to ImageRecordIter (a comparison of benchmarks.summary).
_VS_RECORDITER = {
    (W5_PROCESS, "ours"): "W5 ours process / ImageRecordIter",
    (W5_PROCESS, "gluon"): "W5 gluon process / ImageRecordIter",
    (W5_PROCESS, EXACT): "W5 ours-exact process / ImageRecordIter",
    (W5_PROCESS, UINT8): "W5 ours-uint8 process / ImageRecordIter",
    (W5_THREAD, "ours"): "W5 ours thread / ImageRecordIter",
    (W5_INLINE, "ours"): "W5 ours inline / ImageRecordIter",
    (W5_PROCESS, "ours-cpp"): "W5 ours-cpp / ImageRecordIter",
    (W5_PROCESS, "gluon-cpp"): "W5 gluon-cpp / ImageRecordIter",
}


def _probe_text(probe: Optional[Dict[str, Any]], what: str) -> str:
    if not probe:
        return f"{what}: not measured"
    cpu = probe.get("cpu_per_sample")
    return (
        f"{what}: {probe['s_per_sample'] * 1e3:.2f} ms per image (median of {probe['reps']} "
        f"round(s) of {probe['samples']} images" + (f"; {cpu * 1e3:.2f} ms of CPU)" if cpu else ")")
    )


def _w5_lines(
    summary: Dict[str, Any],
    compared: Dict[str, Dict[str, Any]],
    extras: Dict[str, Any],
    meta: Dict[str, Any],
) -> List[str]:
    if not any(key in summary for key in (W5_PROCESS, W5_THREAD, W5_INLINE)):
        return []
    exact = _probe_text(extras.get("jpeg_per_sample"), "Gluon's pipeline, `dataset[i]`")
    fused = _probe_text(extras.get("fused_per_sample"), "decode + crop in the fused code")
    lines = [
        "",
        f"**W5, JPEGs from a `.rec`** ({meta.get('samples', {}).get('W5', '?')} JPEGs of "
        "320x256 through `RandomResizedCrop(224)`, flip, `ToTensor`, `Normalize`; batch 64, "
        "shuffled; img/s are medians, ratios paired per round. The ideal is "
        "`max(1, num_workers)` over one process's time per image for the work of the row's "
        f"image path: on the fused path the decode bound ({fused}), on the exact path "
        f"Gluon's whole pipeline ({exact})):",
        "",
        "| loader | workers | image path | img/s | vs ImageRecordIter | vs Gluon, same workers "
        "| ideal img/s | of ideal | peak RSS MB | peak PSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, loader, mode in _W5_ROWS:
        entry = summary.get(key)
        if entry is None or loader not in entry["loaders"]:
            continue
        m = entry["loaders"][loader]
        if not m["reps"]:
            err = one_line((m["errors"] or ["no runs"])[0])
            lines.append(f"| {name(loader)} | {mode} | failed: {err} |" + " |" * 7)
            continue
        ideal = _ideal(extras, entry["cell"]["num_workers"], loader, m.get("image_path"))
        if loader == "ours-cpp":  # against Gluon's loader with the same switch
            vs_gluon = compared.get("W5 ours-cpp / gluon-cpp")
        elif loader in ("gluon", "gluon-cpp", RECORDITER):
            vs_gluon = None
        else:
            vs_gluon = entry["ratios"].get(loader)
        lines.append(
            f"| {name(loader)} | {mode} | {_path(loader, m.get('image_path'))} "
            f"| {fmt(m['samples_per_s'])} "
            f"| {fmt_ratio(compared.get(_VS_RECORDITER.get((key, loader), '')))} "
            f"| {fmt_ratio(vs_gluon)} | {fmt(ideal)} "
            f"| {fmt(m['samples_per_s'] / ideal, 2) if ideal else '-'} "
            f"| {fmt(m['peak_rss_mb'])} | {fmt(m['peak_pss_mb'])} |"
        )
    return lines


def _path(loader: str, image_path: Optional[str]) -> str:
    """The image path a row ran: what shardloader's ``stats()`` said, else what it is."""
    if image_path:
        return image_path.replace("|", "/")
    if loader == RECORDITER or loader in CPP_LOADERS:
        return "C++"
    if loader == UINT8:
        return "fused"
    return "Gluon's transforms" if loader in ("gluon", "torch") else "-"


def _ideal(
    extras: Dict[str, Any], num_workers: int, loader: str, image_path: Optional[str]
) -> Optional[float]:
    """A row's ideal: the decode bound on the fused path, Gluon's pipeline's otherwise; none
    for the C++ loaders, whose work is different."""
    if loader == RECORDITER or loader in CPP_LOADERS:
        return None
    if loader == UINT8 or image_path == "fused":
        return w5_bound(extras, num_workers)
    return w5_ideal(extras, num_workers)


def _w7_lines(summary: Dict[str, Any], meta: Dict[str, Any]) -> List[str]:
    entry = summary.get(W7_PROCESS)
    if entry is None:
        return []
    lines = [
        "",
        f"**W7, JPEG files in class folders** (W5's {meta.get('samples', {}).get('W7', '?')} "
        "JPEGs as files in 16 folders, Gluon's `ImageFolderDataset` and W5's transforms; "
        "`num_workers=2` process workers; medians, ratios paired per round):",
        "",
        "| loader | image path | img/s | vs Gluon | peak RSS MB | peak PSS MB |",
        "|---|---|---|---|---|---|",
    ]
    for loader, m in entry["loaders"].items():
        if not m["reps"]:
            err = one_line((m["errors"] or ["no runs"])[0])
            lines.append(f"| {name(loader)} | failed: {err} |" + " |" * 4)
            continue
        ratio = None if loader == "gluon" else entry["ratios"].get(loader)
        lines.append(
            f"| {name(loader)} | {_path(loader, m.get('image_path'))} "
            f"| {fmt(m['samples_per_s'])} | {fmt_ratio(ratio, True)} "
            f"| {fmt(m['peak_rss_mb'])} | {fmt(m['peak_pss_mb'])} |"
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
    for method, m in stack["methods"].items():
        rate = stack["bytes"] / m["median_s"] / 1e9 if m["median_s"] else None
        lines.append(
            f"| {_STACK_LABELS.get(method, method)} | {m['median_s'] * 1e3:.2f} "
            f"| {fmt(rate, 2)} | {fmt(m['x_memcpy'], 2)} |"
        )
    return lines
