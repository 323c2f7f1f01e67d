"""Argument checks shared by the batchify functions, and the error they raise for a wrong
type where gluon-nlp raises ``ValueError``."""

from __future__ import annotations

import typing

import numpy as np

from .._compat import cpp_batchify
from ._arrays import _MX_DTYPE_NAMES, _MX_DTYPES

Batchify = typing.Callable[[typing.Sequence[typing.Any]], typing.Any]

ALLOCATOR_ATTR = "uses_batch_allocator"
"""The capability a batchify function declares (a class attribute, or a property where it
depends on the functions it holds): ``True`` when every array it returns was allocated with
``shardloader._engine.ipc.alloc.empty`` and handed back through ``alloc.to_output``. A worker
process then installs its shared-memory slot as the allocator, and the batch is written once,
in the slot; without it, the batch is built in private memory and copied into the slot."""


def uses_batch_allocator(fn: typing.Any) -> bool:
    """Whether ``fn`` declares ``uses_batch_allocator = True`` (``ALLOCATOR_ATTR``)."""
    try:
        return getattr(fn, ALLOCATOR_ATTR, False) is True
    except Exception:  # noqa: BLE001 - a user's __getattr__ that raises declares nothing
        return False


class BatchifyTypeError(TypeError, ValueError):
    """A wrong type given to a batchify function: a ``TypeError`` that is also a ``ValueError``.

    gluon-nlp's ``Dict`` and ``NamedTuple`` raise ``ValueError`` where a type is wrong (a
    function that is not callable, ``fn_dict`` that is not a dict, a sample of another
    namedtuple type). shardloader raises this instead, so that code written for gluon-nlp
    (``except ValueError``) and code that expects a ``TypeError`` both catch it.

    Examples
    --------
    >>> from shardloader.batchify import BatchifyTypeError, Dict
    >>> try:
    ...     Dict({"data": "not a function"})
    ... except ValueError as exc:
    ...     print(type(exc) is BatchifyTypeError, isinstance(exc, TypeError))
    True True
    """


class BatchifyShapeError(ValueError):
    """Samples of one batch whose shapes cannot go into one batch (a ``ValueError``).

    The first line of the message says which samples differ and their shapes, the second
    what to do (pad the samples; for images, resize or crop them). A loader names the
    samples by their dataset indices ("the image at dataset index 5"); a batchify function
    called directly names them by their position in the batch ("batch position 1").

    Examples
    --------
    >>> import numpy as np
    >>> from shardloader.batchify import BatchifyShapeError, Stack
    >>> try:
    ...     Stack()([np.zeros(3), np.zeros(4)])
    ... except BatchifyShapeError as exc:
    ...     print(exc)  # doctest: +NORMALIZE_WHITESPACE
    Cannot stack the sample at batch position 1, of shape (4,), with the one at batch
    position 0, of shape (3,): the samples of a batch must have one shape.
    Pad the samples to one shape with batchify_fn=batchify.Pad(pad_val=0) (for samples of
    several fields, batchify.Tuple(batchify.Pad(pad_val=0), batchify.Stack())), or make them
    one shape in the dataset.
    """

    # The loader's BatchMaker knows the batch's dataset indices and calls name_samples as
    # the error passes. Built from a message alone (as an error rebuilt from a worker is),
    # it is just that message.

    def __init__(
        self, message: str, *, template: str = "", positions: tuple = (), count: int = 0
    ) -> None:
        super().__init__(message)
        # template: the message, with {0}, {1}... where the samples at ``positions`` are named.
        self._template, self._positions, self._count = template, tuple(positions), count

    @classmethod
    def about(cls, template: str, positions: tuple, count: int) -> BatchifyShapeError:
        """The error for ``template`` (``{0}``, ``{1}``... name the samples at ``positions``
        of a batch of ``count`` samples)."""
        return cls(
            _render(template, [f"batch position {p}" for p in positions]),
            template=template,
            positions=positions,
            count=count,
        )

    def name_samples(self, indices: typing.Sequence) -> None:
        """Name the samples by their dataset ``indices`` (those of the batch, in order).

        Left as it is when the batch has another length than the samples that failed: a
        batchify function that chose some of its samples would make the names wrong.
        """
        if self._template and len(indices) == self._count:
            names = [f"dataset index {indices[p]}" for p in self._positions]
            self.args = (_render(self._template, names),)


def _render(template: str, names: typing.Sequence[str]) -> str:
    return template.format(*names)


def _describe(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_int(value) -> bool:
    """Whether ``value`` is an int (numpy's included), but not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _is_flag(value) -> bool:
    """Whether ``value`` is a bool (numpy's included)."""
    return isinstance(value, (bool, np.bool_))


def _require_samples(data, owner: typing.Optional[str]) -> None:
    """Raise the ``ValueError`` for an empty batch (its message prefixed by ``owner``)."""
    if len(data) == 0:
        prefix = "" if owner is None else f"{owner}: "
        raise ValueError(f"{prefix}cannot batchify an empty batch: it has no samples")


def _check_dtype(owner: str, dtype) -> typing.Optional[np.dtype]:
    if dtype is None:
        return None
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"{owner}: dtype must be None or a numpy dtype ({_MX_DTYPE_NAMES}), "
            f"got {_describe(dtype)}"
        ) from None
    if resolved not in _MX_DTYPES:
        raise ValueError(
            f"{owner}: dtype must be None or one of {_MX_DTYPE_NAMES} (the dtypes this "
            f"MXNet's arrays hold), got {dtype!r}"
        )
    return resolved


def _check_callable(owner: str, name: str, fn) -> None:
    if not callable(fn):
        raise BatchifyTypeError(
            f"{owner}: {name} must be a callable batchify function, got {_describe(fn)}"
        )


def _mx_handle(
    owner, cpp_name: str, params: typing.Optional[dict], children: typing.Sequence = ()
) -> typing.Callable[[], typing.Any]:
    """What ``owner.__mx_handle__`` is: a function that builds MXNet 2.x's C++ batchify
    function ``cpp_name`` with ``params`` (and, given ``children``, with their handles as
    ``functions``), as Gluon 2.x's batchify objects build theirs for its C++ pipeline.

    ``params=None`` means that no C++ function gives ``owner``'s batches. Then, or where a
    child has no handle, or MXNet has no C++ pipeline (1.x), the attribute is missing: an
    ``AttributeError``, so that Gluon's ``hasattr`` check answers False and Gluon keeps to
    its Python pipeline (or, with ``try_nopython=True``, says the batchify function fails).
    """
    creator = None if params is None else cpp_batchify(cpp_name)
    found = [getattr(child, "__mx_handle__", None) for child in children]
    makers = [maker for maker in found if maker is not None]
    if creator is None or params is None or len(makers) < len(found):
        raise AttributeError(
            f"{type(owner).__name__!r} object has no attribute '__mx_handle__': MXNet's C++ "
            f"data pipeline has no batchify function that gives the batches of {owner!r}"
        )
    if children:
        return lambda: creator(functions=[maker() for maker in makers], **params)
    return lambda: creator(**params)
