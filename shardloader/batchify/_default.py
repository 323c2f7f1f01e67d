"""Gluon's ``default_batchify_fn``, and MXNet 2.x's ``Stack``, which splits list samples into
fields as well."""

from __future__ import annotations

import typing

from .._engine.ipc import alloc as _alloc
from ._checks import _describe, _mx_handle, _require_samples
from ._fields import _split_fields
from ._stack import _stack


def default_batchify_fn(data: typing.Sequence[typing.Any]):
    """Collate a list of samples into a batch, as Gluon 1.9.1's ``default_batchify_fn`` does.

    - NDArray or numpy-array samples are stacked along a new first axis.
    - Tuple samples give a *list* with one batch per field, batchified recursively.
    - Anything else goes through ``np.asarray(data)`` and keeps that dtype: Python ints
      become int64, Python floats float64, numpy scalars keep their dtype.

    Extensions beyond Gluon, which would fail on these inputs:

    - Dict samples give a dict with one batch per key (every sample needs the same keys).
    - Namedtuple samples give the same namedtuple type, one batch per field (Gluon gives a
      list).
    - Leaves that are not numbers (strings, ``None``, other objects, record and structured
      arrays, which keep their field names) come back as the plain Python list of those
      leaves.
    - A masked array with masked values raises a ``ValueError`` (Gluon silently stacks the
      values under the mask). One with nothing masked is stacked as its data, and a masked
      scalar becomes ``nan``, as in Gluon.
    - Samples of different shapes raise a ``ValueError`` that names the first offending
      sample and both shapes; tuple samples with different numbers of fields raise too
      (Gluon silently drops the extra fields).

    Parameters
    ----------
    data : sequence
        The samples of one batch.

    Returns
    -------
    NDArray, list, dict or namedtuple
        The batch. Inside a worker the array leaves are numpy arrays instead of NDArrays.

    Examples
    --------
    >>> import numpy as np
    >>> from shardloader.batchify import default_batchify_fn
    >>> batch = default_batchify_fn([np.array([1.0, 2.0], dtype=np.float32),
    ...                              np.array([3.0, 4.0], dtype=np.float32)])
    >>> batch.asnumpy()
    array([[1., 2.],
           [3., 4.]], dtype=float32)
    >>> data, label = default_batchify_fn([(np.zeros(3), 0), (np.ones(3), 1)])
    >>> data.shape, label.asnumpy()
    ((2, 3), array([0, 1]))
    >>> batch = default_batchify_fn([{"x": 1.5, "name": "a"}, {"x": 2.5, "name": "b"}])
    >>> batch["x"].asnumpy(), batch["name"]
    (array([1.5, 2.5]), ['a', 'b'])
    """
    return _collate(data, split_lists=False, owner="default_batchify_fn")


def _collate(data, split_lists: bool, owner: str):
    """``default_batchify_fn``; with ``split_lists``, list samples are split into fields as
    tuple samples are (MXNet 2.x's ``Stack``)."""
    first = data[0] if len(data) else None
    if isinstance(first, tuple) or (split_lists and isinstance(first, list)):
        fields = _split_fields(data, len(first), owner)
        container = type(first)
        if hasattr(container, "_fields"):
            for position, sample in enumerate(data):
                if type(sample) is not container:
                    raise TypeError(
                        f"{owner}: sample {position} is {_describe(sample)}, but "
                        f"sample 0 is a {container.__name__}; all samples must have one type"
                    )
            return container(*[_collate(field, split_lists, owner) for field in fields])
        return [_collate(field, split_lists, owner) for field in fields]
    if isinstance(first, dict):
        return _batchify_dicts(data, split_lists, owner)
    buf = _stack(data, owner=owner)
    if buf is None:
        return list(data)
    return _alloc.to_output(buf)


def _batchify_dicts(data, split_lists: bool, owner: str) -> dict:
    keys = data[0].keys()
    for position, sample in enumerate(data):
        if not isinstance(sample, dict) or sample.keys() != keys:
            raise ValueError(
                f"{owner}: sample {position} must be a dict with the keys of "
                f"sample 0 {sorted(keys, key=repr)}, got {_describe(sample)}"
            )
    return {key: _collate([sample[key] for sample in data], split_lists, owner) for key in keys}


default_batchify_fn.uses_batch_allocator = True  # type: ignore[attr-defined]

default_mp_batchify_fn = default_batchify_fn
"""Gluon's name for the batchify function its worker processes use; the same function here,
since the transport, not the batchify function, decides where the buffers live."""


class _FieldStack:
    """MXNet 2.x's ``Stack`` (its loader's default): ``default_batchify_fn``, except that list
    samples are split into fields as tuple samples are, at any depth.

    Not exported: gluon-nlp's ``Stack`` has the name here. A loader uses this one for MXNet
    2.x's ``Stack()`` and as its default batchify function under MXNet 2.x.
    """

    uses_batch_allocator = True  # batchify._checks.ALLOCATOR_ATTR

    def __call__(self, data: typing.Sequence[typing.Any]):
        _require_samples(data, "Stack")
        return _collate(data, split_lists=True, owner="Stack")

    @property
    def __mx_handle__(self) -> typing.Callable[[], typing.Any]:
        """Under MXNet 2.x, builds the C++ batchify function of Gluon 2.x's ``Stack``."""
        return _mx_handle(self, "StackBatchify", {})

    def __repr__(self) -> str:
        return "Stack()"
