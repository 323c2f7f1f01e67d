"""A run's results as JSON, markdown and a PNG plot, and the docs page they are published
to. The numbers come from ``benchmarks.summary`` (definitions there and in
docs/benchmarks.md), the targets from ``benchmarks.targets``, the markdown from
``benchmarks.tables``."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .plot import plot
from .summary import Cell, cell_dict, comparisons, median, summarise, summarise_extras
from .tables import markdown, split
from .targets import check_targets
from .workloads import LOADERS

__all__ = ["markdown", "write_results", "load_results", "publish", "markers"]


def markers(section: str) -> Tuple[str, str]:
    """The comments that delimit ``section`` ("results", "results-mx2") in the docs page."""
    return (
        f"<!-- {section}:start (written by python -m benchmarks.run --publish) -->",
        f"<!-- {section}:end -->",
    )


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
    md: str,
    png: Optional[str],
    doc_path: str,
    img_path: str,
    section: str = "results",
    details_path: Optional[str] = None,
) -> None:
    """Put the results tables between the markers of ``section`` in ``doc_path`` (appended
    if missing) and copy the plot. With ``details_path``, the headline tables go to
    ``doc_path`` and the details (every cell, ...) to ``details_path``, section
    ``{section}-cells``."""
    if details_path is not None:
        md, details = split(md)
        _replace_section(details, details_path, f"{section}-cells", "# Benchmarks: method\n")
    _replace_section(md, doc_path, section, "# Benchmarks\n")
    if png is not None:
        os.makedirs(os.path.dirname(img_path), exist_ok=True)
        shutil.copyfile(png, img_path)


def _replace_section(md: str, doc_path: str, section: str, title: str) -> None:
    begin, finish = markers(section)
    block = f"{begin}\n\n{md}\n{finish}"
    text = title
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
