"""The throughput plot of the results: samples/s against ``num_workers`` for W1 and W2."""

from __future__ import annotations

import statistics
from typing import Any, Dict, Optional, Sequence

from .summary import Cell
from .tables import name

__all__ = ["plot"]


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
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.4), squeeze=False)
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
                ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, capsize=3, label=name(loader))
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
                            annotation_clip=False,
                        )
        ax.set_title(f"{workload}: {_TITLES[workload]}")
        ax.set_xlabel("num_workers (process workers; 0 = inline)")
        ax.set_ylabel(f"samples/s (median, min-max)\nlabels: {name('ours')} / {name('gluon')}")
        ax.set_yscale("log")
        ax.set_xticks([0, 1, 2, 4])
        # Room right of num_workers=4 and above the top point for the ratio labels.
        ax.set_xlim(-0.4, 4.9)
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * 1.6)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_TITLES = {"W1": "64 float32, batch 32", "W2": "3x224x224 uint8, batch 64"}
