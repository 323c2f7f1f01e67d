"""Batchify functions: turn a list of samples into one batch.

A batchify function is a small callable that receives the samples of one batch, in sampler
order, and returns the batch. ``default_batchify_fn`` reproduces Gluon's function of that
name (MXNet 1.9.1's default); ``Stack``, ``Pad``, ``Tuple``, ``List``, ``Dict`` and
``NamedTuple`` reproduce gluon-nlp's ``gluonnlp.data.batchify``; ``Group``, ``AsList`` and
``Append`` reproduce MXNet 2.x's ``mxnet.gluon.data.batchify``.

MXNet 2.x's ``Stack`` and ``Pad`` share their names with gluon-nlp's but not their meaning
(2.x's ``Stack`` splits list samples into fields; its ``Pad`` pads every axis and has no
``axis`` or ``ret_length``). The names here keep gluon-nlp's meaning. Pass 2.x's own
``mx.gluon.data.batchify.Stack()`` or ``Pad()`` to a loader: ``gluon_equivalent`` swaps
them, and 2.x's ``Group``, ``AsList``, ``Append`` and Gluon's ``default_batchify_fn``, for
implementations here that give the same batches and stack straight into a worker's shared
memory.

Under MXNet 2.x, ``Stack``, ``Pad``, ``Tuple`` and ``Group`` (and the stand-ins for 2.x's
``Stack`` and ``Pad``) also have Gluon 2.x's ``__mx_handle__``, for its C++ pipeline
(``try_nopython=True``), wherever one of MXNet's C++ batchify functions gives their batches.
Samples whose shapes cannot go into one batch raise ``BatchifyShapeError``, which says what
to do first; a loader names the samples by their dataset indices.

None of them knows about shared memory or devices. They build numpy arrays and wrap them for
MXNet only at the end: every output array is a buffer from
``shardloader._engine.ipc.alloc.empty``, filled in place and handed back through
``shardloader._engine.ipc.alloc.to_output``. By default that is an MXNet array wrapping the
buffer on ``cpu(0)``: an ``mx.np.ndarray`` under numpy semantics (MXNet 2.x's default), else an
``mx.nd.NDArray``; inside a worker process the transport makes the buffer a piece of shared
memory and keeps the result a numpy array, so a batch is written once, where the main process
will read it. (Importing this package, as any part of shardloader, imports MXNet; a sample is
read through MXNet only when it is an MXNet array.)

Samples may be ``mx.nd.NDArray``, numpy arrays, numpy scalars, Python numbers, or nested
tuples, lists and dicts of those. The output dtypes are the ones the installed MXNet's arrays
hold: bool, uint8, int8, int32, int64, float16, float32 and float64, and under MXNet 2.x also
int16, uint16, uint32 and uint64 (``shardloader._compat.ARRAY_DTYPES`` asks MXNet).
"""

from __future__ import annotations

# The package's modules, from the bottom up: _arrays (samples as numpy arrays, dtypes, output
# buffers), _checks (argument checks, the errors), _stack (stacking samples of one
# shape, Stack), _fields (Tuple, Group, List, AsList, Dict, NamedTuple), _default
# (default_batchify_fn and MXNet 2.x's Stack), _pad (both Pads), _append (Append) and _gluon
# (gluon_equivalent, is_native: the capability ``uses_batch_allocator``, and the loader's
# default batchify function). Names imported ``as`` themselves are not in __all__ but the
# rest of shardloader and the tests use them from here.
from ._append import Append
from ._checks import Batchify as Batchify
from ._checks import BatchifyShapeError, BatchifyTypeError
from ._default import _FieldStack as _FieldStack
from ._default import default_batchify_fn, default_mp_batchify_fn
from ._fields import AsList, Dict, Group, List, NamedTuple, Tuple
from ._gluon import as_loader_default as as_loader_default
from ._gluon import gluon_equivalent
from ._gluon import is_native as is_native
from ._gluon import loader_default as loader_default
from ._pad import Pad
from ._pad import _PadEveryAxis as _PadEveryAxis
from ._stack import Stack

__all__ = [
    "default_batchify_fn",
    "default_mp_batchify_fn",
    "Stack",
    "Pad",
    "Tuple",
    "List",
    "Dict",
    "NamedTuple",
    "Group",
    "AsList",
    "Append",
    "BatchifyTypeError",
    "BatchifyShapeError",
    "gluon_equivalent",
]

# Tracebacks name the errors by the path users import them from, not by _checks.
BatchifyTypeError.__module__ = BatchifyShapeError.__module__ = __name__
