"""Samplers that wrap another one: epoch forwarding, and the wrapped sampler's state nested in
the wrapper's.

A pass of a wrapper (``BatchSampler``, ``ShardGroupSampler``, ``PartitionSampler``) at epoch
``e`` runs one full pass of the wrapped sampler at epoch ``e``. The wrapped sampler may be any
Gluon sampler: one without ``set_epoch`` or ``state_dict`` is iterated as it is, and its own
randomness then decides the order.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

from ._base import Sampler
from ._state import StateTypeError, json_ready_dict, same_value, state_int, state_value

__all__ = ["check_sampler", "forward_epoch", "initial_epoch"]


def forward_epoch(sampler: Any, epoch: int) -> None:
    """``sampler.set_epoch(epoch)`` if it has one (a plain Gluon sampler has not)."""
    set_epoch = getattr(sampler, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


def initial_epoch(sampler: Any) -> int:
    """The epoch a wrapper starts at: that of the sampler it wraps, if that has one."""
    epoch = getattr(sampler, "epoch", 0)
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0


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
            inner = json_ready_dict(inner)
        return {"length": len(self._sampler), "sampler": inner}

    def _load_inner(self, state: Dict[str, Any]) -> None:
        """Load the wrapped sampler's state, then check its length and start against
        ``state`` (see ``_inner_replay``)."""
        name = type(self).__name__
        inner = state_value(state, "sampler", name)
        length = state_int(state, "length", name)
        self._load_wrapped(inner)
        wrapped = self._sampler
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

    def _load_wrapped(self, inner: Any) -> None:
        """Give ``inner`` (``state['sampler']``) to the wrapped sampler. On a probe (see
        ``Sampler.load_state_dict``) this changes only the wrapped sampler's probe, or, for a
        wrapped sampler that is not one of ours, defers its ``load_state_dict`` until the
        whole state has been checked."""
        name = type(self).__name__
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
