"""Helpers for sampler states: making them JSON-ready, and reading them back with checks.

A state (``Sampler.state_dict``) holds only ints, strings, ``None``, lists and dicts, so that
it can be saved as JSON. ``json_ready`` and ``json_ready_dict`` make a value so;
``state_value``, ``state_int`` and ``same_value`` read a state given to ``load_state_dict``
and refuse one that is incomplete or of the wrong types.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from .._validate import check_int

__all__ = [
    "StateTypeError",
    "check_state_int",
    "is_index",
    "json_ready",
    "json_ready_dict",
    "same_value",
    "state_int",
    "state_value",
]


def json_ready(value: Any) -> Any:
    """``value`` with numpy scalars and tuples turned into JSON-ready ints and lists.

    Lists and tuples are converted item by item; any other value, a dict included, is
    returned as it is (``json_ready_dict`` converts the values of a dict).
    """
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def json_ready_dict(state: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of ``state`` with every value made JSON-ready by ``json_ready``, nested dicts
    included."""
    return {
        key: json_ready_dict(v) if isinstance(v, dict) else json_ready(v)
        for key, v in state.items()
    }


def state_value(state: Dict[str, Any], key: str, owner: str) -> Any:
    """``state[key]``, or a ``ValueError`` saying that the state lacks it."""
    if key not in state:
        keys = sorted(map(repr, state))
        raise ValueError(f"{owner} state_dict is missing {key!r}; got keys [{', '.join(keys)}]")
    return state[key]


class StateTypeError(ValueError, TypeError):
    """A value of the wrong type in a state given to ``load_state_dict``.

    A ``ValueError``, like every other problem with a state, and a ``TypeError`` too, for
    code that caught the ``TypeError`` raised for a state that is not a dict.
    """


def check_state_int(name: str, value: Any, minimum: Optional[int] = 0) -> int:
    """``check_int`` for a field of a saved state: a value of the wrong type raises a
    ``StateTypeError``, so that code catching either ``ValueError`` or ``TypeError`` sees it."""
    try:
        return check_int(name, value, minimum)
    except TypeError as exc:
        raise StateTypeError(str(exc)) from None


def state_int(state: Dict[str, Any], key: str, owner: str, minimum: Optional[int] = 0) -> int:
    """``state[key]`` as an ``int`` no smaller than ``minimum``, naming the field on error."""
    value = state_value(state, key, owner)
    return check_state_int(f"{owner} state_dict[{key!r}]", value, minimum)


def same_value(a: Any, b: Any) -> bool:
    """Whether two JSON-ready values are equal and of the same type, so that ``1.0`` or
    ``True`` in a state is not taken for ``1`` (tuples and lists are the same type)."""
    a, b = json_ready(a), json_ready(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def is_index(value: Any) -> bool:
    """Whether a value in a state is an index: an int, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
