"""The sampler protocol, argument checks, and Gluon's three index samplers.

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

import itertools
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import numpy as np
from mxnet.gluon.data.sampler import Sampler as _GluonSampler

from .._engine.seeding import epoch_rng, fresh_seed
from .._validate import check_bool, check_int

__all__ = [
    "Sampler",
    "SequentialSampler",
    "RandomSampler",
    "FilterSampler",
    "IntervalSampler",
    "FilledStep",
]


# ---------------------------------------------------------------------------------------------
# Argument checks shared by every sampler module (the generic ones are in shardloader._validate).


def check_seed(seed: Any, random: bool = True) -> Optional[int]:
    """The base seed: ``seed`` as an ``int``; for ``None``, ``fresh_seed()`` if the sampler
    is ``random``, else ``None`` (a sampler that never shuffles leaves the global RNG alone)."""
    if seed is None:
        return fresh_seed() if random else None
    return check_int("seed", seed, minimum=None)


def plain(value: Any) -> Any:
    """``value`` with numpy scalars and tuples turned into JSON-ready ints and lists."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def plain_dict(state: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of ``state`` with every value made JSON-ready by ``plain``."""
    return {key: plain_dict(v) if isinstance(v, dict) else plain(v) for key, v in state.items()}


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
    a, b = plain(a), plain(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


# ---------------------------------------------------------------------------------------------
# The protocol.


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

    def _watch_repeats(self, owner: Any, counter: str) -> None:
        """Add every later repeat to ``getattr(owner, counter).repeated_samples``; ``owner``
        is held weakly, so a loader that watches a sampler it was given can be collected."""
        ref = weakref.ref(owner)

        def listener(count: int) -> bool:
            target = ref()
            if target is None:
                return False
            stats = getattr(target, counter, None)
            if stats is not None:
                stats.repeated_samples += count
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
        if isinstance(tried, Sampler) and tried is not inner and "_probe_base" in tried.__dict__:
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


class _SeededMixin:
    """The ``seed`` attribute and its place in the state of a random sampler."""

    _seed: Optional[int]

    @property
    def seed(self) -> Optional[int]:
        """The base seed: the order of a pass is a function of ``(seed, epoch)``."""
        return self._seed

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


def forward_epoch(sampler: Any, epoch: int) -> None:
    """``sampler.set_epoch(epoch)`` if it has one (a plain Gluon sampler has not)."""
    set_epoch = getattr(sampler, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


def check_sampler(name: str, sampler: Any) -> Any:
    """``sampler`` if it looks like a sampler (iterable and sized), else a ``TypeError``."""
    if not (hasattr(sampler, "__iter__") and hasattr(sampler, "__len__")):
        raise TypeError(
            f"{name} must be a sampler (an iterable with __len__), got {type(sampler).__name__}"
        )
    return sampler


class _WrapperMixin:
    """Epoch forwarding and nested state for a sampler that wraps another one (``_sampler``).

    A pass of the wrapper runs one full pass of the wrapped sampler at the same epoch. The
    wrapped sampler's state is recorded as of the start of that pass (offset 0), and its
    length is checked after that state is restored, because a rollover carry changes it.
    """

    _sampler: Any
    _epoch: int

    def __iter__(self) -> Iterator:
        forward_epoch(self._sampler, self._epoch)
        return super().__iter__()  # type: ignore[misc]

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)  # type: ignore[misc]
        forward_epoch(self._sampler, self._epoch)

    def _inner_replay(self) -> Dict[str, Any]:
        inner: Optional[Dict[str, Any]] = None
        state_dict = getattr(self._sampler, "state_dict", None)
        if callable(state_dict):
            inner = dict(state_dict())
            if "epoch" in inner:
                inner.update(epoch=self._epoch, offset=0)
            inner = plain_dict(inner)
        return {"length": len(self._sampler), "sampler": inner}

    def _load_inner(self, state: Dict[str, Any]) -> None:
        """Load the wrapped sampler's state; on a probe (see ``Sampler.load_state_dict``)
        this changes only the wrapped sampler's probe, or, for a wrapped sampler that is not
        one of ours, defers its ``load_state_dict`` until the whole state has been checked."""
        name = type(self).__name__
        inner = state_value(state, "sampler", name)
        length = state_int(state, "length", name)
        wrapped = self._sampler
        load = getattr(wrapped, "load_state_dict", None)
        if inner is None:
            if callable(getattr(wrapped, "state_dict", None)) and callable(load):
                raise StateTypeError(
                    f"{name} state_dict['sampler'] must be the state of the wrapped "
                    f"{type(wrapped).__name__} (a dict from its state_dict()), got None"
                )
        elif not callable(load):
            raise ValueError(
                f"{name} state_dict holds the state of a wrapped sampler, but the wrapped "
                f"{type(wrapped).__name__} has no load_state_dict"
            )
        elif isinstance(wrapped, Sampler):
            try:
                load(inner)
            except ValueError as exc:
                kind = StateTypeError if isinstance(exc, StateTypeError) else ValueError
                raise kind(f"{name} state_dict['sampler']: {exc}") from exc
        else:
            deferred = self.__dict__.get("_probe_deferred")
            if deferred is None:
                load(inner)
            else:
                deferred.append(lambda: load(inner))
        if length != len(wrapped):
            raise ValueError(
                f"{name} state_dict mismatch: the wrapped sampler's length is {length!r} in "
                f"the state but {len(wrapped)} here"
            )
        if isinstance(inner, dict) and "epoch" in inner:
            # _inner_replay records the wrapped sampler as the pass starts: at this epoch, at
            # offset 0 (a pass of the wrapper runs a whole pass of the wrapped sampler).
            epoch = state_int(state, "epoch", name)
            for key, expected in (("epoch", epoch), ("offset", 0)):
                if key in inner and not same_value(inner[key], expected):
                    raise ValueError(
                        f"{name} state_dict['sampler'][{key!r}] must be {expected}, as the "
                        f"wrapped sampler's state is saved at the start of the pass of "
                        f"state_dict['epoch']={epoch}; got {inner[key]!r:.100}"
                    )


# ---------------------------------------------------------------------------------------------
# Gluon's index samplers.


class SequentialSampler(Sampler):
    """Yields ``start, start + 1, ..., start + length - 1`` on every pass, as Gluon's does.

    Parameters
    ----------
    length : int
        Number of indices.
    start : int, default 0
        The first index.

    Examples
    --------
    >>> list(SequentialSampler(4, start=2))
    [2, 3, 4, 5]
    """

    def __init__(self, length: int, start: int = 0) -> None:
        self._length = check_int("length", length)
        self._start = check_int("start", start, minimum=None)

    def __len__(self) -> int:
        return self._length

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[int]:
        return iter(range(self._start + start, self._start + self._length))

    def _config(self) -> Dict[str, Any]:
        return {"length": self._length, "start": self._start}


class RandomSampler(_SeededMixin, Sampler):
    """Yields a permutation of ``range(length)`` drawn from ``(seed, epoch)``.

    Unlike Gluon's, which draws from numpy's global RNG, the order does not depend on
    anything else the program does; it changes with the epoch, which ``set_epoch`` sets and
    each pass advances.

    Parameters
    ----------
    length : int
        Number of indices.
    seed : int or None, keyword-only
        Base seed. ``None`` draws one from numpy's global RNG at construction, so
        ``np.random.seed(...)`` beforehand makes a program reproducible, as with Gluon.

    Examples
    --------
    >>> sampler = RandomSampler(5, seed=42)
    >>> first = list(sampler)
    >>> sorted(first)
    [0, 1, 2, 3, 4]
    >>> sampler.set_epoch(0)
    >>> list(sampler) == first
    True
    """

    def __init__(self, length: int, *, seed: Optional[int] = None) -> None:
        self._length = check_int("length", length)
        self._seed = check_seed(seed)

    def __len__(self) -> int:
        return self._length

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[int]:
        order = epoch_rng(self._seed, epoch).permutation(self._length)
        return iter(order[start:].tolist())

    def _config(self) -> Dict[str, Any]:
        return {"length": self._length}


class FilterSampler(Sampler):
    """Yields, in order, the indices of the samples of ``dataset`` for which ``fn`` is true.

    As in Gluon, ``dataset`` is scanned once, at construction.

    Parameters
    ----------
    fn : callable
        Takes a sample and returns a truth value.
    dataset : iterable
        The dataset to filter.

    Examples
    --------
    >>> list(FilterSampler(lambda x: x % 3 == 0, [3, 4, 5, 6, 9]))
    [0, 3, 4]
    """

    def __init__(self, fn: Callable[[Any], Any], dataset: Iterable) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r} ({type(fn).__name__})")
        self._fn = fn
        self._dataset = dataset
        self._indices: List[int] = [i for i, sample in enumerate(dataset) if fn(sample)]

    def __len__(self) -> int:
        return len(self._indices)

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[int]:
        return iter(self._indices[start:])

    def _config(self) -> Dict[str, Any]:
        return {"length": len(self._indices)}


class IntervalSampler(Sampler):
    """Yields every ``interval``-th index of ``range(length)``, then, with ``rollover``, the
    same from 1, from 2, ... until every index has come once: MXNet 2.x's
    ``gluon.data.IntervalSampler`` (1.x's ``gluon.contrib.data.IntervalSampler``), in the
    same order.

    Unlike MXNet's, whose ``len()`` is ``length`` even with ``rollover=False``,
    ``len()`` is the number of indices a pass yields, so a ``BatchSampler`` over it counts
    its batches right.

    Parameters
    ----------
    length : int
        Number of indices.
    interval : int
        The step between two indices of one sweep, from 1 to ``length``.
    rollover : bool, default True
        Sweep again from each skipped start, so every index comes once; ``False`` stops
        after the sweep from 0.

    Examples
    --------
    >>> list(IntervalSampler(13, interval=3))
    [0, 3, 6, 9, 12, 1, 4, 7, 10, 2, 5, 8, 11]
    >>> sampler = IntervalSampler(13, interval=3, rollover=False)
    >>> list(sampler), len(sampler)
    ([0, 3, 6, 9, 12], 5)
    """

    def __init__(self, length: int, interval: int, rollover: bool = True) -> None:
        self._length = check_int("length", length)
        self._interval = check_int("interval", interval, minimum=1)
        if self._interval > self._length:
            raise ValueError(
                f"interval must be an int in [1, length={self._length}], got {self._interval}"
            )
        self._rollover = check_bool("rollover", rollover)

    def __len__(self) -> int:
        if self._rollover:
            return self._length
        return -(-self._length // self._interval)

    def _iter_epoch(self, epoch: int, start: int) -> Iterator[int]:
        sweeps = self._interval if self._rollover else 1
        order = (j for i in range(sweeps) for j in range(i, self._length, self._interval))
        return itertools.islice(order, start, None)

    def _config(self) -> Dict[str, Any]:
        return {"length": self._length, "interval": self._interval, "rollover": self._rollover}
