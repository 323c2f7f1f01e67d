"""What ``LoaderDataIter`` and ``PrefetchingIter`` share: the ``DataIter`` accessors answered
from the last batch, the closed state, and the ``with`` block that closes."""

from __future__ import annotations

from typing import Any, List, Optional, TypeVar

from mxnet.io import DataBatch, DataIter
from mxnet.ndarray import NDArray

from .._errors import ClosedIteratorError
from ._arrays import _Descs

_Self = TypeVar("_Self", bound="_CurrentBatch")


class _CurrentBatch(DataIter):
    """The ``DataIter`` accessors, answered from the batch the last ``next()`` returned and
    from the descriptions the subclass built; ``close()`` and a ``with`` block.

    Subclasses set ``_provide_data``, ``_provide_label`` and ``_current`` and implement
    ``next``, ``reset`` and ``close`` (which sets ``_closed``)."""

    _current: Optional[DataBatch]
    _provide_data: _Descs
    _provide_label: _Descs
    _closed: bool = False
    # The class name in errors, set per class, so that a user's subclass keeps the messages.
    _kind = "DataIter"

    @property
    def provide_data(self) -> _Descs:
        """The name, shape (with the full batch size), dtype and layout of each data field."""
        return self._provide_data

    @property
    def provide_label(self) -> _Descs:
        """The name, shape (with the full batch size), dtype and layout of each label field."""
        return self._provide_label

    def iter_next(self) -> bool:
        try:
            self.next()
        except StopIteration:
            return False
        return True

    def getdata(self) -> List[NDArray]:
        return self._last("getdata").data

    def getlabel(self) -> List[NDArray]:
        return self._last("getlabel").label

    def getindex(self) -> Any:
        return self._last("getindex").index

    def getpad(self) -> int:
        return self._last("getpad").pad

    def _last(self, accessor: str) -> DataBatch:
        """The batch the last ``next()`` returned, for ``accessor``."""
        self._check_open(f"{accessor}() on")
        if self._current is None:
            raise RuntimeError(
                f"{self._kind}.{accessor}() has no batch to answer from: call next() or "
                "iter_next() first, and again after reset()"
            )
        return self._current

    def _check_open(self, action: str) -> None:
        """Raise ``ClosedIteratorError`` ("``action`` a closed <class>") once closed."""
        if self._closed:
            raise ClosedIteratorError(f"{action} a closed {self._kind}")

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
