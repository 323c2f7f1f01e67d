"""The loader's checkpoint: the fields of ``ShardedDataLoader.state_dict()``, and the checks
``load_state_dict`` runs on a state before anything changes (docs/design.md, "Errors").

A state records the epoch, the batches of it already handed out (``consumed``), the batch
sampler's own state as the epoch started, and what must match for the state to fit this
loader (``seed``, ``dataset_len``, ``batch_size``, ``sampler_type``).
"""

from __future__ import annotations

import copy
from typing import Any, Dict

from .sampler import Sampler
from .sampler._state import StateTypeError, check_state_int, same_value

__all__ = ["STATE_KEYS", "STATE_VERSION", "check_state", "sampler_state"]

STATE_VERSION = 1
# The fields of ShardedDataLoader.state_dict(), all required by load_state_dict().
STATE_KEYS = (
    "version",
    "epoch",
    "consumed",
    "sampler",
    "seed",
    "dataset_len",
    "batch_size",
    "sampler_type",
)


def check_state(
    state: Any, mine: Dict[str, Any], batch_sampler: Any, length: int
) -> Dict[str, Any]:
    """Check every field of ``state`` against ``mine`` (the loader's own ``state_dict()``)
    and its batch sampler, changing nothing; return the point to resume from (a copy, so
    that the caller's dict may change afterwards)."""
    if not isinstance(state, dict) or not same_value(state.get("version"), STATE_VERSION):
        raise ValueError(
            f"state must be a dict from ShardedDataLoader.state_dict() "
            f"(version {STATE_VERSION}), got {state!r:.200}"
        )
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise ValueError(
            f"state lacks the field(s) {missing}; a state from state_dict() has the fields "
            f"{list(STATE_KEYS)}, got {sorted(map(str, state))}"
        )
    for key in ("dataset_len", "batch_size", "sampler_type", "seed"):
        if not same_value(state[key], mine[key]):
            raise ValueError(
                f"state is from an incompatible loader: {key} is "
                f"{state[key]!r:.100} in the state but {mine[key]!r} here"
            )
    for key in ("epoch", "consumed"):
        check_state_int(f"state[{key!r}]", state[key])
    epoch, consumed = int(state["epoch"]), int(state["consumed"])
    total = _batches_of(batch_sampler, length, epoch, state["sampler"])
    if consumed > total:
        raise ValueError(
            f"state['consumed'] must be an int in [0, {total}], the number of batches of "
            f"epoch {epoch}, got {consumed}"
        )
    return {"epoch": epoch, "consumed": consumed, "sampler": copy.deepcopy(state["sampler"])}


def _batches_of(bs: Any, length: int, epoch: int, sampler_state: Any) -> int:
    """How many batches epoch ``epoch`` has when the batch sampler starts it from
    ``sampler_state``, which is checked first; nothing is changed."""
    name = type(bs).__name__
    if not callable(getattr(bs, "state_dict", None)):
        if sampler_state is not None:
            raise ValueError(
                f"state['sampler'] must be None: this loader's batch sampler ({name}) has "
                f"no state_dict; got {sampler_state!r:.100}"
            )
        return len(bs)
    if not isinstance(sampler_state, dict):
        raise StateTypeError(
            f"state['sampler'] must be the state_dict() of this loader's batch sampler "
            f"({name}), a dict; got {sampler_state!r:.100}"
        )
    load = getattr(bs, "load_state_dict", None)
    if not callable(load):
        return len(bs)  # nothing to restore: resuming skips the consumed batches
    if not isinstance(bs, Sampler):
        # A batch sampler of the user's own: its load_state_dict is the only check there
        # is, and it loads the state as it checks it.
        try:
            load(sampler_state)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"state is from an incompatible loader: {exc}") from exc
        return len(bs)
    try:
        probe = bs.tried_on(sampler_state)  # a copy: nothing changes until it is accepted
    except ValueError as exc:
        kind = StateTypeError if isinstance(exc, StateTypeError) else ValueError
        raise kind(f"state['sampler'] does not fit this loader's batch sampler: {exc}") from exc
    # The loader saves its batch sampler's state as the epoch starts: at that epoch, at
    # offset 0 (the loader counts the batches taken since, in 'consumed').
    for key, expected in (("epoch", epoch), ("offset", 0)):
        if not same_value(sampler_state[key], expected):
            raise ValueError(
                f"state['sampler'][{key!r}] must be {expected}, as a loader saves its batch "
                f"sampler's state at the start of epoch state['epoch']={epoch}; got "
                f"{sampler_state[key]!r:.100}"
            )
    for index in probe.carried_indices():
        if not 0 <= index < length:
            raise ValueError(
                f"state['sampler'] carries index {index} into epoch {epoch}, outside the "
                f"dataset's range [0, {length})"
            )
    return len(probe)


def sampler_state(sampler) -> Any:
    """The batch sampler's ``state_dict()``, or ``None`` if it has none."""
    fn = getattr(sampler, "state_dict", None)
    return fn() if fn is not None else None
