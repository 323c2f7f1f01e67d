"""The sampler protocol: the ``Sampler`` base class, ``FilledStep``, and the mixins of random
samplers and of samplers that wrap another one.

Every shardloader sampler keeps two numbers besides its configuration:

- ``epoch``, the epoch its next pass will use. ``set_epoch(e)`` sets it; each call to
  ``__iter__`` takes it and advances it by one, so a loop that never calls ``set_epoch`` still
  gets a fresh order on every pass, as with Gluon's ``RandomSampler``.
- ``offset``, the number of items to skip at the start of the next pass. It is 0 except right
  after ``Sampler.load_state_dict`` restored a state taken in the middle of a pass.

A pass is a pure function of the configuration, the ``seed``, the epoch and whatever a
subclass carries between epochs (the rollover leftovers). ``Sampler.state_dict`` records
exactly those, so a freshly built sampler that loads the state replays the rest of the pass
item for item.

A step sampler that has to repeat samples to give its last step ``num_shards`` shards yields
that step as a ``FilledStep``, a ``list`` that also says how many of its samples are repeats.
Every step sampler that yields one (the one that made it, and the wrappers it passes through)
adds that number to its ``repeated_samples`` counter, which is how a loader's ``stats()``
learns about it.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import numpy as np
from mxnet.gluon.data.sampler import Sampler as _GluonSampler

from .._engine.seeding import epoch_rng, fresh_seed
from .._validate import check_int
from ._state import StateTypeError, same_value, state_int, state_value

__all__ = ["Sampler", "FilledStep"]


class FilledStep(list):
    """A step (a list of per-shard index lists) that repeats ``repeated`` samples of its pass.

    Step samplers yield their last step as a ``FilledStep`` when the pass had fewer samples
    left than shards, so that the step could only be given ``num_shards`` non-empty shards by
    repeating samples. It compares, pickles and serialises like the plain list it is.

    Examples
    --------
    >>> step = FilledStep([[7], [6]], repeated=1)
    >>> step == [[7], [6]], step.repeated
    (True, 1)
    """

    def __init__(self, shards: Iterable[Any] = (), repeated: int = 0) -> None:
        super().__init__(shards)
        self.repeated = repeated

    def __reduce__(self) -> Any:
        return (type(self), (list(self), self.repeated))


class _Pass:
    """Book-keeping for one call of ``__iter__``: where it started and how far it got."""

    __slots__ = ("epoch", "position", "replay", "done")

    def __init__(self, epoch: int, position: int, replay: Dict[str, Any]) -> None:
        self.epoch = epoch
        self.position = position
        self.replay = replay
        self.done = False


class Sampler(_GluonSampler):
    """Base class of shardloader's samplers; a subclass of Gluon's ``Sampler``.

    Subclasses implement ``__len__`` and ``_iter_epoch(epoch, start)``, which yields the items
    of ``epoch`` from position ``start`` on. This class supplies ``__iter__``, ``set_epoch``,
    ``state_dict`` and ``load_state_dict`` on top of them (see the module docstring).

    Attributes
    ----------
    yields_steps : bool
        True when every item is a step (a list of ``num_shards`` index lists) rather than an
        index or a batch of indices.

    Examples
    --------
    >>> class Evens(Sampler):
    ...     def __init__(self, n):
    ...         self._n = n
    ...     def __len__(self):
    ...         return self._n
    ...     def _iter_epoch(self, epoch, start):
    ...         return iter(range(2 * start, 2 * self._n, 2))
    >>> sampler = Evens(4)
    >>> list(sampler), sampler.epoch
    ([0, 2, 4, 6], 1)
    """

    yields_steps = False

    # Class-level defaults, so that a subclass need not call ``super().__init__()``.
    _epoch = 0
    _resume = 0
    _pass: Optional[_Pass] = None
    _repeated = 0
    _repeat_listeners: Optional[List[Callable[[int], bool]]] = None

    def __iter__(self) -> Iterator:
        epoch, start = self._epoch, self._resume
        record = _Pass(epoch, start, self._replay_state())
        self._epoch, self._resume, self._pass = epoch + 1, 0, record
        items = self._iter_epoch(epoch, start)
        if self.yields_steps:
            return self._tracked_steps(record, items)
        return self._tracked(record, items)

    @staticmethod
    def _tracked(record: _Pass, items: Iterator) -> Iterator:
        for item in items:
            record.position += 1
            yield item
        record.done = True

    def _tracked_steps(self, record: _Pass, items: Iterator) -> Iterator:
        for item in items:
            record.position += 1
            if type(item) is FilledStep:
                self._note_repeats(item.repeated)
            yield item
        record.done = True

    # -- repeated samples ----------------------------------------------------------------------

    @property
    def repeated_samples(self) -> int:
        """How many samples this sampler has yielded a second time within a pass to fill a last
        step (see ``FilledStep``), since it was built.

        A step is counted when this sampler yields it, which for a loader means when the step
        is sent to be loaded, at most ``prefetch`` steps before the training loop receives it.
        """
        return self._repeated

    def _note_repeats(self, count: int) -> None:
        if not count:
            return
        self._repeated += count
        listeners = self._repeat_listeners
        if listeners:
            # A listener that answers False is gone (its loader was collected): drop it.
            listeners[:] = [listener for listener in listeners if listener(count) is not False]

    def watch_repeats(self, counter: Any) -> None:
        """Add every later repeat to ``counter.repeated_samples`` (a loader's statistics);
        ``counter`` is held weakly, so a loader that watches a sampler it was given can be
        collected."""
        ref = weakref.ref(counter)

        def listener(count: int) -> bool:
            target = ref()
            if target is None:
                return False
            target.repeated_samples += count
            return True

        if self._repeat_listeners is None:
            self._repeat_listeners = []
        self._repeat_listeners.append(listener)

    def __getstate__(self) -> Dict[str, Any]:
        # The listeners belong to the loaders of this process; a copy starts without them.
        state = dict(self.__dict__)
        state.pop("_repeat_listeners", None)
        return state

    def _iter_epoch(self, epoch: int, start: int) -> Iterator:
        """The items of ``epoch``, skipping the first ``start`` of them."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        """The epoch the next pass will use."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass use ``epoch``.

        A position restored by ``load_state_dict`` survives only if ``epoch`` is the
        epoch that state was taken in.
        """
        epoch = check_int("epoch", epoch)
        if epoch != self._epoch:
            self._resume = 0
        self._epoch = epoch
        self._pass = None

    # -- state ---------------------------------------------------------------------------------

    def _config(self) -> Dict[str, Any]:
        """Constructor arguments that a loaded state must match (JSON-ready values)."""
        return {}

    def _replay_state(self) -> Dict[str, Any]:
        """What besides the epoch the next pass depends on: seed, carry, wrapped samplers."""
        return {}

    def _load_replay_state(self, state: Dict[str, Any]) -> None:
        """Restore what ``_replay_state`` recorded; ``state`` has been checked."""

    def state_dict(self) -> Dict[str, Any]:
        """A small, JSON-serialisable snapshot from which the iteration can be resumed.

        Taken during a pass, it records the epoch and the number of items yielded so far, so
        the next pass of a sampler that loads it continues where this one is. Taken between
        passes, it records the next epoch and an offset of 0.
        """
        record = self._pass
        if record is not None and not record.done:
            epoch, offset, replay = record.epoch, record.position, record.replay
        else:
            epoch, offset, replay = self._epoch, self._resume, self._replay_state()
        state: Dict[str, Any] = {"type": type(self).__name__}
        state.update(self._config())
        state.update(epoch=epoch, offset=offset)
        state.update(replay)
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a snapshot taken by ``state_dict`` on an identically built sampler.

        The whole state is checked before anything changes: a state that is refused leaves
        the sampler (and the samplers it wraps) exactly as it was.

        Raises
        ------
        ValueError
            If the state is not a dict from ``state_dict`` (a ``StateTypeError``, also a
            ``TypeError``, for a value of the wrong type), lacks a field, has a field out of
            range, or belongs to another sampler type or to different arguments.
        """
        probe = self._probe()
        probe._load_state(state)  # checks as it goes, changing only the copies
        self._adopt(probe)

    def tried_on(self, state: Dict[str, Any]) -> Sampler:
        """A copy of this sampler with ``state`` loaded, this one unchanged: how a
        checkpoint is checked before anything changes. Raises as ``load_state_dict``."""
        probe = self._probe()
        probe._load_state(state)
        return probe

    def carried_indices(self) -> Iterator[int]:
        """The sample indices this sampler, and the samplers it wraps, carry into their
        next pass (``last_batch='rollover'``)."""
        sampler: Any = self
        while isinstance(sampler, Sampler):
            for item in sampler.__dict__.get("_carry", ()):
                yield from item if isinstance(item, list) else (item,)
            sampler = sampler.__dict__.get("_sampler")

    def _replica(self, inner: Any = None) -> Sampler:
        """A copy to replay a pass on (``_reshard``): the same arguments and state, its own
        epoch and position, no repeat listeners, and ``inner`` as its wrapped sampler, if it
        wraps one."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        for key in ("_pass", "_repeat_listeners", "_probe_base", "_probe_deferred"):
            clone.__dict__.pop(key, None)
        clone._resume = 0
        if "_sampler" in clone.__dict__:
            clone._sampler = inner
        return clone

    def _wrapped(self) -> Any:
        """The sampler this one wraps, or None."""
        return self.__dict__.get("_sampler")

    def _probe(self) -> Sampler:
        """A copy to try a state on: it shares every attribute with this sampler, except the
        wrapped sampler (``_sampler``), which is probed in turn if it is one of ours."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        inner = clone.__dict__.get("_sampler")
        if isinstance(inner, Sampler):
            clone._sampler = inner._probe()
        clone.__dict__["_probe_base"] = dict(clone.__dict__)
        clone.__dict__["_probe_deferred"] = []
        return clone

    def _adopt(self, probe: Sampler) -> None:
        """Take over what loading a state changed in ``probe`` (made by ``_probe``)."""
        base = probe.__dict__.pop("_probe_base")
        deferred = probe.__dict__.pop("_probe_deferred")
        pending = self.__dict__.get("_probe_deferred")
        if pending is not None:
            pending.extend(deferred)  # self is a probe too: the outermost adopt runs them
        else:
            for load in deferred:  # states of wrapped samplers that are not ours
                load()
        for key, value in probe.__dict__.items():
            if key != "_sampler" and (key not in base or base[key] is not value):
                setattr(self, key, value)
        inner, tried = self.__dict__.get("_sampler"), probe.__dict__.get("_sampler")
        if (
            isinstance(tried, Sampler)
            and isinstance(inner, Sampler)  # the probe's is a copy of it
            and tried is not inner
            and "_probe_base" in tried.__dict__
        ):
            inner._adopt(tried)

    def _load_state(self, state: Dict[str, Any]) -> None:
        """Check ``state`` and load it into this sampler (a probe: see ``load_state_dict``)."""
        name = type(self).__name__
        if not isinstance(state, dict):
            raise StateTypeError(
                f"{name} state must be a dict from {name}.state_dict(), got "
                f"{type(state).__name__}: {state!r:.100}"
            )
        kind = state_value(state, "type", name)
        if not same_value(kind, name):
            raise ValueError(f"state_dict is for a {kind}, cannot load it into a {name}")
        for key, expected in self._config().items():
            found = state_value(state, key, name)
            if not same_value(found, expected):
                raise ValueError(
                    f"{name} state_dict mismatch: {key} is {found!r} in the state "
                    f"but {expected!r} in this sampler"
                )
        epoch = state_int(state, "epoch", name)
        offset = state_int(state, "offset", name)
        self._load_replay_state(state)
        self._epoch, self._resume, self._pass = epoch, 0, None
        total = len(self)
        if offset > total:
            raise ValueError(
                f"{name} state_dict['offset'] must be an int in [0, {total}], the items of the "
                f"epoch; offset {offset} is past the end of the epoch ({total} items)"
            )
        self._resume = offset


def check_seed(seed: Any, random: bool = True) -> Optional[int]:
    """The base seed: ``seed`` as an ``int``; for ``None``, ``fresh_seed()`` if the sampler
    is ``random``, else ``None`` (a sampler that never shuffles leaves the global RNG alone)."""
    if seed is None:
        return fresh_seed() if random else None
    return check_int("seed", seed, minimum=None)


class _SeededMixin:
    """The ``seed`` attribute and its place in the state of a random sampler."""

    _seed: Optional[int]

    @property
    def seed(self) -> Optional[int]:
        """The base seed: the order of a pass is a function of ``(seed, epoch)``."""
        return self._seed

    def _epoch_rng(self, epoch: int) -> np.random.Generator:
        """The generator of ``epoch``'s order; only a sampler that shuffles asks, and
        ``check_seed`` gives every one a seed."""
        seed = self._seed
        if seed is None:  # only a subclass that turns shuffling on after check_seed
            raise RuntimeError(
                f"{type(self).__name__} shuffles but has no seed: check_seed(seed, random=True) "
                "gives one"
            )
        return epoch_rng(seed, epoch)

    def _replay_state(self) -> Dict[str, Any]:
        return {"seed": self._seed}

    def _load_replay_state(self, state: Dict[str, Any]) -> None:
        name = type(self).__name__
        if state_value(state, "seed", name) is None and self._seed is not None:
            raise StateTypeError(
                f"{name} state_dict['seed'] must be an int (this sampler has a seed), got None"
            )
        if state["seed"] is not None:
            self._seed = state_int(state, "seed", name, minimum=None)
