"""The ``mx.io.DataIter`` world: ``Module.fit`` over a loader, and a prefetching iterator.

``LoaderDataIter`` turns any re-iterable of batches (a shardloader loader, a Gluon
``DataLoader``, a list of batches) into a ``DataIter`` with ``provide_data``/``provide_label``,
fixed-size padded batches and a ``reset()`` that works at any point.

``PrefetchingIter`` is a drop-in for ``mx.io.PrefetchingIter`` that cannot hang: it runs
the wrapped iterators on one ``shardloader.prefetch.PrefetchIterator`` thread, so an
error in any of them reaches the consumer with its traceback, ``reset()`` stops the thread
before it touches the iterators, and ``close()``, a ``with`` block or garbage collection stop
the thread.
"""

# The package: _arrays (descriptions, shapes, dtypes, padding), _base (the accessors, closed
# state and with block both iterators share), _loader_iter, _prefetching.
from ._loader_iter import LoaderDataIter
from ._prefetching import PrefetchingIter

__all__ = ["LoaderDataIter", "PrefetchingIter"]
