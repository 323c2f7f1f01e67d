"""The argument checks every public entry point uses.

Each check returns the value in its canonical Python type, or raises an error that names the
argument, what is accepted and what was received (docs/design.md, "Errors"): a ``TypeError``
for a value of the wrong type, a ``ValueError`` for one of the right type out of range. A
``bool`` is never taken for an ``int``. It also has the pieces of an options object (``option``,
``check_options``, ``arguments_for``), each option spelled once with its default and check.
This module imports nothing of shardloader's, so every layer may use it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import numbers
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "LAST_BATCH_CHOICES",
    "arguments_for",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_int",
    "check_keywords",
    "check_number",
    "check_options",
    "option",
    "optional",
]

# Gluon's ``last_batch`` policies, for the loader's options and the batch samplers alike.
LAST_BATCH_CHOICES = ("keep", "discard", "rollover")


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
    number = float(value)
    if not number >= minimum:
        raise ValueError(f"{name} must be {accepted}, got {value!r:.100}")
    return number


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` if it is one of the strings ``choices``, else a ``ValueError`` listing them."""
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}, got {value!r:.100}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a bool: a bool (numpy's included), or the int 0 or 1 (Gluon takes
    ``shuffle=1``); anything else, a string such as ``'False'`` above all, is a ``TypeError``."""
    if _is_bool(value):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(
        f"{name} must be a bool (True or False; 0 and 1 also do), got {value!r:.100} "
        f"({type(value).__name__})"
    )


def check_callable(name: str, value: Any) -> Callable:
    """``value`` if it is callable, else a ``TypeError``."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")
    return value


# ------------------------------------------------------------------ options objects
# An options object is a frozen dataclass whose fields are made with ``option``: each field
# is one option, spelled once, with its default and its check. Its ``__post_init__`` calls
# ``check_options`` (then checks the options against each other), so every construction,
# ``dataclasses.replace`` included, is checked.

Check = Callable[[str, Any], Any]


def option(default: Any, check: Optional[Check] = None, **field_args: Any) -> Any:
    """A field of an options dataclass: its default, and ``check(name, value)``, which
    returns the value in its canonical type or raises (None: taken as given)."""
    return dataclasses.field(default=default, metadata={"check": check}, **field_args)


def optional(check: Check) -> Check:
    """``check``, with None also accepted (and kept)."""

    def check_or_none(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)

    return check_or_none


def check_options(options: Any) -> None:
    """Run the check of every field of the (frozen) dataclass ``options``, storing each
    canonical value in place."""
    for name, check in _checks(options.__class__):
        object.__setattr__(options, name, check(name, getattr(options, name)))


@functools.lru_cache(maxsize=None)
def _checks(cls: type) -> Tuple[Tuple[str, Check], ...]:
    fields = dataclasses.fields(cls)
    return tuple((f.name, f.metadata["check"]) for f in fields if f.metadata.get("check"))


def arguments_for(cls: Callable, arguments: Mapping[str, Any]) -> Dict[str, Any]:
    """Those of a call's arguments (its ``locals()``) that ``cls`` (an options dataclass)
    takes, by name; the others are left out."""
    return {name: arguments[name] for name in _parameter_names(cls) if name in arguments}


@functools.lru_cache(maxsize=None)
def _parameter_names(cls: Callable) -> Tuple[str, ...]:
    return tuple(inspect.signature(cls).parameters)


def check_keywords(func: Callable) -> Callable:
    """Wrap ``func`` so that a misspelled keyword argument gets a ``TypeError`` naming the
    closest parameter ("did you mean 'num_workers'?") and listing the accepted ones."""
    params = inspect.signature(func).parameters
    names = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    names = [n for n in names if n != "self"]
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return func  # it takes any keyword

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for key in kwargs:
            if key not in params:
                close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else "."
                raise TypeError(
                    f"{func.__qualname__.split('.')[0]}() got an unexpected keyword argument "
                    f"{key!r}{hint} The accepted keywords are: {', '.join(names)}"
                )
        return func(*args, **kwargs)

    return checked
