"""What ``shardloader bench`` prints: the table, the recommendation and the plot."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

__all__ = ["LOADERS", "recommend", "format_table", "plot"]

LOADERS = ("shardloader", "gluon")
_MB = 1024.0 * 1024.0
# Worker counts within this share of the best throughput count as "as fast".
_WITHIN_BEST = 0.05
# With --step-ms, the stall a recommended configuration may leave.
_ACCEPTABLE_STALL = 0.05
# Prefetched batches may hold at most this much memory.
_PREFETCH_BUDGET_BYTES = 256 * 1024 * 1024


def recommend(rows: List[Dict[str, Any]], step_ms: float) -> Tuple[int, int, List[str]]:
    """Choose ``num_workers`` and ``prefetch`` from shardloader's rows (those that did not
    fail), and say why.

    Returns
    -------
    (int, int, list of str)
        The worker count, the prefetch (0 when ``num_workers`` is 0; it does not apply) and
        one line of explanation for each.
    """
    ours = [r for r in rows if r["loader"] == "shardloader" and "error" not in r]
    best = max(ours, key=lambda r: r["samples_per_s"])
    why = []
    calm = [r for r in ours if r["stall"] is not None and r["stall"] <= _ACCEPTABLE_STALL]
    if step_ms > 0 and calm:
        pick = min(calm, key=lambda r: r["workers"])
        why.append(
            f"num_workers: the fewest workers that keep the data stall at or under "
            f"{_ACCEPTABLE_STALL:.0%} with a {step_ms:g} ms step."
        )
    else:
        pick = min(
            (r for r in ours if r["samples_per_s"] >= (1 - _WITHIN_BEST) * best["samples_per_s"]),
            key=lambda r: r["workers"],
        )
        why.append(
            f"num_workers: the fewest workers within {_WITHIN_BEST:.0%} of the best throughput "
            f"({best['samples_per_s']:,.0f} samples/s with {best['workers']}); more workers "
            f"cost memory and start-up time and buy nothing here."
        )
    workers = pick["workers"]
    if workers == 0:
        why.append("prefetch: not used with num_workers=0 (batches load in the training loop).")
        return workers, 0, why
    cap = max(1, int(_PREFETCH_BUDGET_BYTES // max(pick["batch_bytes"], 1.0)))
    prefetch = max(1, min(2 * workers, cap))
    why.append(
        f"prefetch: 2 x num_workers (one batch in the making and one ready per worker, which "
        f"absorbs slow batches), capped so prefetched batches hold at most "
        f"{_PREFETCH_BUDGET_BYTES / _MB:.0f} MiB (a batch is {_fmt_bytes(pick['batch_bytes'])})."
    )
    return workers, prefetch, why


def _fmt_bytes(size: float) -> str:
    return f"{size / _MB:.1f} MiB" if size >= _MB else f"{size / 1024:.1f} KiB"


def _fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def format_table(rows: List[Dict[str, Any]]) -> List[str]:
    """The result rows as aligned text, with shardloader's speed-up over Gluon."""
    header = (
        f"{'workers':>7}  {'loader':<12}{'samples/s':>12}{'data stall':>12}"
        f"{'first batch':>13}{'peak RSS':>11}{'vs gluon':>10}"
    )
    lines = [header, "-" * len(header)]
    gluon = {r["workers"]: r for r in rows if r["loader"] == "gluon" and "error" not in r}
    for r in rows:
        if "error" in r:
            lines.append(f"{r['workers']:>7}  {r['loader']:<12}  failed: {r['error']}")
            continue
        stall = "-" if r["stall"] is None else f"{r['stall']:.1%}"
        ratio = ""
        if r["loader"] == "shardloader" and r["workers"] in gluon:
            ratio = f"{r['samples_per_s'] / gluon[r['workers']]['samples_per_s']:.2f}x"
        lines.append(
            f"{r['workers']:>7}  {r['loader']:<12}{r['samples_per_s']:>12,.0f}{stall:>12}"
            f"{_fmt_time(r['first_batch_s']):>13}{r['peak_rss_mb']:>8.0f} MB{ratio:>10}"
        )
    return lines


def plot(rows: List[Dict[str, Any]], path: str, title: str) -> None:
    """Save samples/s against num_workers for both loaders as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in LOADERS:
        mine = sorted(
            (r for r in rows if r["loader"] == name and "error" not in r),
            key=lambda r: r["workers"],
        )
        ax.plot([r["workers"] for r in mine], [r["samples_per_s"] for r in mine], "o-", label=name)
    ax.set_xticks(sorted({r["workers"] for r in rows}))
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
