"""The conditions ``shardloader bench`` measured in: the machine's cores, its load average,
and the CPU time that other processes took meanwhile (``/proc/stat``'s busy time, less this
command's own process tree). A number measured while other programs kept the cores busy is
a number about those programs too.
"""

from __future__ import annotations

import os
import time
from typing import Any, List, Optional

__all__ = ["Conditions", "usable_cores", "default_workers"]


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_workers(cores: Optional[int] = None) -> List[int]:
    """The worker counts tried by default: 0, 1, then the powers of two up to the core
    count, and the core count itself (``[0, 1, 2]`` on 2 cores, ``[0, 1, 2, 4, 6]`` on 6)."""
    cores = cores or usable_cores()
    counts = {0, 1, cores}
    n = 2
    while n <= cores:
        counts.add(n)
        n *= 2
    return sorted(counts)


def _busy_cpu_s() -> Optional[float]:
    """Seconds of CPU the whole machine spent busy since boot (``/proc/stat``), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    ticks = [int(v) for v in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU of this process and of every descendant it has reaped (each run's process, and
    through it the loaders' workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Conditions:
    """What else the machine did during a ``with`` block.

    Attributes
    ----------
    cores : int
        The cores this process may use.
    load_before, load_after : float
        The 1-minute load average at the block's start and end.
    wall_s : float
        The block's wall time.
    other_cpu_s : float or None
        CPU seconds used meanwhile by processes outside this command's tree (None where
        ``/proc/stat`` cannot be read).
    """

    def __init__(self) -> None:
        self.cores = usable_cores()
        self.load_before = self.load_after = 0.0
        self.wall_s = 0.0
        self.other_cpu_s: Optional[float] = None
        self._start: Any = None

    def __enter__(self) -> Conditions:
        self.load_before = os.getloadavg()[0]
        self._start = (time.perf_counter(), _busy_cpu_s(), _own_cpu_s())
        return self

    def __exit__(self, *exc: Any) -> None:
        started, busy, own = self._start
        self.wall_s = time.perf_counter() - started
        self.load_after = os.getloadavg()[0]
        busy_now = _busy_cpu_s()
        if busy is not None and busy_now is not None:
            self.other_cpu_s = max(0.0, (busy_now - busy) - (_own_cpu_s() - own))

    @property
    def other_cores(self) -> Optional[float]:
        """The cores other processes kept busy, on average over the block."""
        if self.other_cpu_s is None or self.wall_s <= 0:
            return None
        return self.other_cpu_s / self.wall_s

    def describe(self) -> str:
        """One line for the report."""
        line = (
            f"Conditions: {self.cores} core{'s' if self.cores != 1 else ''}, load average "
            f"{self.load_before:.2f} at the start and {self.load_after:.2f} at the end"
        )
        if self.other_cores is None:
            return line + "; the CPU time of other processes is unknown (no /proc/stat)."
        return (
            f"{line}; other processes used {self.other_cpu_s:.1f} s of CPU during the "
            f"{self.wall_s:.0f} s run ({self.other_cores:.2f} of {self.cores} cores)."
        )

    @property
    def busy(self) -> bool:
        """Whether other processes took a quarter of the cores or more."""
        other = self.other_cores
        return other is not None and other >= 0.25 * self.cores
