"""Shared memory and allocation: how a batch crosses from a worker process to the user
without a copy, and how MXNet hands our memory back.

Modules: ``slots`` (a worker's ring of slots, and carving a batch into one), ``table`` (the
main process's view of every worker's slots), ``fds`` (receiving a slot's descriptor),
``alloc`` (where batchify writes, and the buffer pool of inline batches), ``lease`` (MXNet
arrays over our memory, and their release), ``inherit`` (what a forked worker lets go
of) and ``sides`` (the two sides of the protocol below, ``WorkerSide`` and ``MainSide``, as
``typing.Protocol`` classes with the order of their calls).

The transport for process workers:

Ownership protocol (docs/design.md, invariant 4: every segment has exactly one owner):

* A worker owns a small *ring* of slots. A slot is an anonymous ``memfd`` segment, mapped
  once and reused batch after batch, so its pages are faulted in once, not per batch.
* The worker stacks a batch straight into a free slot (through ``alloc``)
  and sends only metadata: the slot id, and per array its offset, shape and dtype. The first
  time a slot travels, its file descriptor follows the message (``SCM_RIGHTS``); the main
  process maps it and closes the descriptor. The worker keeps its descriptor and its own
  mapping: mapping a slot again for every batch (and unmapping it after) cost more than
  filling it, about 1.5 ms for a 9.6 MB batch.
  If the main process cannot take the descriptor (it is out of descriptors: the kernel
  drops it, ``fds``) or cannot map the slot (out of address space), that batch fails with a
  ``SharedMemoryError``; the slot goes back to the worker marked for its descriptor to be
  sent again (``resend`` in the next message), and the pipe stays in step.
* From then on the main process owns the slot's contents. It wraps the arrays as MXNet
  arrays without a copy (``lease.as_ndarray``). When MXNet has released the last of them
  and the user holds no numpy view either, a finalizer on the slot's buffer object queues
  the slot id, and the next message to that worker hands it back (a large slot goes at
  once, in a message of its own). The finalizers run when the pool asks the table to
  ``collect()`` (before each message it sends) or on the background reaper; the table's
  queries (``take_releases``, ``urgent``) run none. MXNet's release never runs Python: it
  posts a semaphore that Python threads poll (see ``lease``), so the finalizer always runs
  on a Python thread that holds the GIL, never on an MXNet engine thread, and a ``fork()``
  anywhere in the process cannot deadlock on it (docs/design.md, invariant 7).
  A batch that is never handed to the user (early ``break``, error, ``close()``) is released
  the same way by whoever drops it.
* Memory is freed when both mappings are gone: the worker drops a surplus free slot and says
  so in its next message, and exiting workers unmap everything. Nothing has a name in
  ``/dev/shm``, so a ``SIGKILL`` anywhere leaks nothing.
"""
