"""The loader's checkpoint: the fields of ``ShardedDataLoader.state_dict()``, and the checks
``load_state_dict`` runs on a state before anything changes (docs/design.md, "Errors").

A state records the epoch, the batches of it already handed out (``consumed``), the batch
sampler's own state as the epoch started, and what must match for the state to fit this
loader (``seed``, ``dataset_len``, ``batch_size``, ``sampler_type``).

A *job state* (``merge_states``) puts together the states of every machine of a job, one per
part. A loader with the same number of parts loads its own part's state from it. A loader with
another number of parts serves a share of the *rest* of the job's epoch: every machine's part of
the epoch (replayed from its state, ``sampler._reshard``) without the batches it had consumed,
in part order, cut into the new number of parts as ``PartitionSampler`` cuts an epoch. While it
serves that share its own state carries the job state (``resumed_from``), so that it can be
checkpointed, merged and resumed again.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Sequence

from .sampler import Sampler
from .sampler._reshard import check_reshardable, part_of_state, replay_sampler, state_at_epoch
from .sampler._split import part_items
from .sampler._state import StateTypeError, check_state_int, same_value

__all__ = [
    "JOB_VERSION",
    "STATE_KEYS",
    "STATE_VERSION",
    "check_state",
    "merge_states",
    "sampler_state",
]

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


JOB_VERSION = 1
# Fields a loader must share with every state of a job it resumes on another number of parts
# (the batch sampler's type may differ by a PartitionSampler level; its state is checked).
_SAME_DATA = ("dataset_len", "batch_size", "seed")


def check_state(
    state: Any, mine: Dict[str, Any], batch_sampler: Any, length: int
) -> Dict[str, Any]:
    """Check every field of ``state`` (a loader's state, or a job state from
    ``merge_states``) against ``mine`` (the loader's own ``state_dict()``) and its batch
    sampler, changing nothing; return the point to resume from (a copy, so that the caller's
    dict may change afterwards). It has the keys ``epoch``, ``consumed`` and ``sampler``, and
    also ``share`` (the items to serve) and ``job`` when the loader serves a share of a job's
    epoch."""
    if isinstance(state, dict) and "parts" in state:
        return _check_job_state(state, mine, batch_sampler, length)
    _check_format(state, "state")
    mine_parts = part_of_state(mine["sampler"])[:2]
    theirs = part_of_state(state["sampler"])
    if theirs[0] != mine_parts[0]:
        if theirs[0] != 1:
            raise ValueError(
                f"state is machine {theirs[1]}'s of a job on {theirs[0]} machines, but this "
                f"loader reads part {mine_parts[1]} of {mine_parts[0]}: to resume on another "
                "number of machines, merge the states of every machine with "
                "shardloader.distributed.merge_states() and load that job state"
            )
        return _check_job_state(merge_states([state]), mine, batch_sampler, length)
    for key in ("dataset_len", "batch_size", "sampler_type", "seed"):
        if not same_value(state[key], mine[key]):
            raise ValueError(
                f"state is from an incompatible loader: {key} is "
                f"{state[key]!r:.100} in the state but {mine[key]!r} here"
            )
    epoch, consumed = int(state["epoch"]), int(state["consumed"])
    total = _batches_of(batch_sampler, length, epoch, state["sampler"])
    resume = {"epoch": epoch, "consumed": consumed, "sampler": copy.deepcopy(state["sampler"])}
    job = state.get("resumed_from")
    if job is not None:
        # A share of a job's epoch, this loader's part of it, taken again.
        _check_job(job, "state['resumed_from']")
        check_reshardable(batch_sampler)
        if not same_value(job["epoch"], epoch):
            raise ValueError(
                f"state['resumed_from'] is a job state of epoch {job['epoch']!r}, but the state "
                f"is of epoch {epoch}"
            )
        share = part_items(_rest(job, batch_sampler, "state['resumed_from']"), *theirs)
        total = len(share)
        resume.update(share=share, job=copy.deepcopy(job))
    if consumed > total:
        raise ValueError(
            f"state['consumed'] must be an int in [0, {total}], the number of batches of "
            f"epoch {epoch}, got {consumed}"
        )
    return resume


def _check_format(state: Any, where: str) -> None:
    """Check that ``state`` is a loader's state, with every field, and its epoch and
    consumed count ints; ``where`` names it in errors."""
    if not isinstance(state, dict) or not same_value(state.get("version"), STATE_VERSION):
        raise ValueError(
            f"{where} must be a dict from ShardedDataLoader.state_dict() "
            f"(version {STATE_VERSION}), got {state!r:.200}"
        )
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise ValueError(
            f"{where} lacks the field(s) {missing}; a state from state_dict() has the fields "
            f"{list(STATE_KEYS)}, got {sorted(map(str, state))}"
        )
    for key in ("epoch", "consumed"):
        check_state_int(f"{where}[{key!r}]", state[key])


def merge_states(states: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The job state of the states of every machine of a job (see the module docstring and
    ``shardloader.distributed.merge_states``)."""
    if isinstance(states, dict) or not isinstance(states, (list, tuple)) or not states:
        raise TypeError(
            "states must be a non-empty list of the state_dict() of every machine of the job, "
            f"got {states!r:.100}"
        )
    parts: Dict[int, Dict[str, Any]] = {}
    counts = set()
    for k, state in enumerate(states):
        where = f"states[{k}]"
        _check_format(state, where)
        for key in _SAME_DATA + ("sampler_type",):
            if not same_value(state[key], states[0][key]):
                raise ValueError(
                    f"{where} is from another loader than states[0]: {key} is "
                    f"{state[key]!r:.100} there but {states[0][key]!r:.100} in states[0]"
                )
        num_parts, part_index, _ = part_of_state(state["sampler"], f"{where}['sampler']")
        counts.add(num_parts)
        if len(counts) > 1:
            raise ValueError(
                f"the states are from jobs on different numbers of machines {sorted(counts)}: "
                "merge the states of one job"
            )
        if part_index in parts:
            raise ValueError(
                f"{where} and another state are both for part {part_index}: give each "
                "machine's state once"
            )
        parts[part_index] = state
    num_parts = counts.pop()
    if len(parts) != num_parts:
        missing = sorted(set(range(num_parts)) - set(parts))
        raise ValueError(
            f"the job ran on {num_parts} machines, but the states of parts {missing} are "
            f"missing (got {len(parts)} states): every machine's state is needed"
        )
    ordered = [copy.deepcopy(parts[r]) for r in range(num_parts)]
    epoch = min(int(state["epoch"]) for state in ordered)
    for r, state in enumerate(ordered):
        if int(state["epoch"]) == epoch:
            continue
        if int(state["epoch"]) > epoch + 1 or int(state["consumed"]) or "resumed_from" in state:
            raise ValueError(
                f"machine {r} is at batch {state['consumed']} of epoch {state['epoch']} while "
                f"another is in epoch {epoch}: the states of a job must be taken in the same "
                "epoch (a machine may have ended it, and be at batch 0 of the next one)"
            )
    return {"version": JOB_VERSION, "epoch": epoch, "num_parts": num_parts, "parts": ordered}


def _check_job(job: Any, where: str) -> None:
    """Check that ``job`` is a job state from ``merge_states``."""
    if not isinstance(job, dict) or not same_value(job.get("version"), JOB_VERSION):
        raise ValueError(
            f"{where} must be a job state from shardloader.distributed.merge_states() "
            f"(version {JOB_VERSION}), got {job!r:.200}"
        )
    parts: Any = job.get("parts")
    merged = merge_states(parts)  # checks the parts as when they were merged
    for key in ("epoch", "num_parts"):
        if not same_value(job.get(key), merged[key]):
            raise ValueError(
                f"{where}[{key!r}] is {job.get(key)!r:.100}, but its parts say {merged[key]}"
            )


def _check_job_state(
    job: Dict[str, Any], mine: Dict[str, Any], batch_sampler: Any, length: int
) -> Dict[str, Any]:
    """``check_state`` for a job state."""
    _check_job(job, "state")
    num_parts, part_index, even_size = part_of_state(mine["sampler"])
    if num_parts == job["num_parts"]:
        try:
            return check_state(job["parts"][part_index], mine, batch_sampler, length)
        except ValueError as exc:
            raise type(exc)(f"state['parts'][{part_index}]: {exc}") from exc
    for r, state in enumerate(job["parts"]):
        for key in _SAME_DATA:
            if not same_value(state[key], mine[key]):
                raise ValueError(
                    f"state is from an incompatible loader: {key} is {state[key]!r:.100} in "
                    f"state['parts'][{r}] but {mine[key]!r} here"
                )
    check_reshardable(batch_sampler)
    epoch = job["epoch"]
    start = state_at_epoch(batch_sampler, epoch)
    fresh = all(
        int(s["consumed"]) == 0 and "resumed_from" not in s and int(s["epoch"]) == epoch
        for s in job["parts"]
    )
    if fresh:  # taken at the start of the epoch: it runs as this count's epoch
        return {"epoch": epoch, "consumed": 0, "sampler": start}
    share = part_items(_rest(job, batch_sampler, "state"), num_parts, part_index, even_size)
    resume = {"epoch": epoch, "consumed": 0, "sampler": start, "share": share}
    return dict(resume, job=copy.deepcopy(job))


def _rest(job: Dict[str, Any], batch_sampler: Any, where: str) -> List[Any]:
    """The items of the job's epoch that no machine had consumed, in part order."""
    rest: List[Any] = []
    for r, state in enumerate(job["parts"]):
        if int(state["epoch"]) != job["epoch"]:
            continue  # that machine had ended the epoch
        served = _served(state, batch_sampler, f"{where}['parts'][{r}]")
        consumed = int(state["consumed"])
        if consumed > len(served):
            raise ValueError(
                f"{where}['parts'][{r}]['consumed'] must be an int in [0, {len(served)}], the "
                f"batches of that machine's epoch {job['epoch']}, got {consumed}"
            )
        rest.extend(served[consumed:])
    return rest


def _served(state: Dict[str, Any], batch_sampler: Any, where: str) -> List[Any]:
    """Every item a machine's epoch had, from its state."""
    job: Optional[Dict[str, Any]] = state.get("resumed_from")
    if job is not None:
        _check_job(job, f"{where}['resumed_from']")
        if not same_value(job["epoch"], state["epoch"]):
            raise ValueError(
                f"{where}['resumed_from'] is a job state of epoch {job['epoch']!r}, but the "
                f"state is of epoch {state['epoch']!r}"
            )
        part = part_of_state(state["sampler"], f"{where}['sampler']")
        return part_items(_rest(job, batch_sampler, f"{where}['resumed_from']"), *part)
    try:
        replay = replay_sampler(batch_sampler, state["sampler"])
    except ValueError as exc:
        kind = StateTypeError if isinstance(exc, StateTypeError) else ValueError
        raise kind(f"{where}['sampler'] does not fit this loader's batch sampler: {exc}") from exc
    if not same_value(replay.epoch, state["epoch"]):
        raise ValueError(
            f"{where}['sampler']['epoch'] must be {state['epoch']}, the epoch of the state; "
            f"got {replay.epoch}"
        )
    return [_plain(item) for item in replay]


def _plain(item: Any) -> Any:
    """A batch or step as plain lists of ints (a ``FilledStep`` loses its count)."""
    if isinstance(item, list):
        return [_plain(i) for i in item]
    return int(item)


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
