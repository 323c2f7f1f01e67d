"""The argument checks every public entry point uses.

Each check returns the value in its canonical Python type, or raises an error that names the
argument, what is accepted and what was received (docs/design.md, "Errors"): a ``TypeError``
for a value of the wrong type, a ``ValueError`` for one of the right type out of range. A
``bool`` is never taken for an ``int``. This module imports nothing of shardloader's, so every
layer may use it.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["check_bool", "check_choice", "check_int", "check_number"]


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, minimum: Optional[int] = 0) -> int:
    """``value`` as an ``int`` no smaller than ``minimum`` (``None``: any int)."""
    if minimum is None:
        accepted = "an int"
    elif minimum == 0:
        accepted = "a non-negative int"
    elif minimum == 1:
        accepted = "a positive int"
    else:
        accepted = f"an int >= {minimum}"
    if _is_bool(value) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be {accepted}, got {value!r:.100} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be {accepted}, got {value!r:.100}")
    return int(value)


def check_number(name: str, value: Any, minimum: float) -> float:
    """``value`` as a ``float`` no smaller than ``minimum``."""
    accepted = f"a number >= {minimum:g}"
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {accepted}, got {value!r:.100} ({type(value).__name__})")
    if not value >= minimum:
        raise ValueError(f"{name} must be {accepted}, got {value!r:.100}")
    return float(value)


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` if it is one of the strings ``choices``, else a ``ValueError`` listing them."""
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}, got {value!r:.100}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool (numpy's included), else a ``TypeError``."""
    if not _is_bool(value):
        raise TypeError(f"{name} must be a bool, got {value!r:.100} ({type(value).__name__})")
    return bool(value)
