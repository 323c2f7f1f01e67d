"""What ``shardloader bench`` prints: the table of medians and spreads, the verdict and the
plot.

:func:`summarize` turns the runs of every round into one row per configuration;
:func:`recommend` chooses ``num_workers`` and ``prefetch`` from shardloader's rows, or says
why it cannot (the rounds disagree too much, or no setting meets ``--step-ms``).
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

__all__ = [
    "LOADERS",
    "RECORD_LOADERS",
    "Advice",
    "summarize",
    "recommend",
    "format_table",
    "against_record_iter",
    "plot",
]

LOADERS = ("shardloader", "gluon")
# With --recordio's image pipeline, also: MXNet's C++ iterator, and shardloader's loader that
# takes its arguments.
RECORD_LOADERS = ("ImageRecordIter", "ImageRecordLoader")
_ORDER = ("shardloader", "ImageRecordLoader", "gluon", "ImageRecordIter")
_MB = 1024.0 * 1024.0
# Worker counts within this share of the best throughput count as "as fast".
_WITHIN_BEST = 0.05
# With --step-ms, the stall a recommended configuration may leave.
_ACCEPTABLE_STALL = 0.05
# Prefetched batches may hold at most this much memory.
_PREFETCH_BUDGET_BYTES = 256 * 1024 * 1024
# Rounds of one configuration that differ by more than this share of their median (max -
# min) are too noisy to choose between worker counts 5% apart.
_NOISY_SPREAD = 0.25


class Advice(NamedTuple):
    """The recommendation: ``workers`` is None when the rounds were too noisy to decide."""

    workers: Optional[int]
    prefetch: int
    why: List[str]
    met_target: bool = True


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def summarize(runs: Dict[Tuple[int, str], List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """One row per ``(workers, loader)``: the medians over the rounds, the range of the
    throughput (``rate_min``, ``rate_max``), the highest peak RSS, and for shardloader the
    median and range of its per-round ratio to Gluon (``ratio``, ``ratio_min``,
    ``ratio_max``). A configuration that failed in any round gives a row with ``error``."""
    rows = []
    for (workers, name), results in runs.items():
        failed = [r for r in results if "error" in r]
        if failed:
            note = f" ({len(failed)} of {len(results)} runs)" if len(results) > 1 else ""
            rows.append({"loader": name, "workers": workers, "error": failed[0]["error"] + note})
            continue
        rates = [r["samples_per_s"] for r in results]
        row = {
            "loader": name,
            "workers": workers,
            "rounds": len(results),
            "samples_per_s": _median(rates),
            "rate_min": min(rates),
            "rate_max": max(rates),
            "stall": _median([r["stall"] for r in results]),
            "first_batch_s": _median([r["first_batch_s"] for r in results]),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
            "batch_bytes": _median([r["batch_bytes"] for r in results]),
        }
        for baseline, key in (("gluon", "ratio"), ("ImageRecordIter", "vs_iter")):
            theirs = runs.get((workers, baseline), [])
            if name in (baseline, "ImageRecordIter") or not theirs:
                continue
            if any("error" in r for r in theirs):
                continue
            # Paired by round: both ran back to back, under the same load.
            ratios = [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(results, theirs)]
            row.update({key: _median(ratios), f"{key}_min": min(ratios), f"{key}_max": max(ratios)})
        rows.append(row)
    rows.sort(key=lambda r: (r["workers"], _ORDER.index(r["loader"])))
    return rows


def against_record_iter(rows: List[Dict[str, Any]]) -> List[str]:
    """For ``--recordio``: each loader's paired ratio to ``mx.io.ImageRecordIter``, a line per
    worker count (none without ImageRecordIter's rows)."""
    lines = []
    for workers in sorted({r["workers"] for r in rows if "vs_iter" in r}):
        parts = [
            f"{r['loader']} {r['vs_iter']:.2f}x "
            f"({_fmt_range(r['vs_iter_min'], r['vs_iter_max'], '.2f')})"
            for r in rows
            if r["workers"] == workers and "vs_iter" in r
        ]
        lines.append(f"  num_workers={workers}: " + ", ".join(parts))
    if not lines:
        return []
    head = (
        "Against mx.io.ImageRecordIter (preprocess_threads=num_workers, 1 for 0), "
        "samples/s paired per round, median (min-max):"
    )
    return [head, *lines]


def spread(row: Dict[str, Any]) -> float:
    """How far a row's rounds were apart: (max - min) / median of its throughput."""
    return (row["rate_max"] - row["rate_min"]) / row["samples_per_s"]


def recommend(rows: List[Dict[str, Any]], step_ms: float) -> Advice:
    """Choose ``num_workers`` and ``prefetch`` from shardloader's rows (those that did not
    fail), and say why; or say that the rounds were too noisy to choose.

    Returns
    -------
    Advice
        The worker count (None: too noisy to decide), the prefetch (0 when ``num_workers``
        is 0; it does not apply), one line of explanation for each, and whether a setting
        met the ``--step-ms`` stall target (always True without one).
    """
    ours = [r for r in rows if r["loader"] == "shardloader" and "error" not in r]
    best = max(ours, key=lambda r: r["samples_per_s"])
    # Noise matters only where it could change the choice: a setting whose best round is
    # still clearly below the best setting's worst one cannot be picked, however it varies.
    floor = (1 - _WITHIN_BEST) * best.get("rate_min", best["samples_per_s"])
    contenders = [r for r in ours if r.get("rate_max", r["samples_per_s"]) >= floor]
    noisy = [r for r in contenders if r.get("rounds", 1) > 1 and spread(r) > _NOISY_SPREAD]
    if noisy and len(contenders) > 1:  # a lone contender is the pick, however it varies
        worst = max(noisy, key=spread)
        return Advice(
            None,
            0,
            [
                f"The rounds of num_workers={worst['workers']} ranged from "
                f"{worst['rate_min']:,.0f} to {worst['rate_max']:,.0f} samples/s, "
                f"{spread(worst):.0%} of their median; worker counts "
                f"{_WITHIN_BEST:.0%} apart cannot be told apart. Run again on a quieter "
                "machine, or with more --rounds (and a --budget-s that fits them) or --batches."
            ],
        )
    why = []
    met = True
    if step_ms > 0:
        calm = [r for r in ours if r["stall"] <= _ACCEPTABLE_STALL]
        if calm:
            pick = min(calm, key=lambda r: r["workers"])
            why.append(
                f"num_workers: the fewest workers that keep the data stall at or under "
                f"{_ACCEPTABLE_STALL:.0%} with a {step_ms:g} ms step."
            )
        else:
            met = False
            pick = min(ours, key=lambda r: (r["stall"], r["workers"]))
            why.append(
                f"Target missed: no num_workers tried keeps the data stall at or under "
                f"{_ACCEPTABLE_STALL:.0%} with a {step_ms:g} ms step; the lowest was "
                f"{pick['stall']:.0%}, with num_workers={pick['workers']}. Loading is the "
                f"bottleneck: try more workers if you have idle cores (--workers), or make "
                f"__getitem__ cheaper."
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
        return Advice(workers, 0, why, met)
    cap = max(1, int(_PREFETCH_BUDGET_BYTES // max(pick["batch_bytes"], 1.0)))
    prefetch = max(1, min(2 * workers, cap))
    why.append(
        f"prefetch: 2 x num_workers (one batch in the making and one ready per worker, which "
        f"absorbs slow batches), capped so prefetched batches hold at most "
        f"{_PREFETCH_BUDGET_BYTES / _MB:.0f} MiB (a batch is {_fmt_bytes(pick['batch_bytes'])})."
    )
    return Advice(workers, prefetch, why, met)


def _fmt_bytes(size: float) -> str:
    return f"{size / _MB:.1f} MiB" if size >= _MB else f"{size / 1024:.1f} KiB"


def _fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _fmt_range(low: float, high: float, fmt: str) -> str:
    return f"{format(low, fmt)}-{format(high, fmt)}"


def format_table(rows: List[Dict[str, Any]]) -> List[str]:
    """The rows as aligned text: medians over the rounds, with the range of the throughput
    and of each loader's paired ratio to Gluon."""
    width = max([12] + [len(r["loader"]) + 1 for r in rows])
    header = (
        f"{'workers':>7}  {'loader':<{width}}{'samples/s':>10}{'(min-max)':>16}{'data stall':>12}"
        f"{'first batch':>13}{'peak RSS':>10}  {'vs gluon (min-max)'}"
    )
    lines = [header, "-" * (len(header) + 4)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['workers']:>7}  {r['loader']:<{width}}  failed: {r['error']}")
            continue
        ratio = ""
        if "ratio" in r:
            ratio = f"{r['ratio']:.2f}x ({_fmt_range(r['ratio_min'], r['ratio_max'], '.2f')})"
        lines.append(
            f"{r['workers']:>7}  {r['loader']:<{width}}{r['samples_per_s']:>10,.0f}"
            f"{_fmt_range(r['rate_min'], r['rate_max'], ',.0f'):>16}{r['stall']:>12.1%}"
            f"{_fmt_time(r['first_batch_s']):>13}{r['peak_rss_mb']:>7.0f} MB  {ratio}".rstrip()
        )
    return lines


def plot(rows: List[Dict[str, Any]], path: str, title: str) -> None:
    """Save samples/s against num_workers for both loaders as a PNG, the medians with the
    range of the rounds as error bars."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in _ORDER:
        mine = sorted(
            (r for r in rows if r["loader"] == name and "error" not in r),
            key=lambda r: r["workers"],
        )
        x = [r["workers"] for r in mine]
        y = [r["samples_per_s"] for r in mine]
        err = [[r["samples_per_s"] - r["rate_min"] for r in mine]]
        err.append([r["rate_max"] - r["samples_per_s"] for r in mine])
        if not mine:
            continue
        label = "Gluon DataLoader" if name == "gluon" else name
        ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3, label=label)
    ax.set_xticks(sorted({r["workers"] for r in rows}))
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s (median, min-max of the rounds)")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
