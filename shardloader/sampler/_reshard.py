"""Resuming on another number of machines: what each machine of a job had left of an epoch.

A machine's part of an epoch is a pure function of its batch sampler's arguments, its state
at the start of the epoch (``state_dict()``) and its part ``(num_parts, part_index)``, which a
``PartitionSampler`` or a ``SplitSampler`` in the chain of samplers holds. A machine with
another part builds the same chain but for that part, so it can replay any machine's pass:
``replay_sampler`` copies the chain and gives it the part, and the ``PartitionSampler`` level,
that a saved state names, then loads the state into the copy. ``check_reshardable`` refuses a
chain whose passes cannot be replayed that way. The loader (``_checkpoint``) puts the rests of
the passes together and shares them out over the new machines with ``part_items``.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from ._base import Sampler
from ._split import PartitionSampler, SplitSampler
from ._state import check_state_int, same_value

__all__ = ["check_reshardable", "part_of_state", "replay_sampler", "state_at_epoch"]

PART_TYPES = (PartitionSampler.__name__, SplitSampler.__name__)


def part_of_state(state: Any, where: str = "state['sampler']") -> Tuple[int, int, bool]:
    """``(num_parts, part_index, even_size)`` of the sampler that partitions, in the state of
    a chain of samplers (``(1, 0, False)`` when none does); ``where`` names ``state`` in
    errors."""
    found = []
    node, path = state, where
    while isinstance(node, dict):
        if node.get("type") in PART_TYPES:
            found.append((node, path))
        node, path = node.get("sampler"), f"{path}['sampler']"
    if not found:
        return 1, 0, False
    if len(found) > 1:
        raise ValueError(
            f"{where} partitions twice ({found[0][1]} and {found[1][1]}); a job can be "
            "resumed on another number of machines only with one partitioning sampler"
        )
    node, path = found[0]
    num_parts = check_state_int(f"{path}['num_parts']", node.get("num_parts"), minimum=1)
    part_index = check_state_int(f"{path}['part_index']", node.get("part_index"))
    even_size = node.get("even_size")
    if part_index >= num_parts or not isinstance(even_size, bool):
        raise ValueError(
            f"{path} must have a part_index in [0, num_parts) and a bool even_size, got "
            f"num_parts={num_parts!r}, part_index={part_index!r}, even_size={even_size!r}"
        )
    return num_parts, part_index, even_size


def check_reshardable(sampler: Any) -> None:
    """Raise a ``ValueError`` saying why the passes of ``sampler`` (a loader's batch sampler)
    cannot be replayed for another machine, if they cannot."""
    node = sampler
    while node is not None:
        if not isinstance(node, Sampler):
            raise ValueError(
                f"a job can be resumed on another number of machines only if every sampler "
                f"of the loader is one of shardloader.sampler's: each old machine's part is "
                f"recomputed from its state, and the {type(node).__name__} in this loader's "
                f"batch sampler has none; resume on the same number of machines instead"
            )
        for policy in ("last_batch", "last_group"):
            if getattr(node, policy, None) == "rollover":
                raise ValueError(
                    f"a job can be resumed on another number of machines only without "
                    f"rollover: the {type(node).__name__}'s {policy}='rollover' carries each "
                    f"machine's short last group into that machine's next epoch, which the "
                    f"machines of another count do not have; use 'keep' or 'discard', or "
                    f"resume on the same number of machines"
                )
        node = node._wrapped()


def replay_sampler(sampler: Sampler, state: Dict[str, Any]) -> Sampler:
    """A copy of the chain ``sampler`` (checked by ``check_reshardable``) shaped as ``state``
    is and with ``state`` loaded: its next pass is the one the machine that saved ``state``
    ran. The part, and whether there is a ``PartitionSampler`` level at all (a job on one
    machine has none), come from ``state``; ``load_state_dict`` checks the rest."""
    copy = _shaped(sampler, state)
    copy.load_state_dict(state)
    return copy


def _shaped(sampler: Any, state: Any) -> Sampler:
    kind = state.get("type") if isinstance(state, dict) else None
    inner = state.get("sampler") if isinstance(state, dict) else None
    if isinstance(sampler, PartitionSampler) and kind != PartitionSampler.__name__:
        return _shaped(sampler._wrapped(), state)  # the saving machine had no parts
    if kind == PartitionSampler.__name__ and not isinstance(sampler, PartitionSampler):
        num_parts, part_index, even_size = part_of_state(state, "state")
        return PartitionSampler(_shaped(sampler, inner), num_parts, part_index, even_size)
    wrapped = sampler._wrapped()
    copy = sampler._replica(None if wrapped is None else _shaped(wrapped, inner))
    if isinstance(copy, (PartitionSampler, SplitSampler)) and same_value(kind, type(copy).__name__):
        copy = copy._with_part(*part_of_state(state, "state"))
    return copy


def state_at_epoch(sampler: Sampler, epoch: int) -> Dict[str, Any]:
    """The state ``sampler`` would save at the start of ``epoch`` (offset 0), without
    changing it."""
    copy = _shaped(sampler, sampler.state_dict())
    copy.set_epoch(epoch)
    return copy.state_dict()
