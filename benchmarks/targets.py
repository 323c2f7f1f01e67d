"""The performance targets that issues 4 and 13 set, checked on a run's summary
(``benchmarks.summary``)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from .summary import W5_INLINE, Cell, Target, ratio_of, scaling, spread_of

__all__ = ["check_targets"]

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
    checker = _Checker(summary, compared or {})
    for pin in (False, True):
        checker.headline(pin)
    checker.thread_and_w5_w6()
    checker.stacking((extras or {}).get("stacking", {}).get("methods", {}))
    return checker.targets


class _Checker:
    """Collects the targets whose measurements ran, in the order of the report."""

    def __init__(self, summary: Dict[str, Any], compared: Dict[str, Dict[str, Any]]) -> None:
        self.summary = summary
        self.compared = compared
        self.targets: List[Target] = []

    def ran(self, key: str, loaders: Sequence[str] = ("gluon", "ours")) -> bool:
        measured = self.summary.get(key, {}).get("loaders", {})
        return all(measured.get(name, {}).get("reps") for name in loaders)

    def ratio(self, name: str, key: str, need: float, source: str) -> None:
        value, spread = ratio_of(self.summary, key)
        self.targets.append(Target(name, value, need, "x", spread, source=source))

    def paired(self, name: str, need: float, source: str = "issue 13") -> None:
        ratio = self.compared.get(name)
        if ratio is not None:
            spread = (ratio["min"], ratio["max"])
            self.targets.append(Target(name, ratio["median"], need, "x", spread, source=source))

    def headline(self, pin: bool) -> None:
        """W1, W2 (with its memory and its inline comparison), W4 and W3 at two process
        workers; issue 4's needs with ``pin_memory``, issue 13's without."""
        tag = " pin_memory" if pin else ""
        source = "issue 4" if pin else "issue 13"
        for workload, need, pinned_need in _RATIO_NEEDS:
            key = Cell(workload, 2, pin_memory=pin).key
            if not self.ran(key):
                continue
            self.ratio(f"{workload}{tag} ours/gluon", key, pinned_need if pin else need, source)
            if workload == "W2" and not pin:
                diff = self.summary[key].get("rss_diff") or {}
                self.targets.append(
                    Target(
                        "W2 peak RSS, ours - gluon",
                        diff.get("median"),
                        0.0,
                        "MB",
                        spread_of(diff),
                        higher_is_better=False,
                        source="issue 4",
                    )
                )
                self.paired("W2 ours process / ours inline", 1.0)
        if self.ran(Cell("W3", 0).key) and self.ran(Cell("W3", 2, pin_memory=pin).key):
            frac, spread = scaling(self.summary, "ours", pin), None
            paired = self.compared.get(f"W3 ours process{' pin' if pin else ''} / ours inline")
            if paired and paired["median"] is not None:  # per round: the same rounds' runs
                frac, spread = paired["median"] / 2, (paired["min"] / 2, paired["max"] / 2)
            name = f"W3{tag} ours, fraction of ideal 2x"
            need = 0.9 if pin else 0.95
            self.targets.append(Target(name, frac, need, "of ideal", spread, source=source))

    def thread_and_w5_w6(self) -> None:
        for workload in ("W1", "W2", "W3"):
            key = Cell(workload, 2, thread_pool=True).key
            if self.ran(key):
                self.ratio(f"{workload} thread ours/gluon", key, 1.0, "issue 4")
        self.paired("W5 ours process / ImageRecordIter", 1.0)
        if self.ran(W5_INLINE):
            self.ratio("W5 inline ours/gluon", W5_INLINE, 1.2, "issue 13")
        self.paired("W5 ours thread / ours process", 0.9)
        if self.ran(Cell("W6", 2).key):
            self.ratio("W6 ours/gluon", Cell("W6", 2).key, 5.0, "issue 13")

    def stacking(self, methods: Dict[str, Any]) -> None:
        ours = methods.get("ours", {})
        if ours.get("x_memcpy") is not None:
            self.targets.append(
                Target(
                    "stacking ours / memcpy (time)",
                    ours["x_memcpy"],
                    2.0,
                    "x memcpy",
                    ours.get("x_memcpy_spread"),
                    higher_is_better=False,
                    source="issue 13",
                )
            )
