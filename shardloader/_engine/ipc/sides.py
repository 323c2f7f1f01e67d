"""The two sides of the shared-memory slot protocol, as ``typing.Protocol`` classes.

The protocol itself (who owns a slot when) is in the ``ipc`` package's docstring. These
classes say which calls each side makes, and in what order: ``WorkerSide`` is what a worker
process's loop (``worker``) asks of its ring of slots (``slots.SlotRing``); ``MainSide`` is
what the process pool (``pools.process``) asks of its table of every worker's slots
(``table.SlotTable``). Both implementations are checked against them by the type checker
(``make lint``), wherever the worker and the pool hold a ring or a table.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

__all__ = ["MainSide", "WorkerSide"]


class WorkerSide(Protocol):
    """A worker process's ring of slots, in the order its loop uses it.

    For every message read from the pipe (``Work`` or ``Release``), before any batch starts:

    1. ``resend(message.resend)``, then ``release(message.released)``: slots the main process
       is done with become free (a surplus free slot is closed, and named in ``dropped``).

    For every batch:

    2. ``begin()`` takes a slot sized like the last batch;
    3. ``allocate(shape, dtype)``, any number of times, while batchify runs (it carves
       batchify's output from that slot);
    4. ``pack(batch, promoted, numpy_mode)`` turns the batch into a skeleton and a slot id,
       with the descriptors of slots never sent before; or, if the batch raised,
       ``abort()`` frees its slot.

    For every reply (one per task):

    5. read and empty ``dropped`` into the reply; ``release(unsent)`` for the slots of
       batches that could not be encoded; after sending, ``sent(slot_id)`` for every batch
       delivered (a slot above ``slots.MAX_KEPT_SLOT_BYTES`` is closed here).

    In ``finally``, whatever ended the loop (``STOP``, a closed pipe, an error):

    6. ``close()`` unmaps and closes every slot.
    """

    dropped: List[int]  # slots closed since the last reply; the reply names them

    def resend(self, slot_ids: Sequence[int]) -> None:
        """The main process lost these slots' descriptors: send each again with its next
        batch."""

    def release(self, slot_ids: Sequence[int]) -> None:
        """These slots are free again."""

    def begin(self) -> None:
        """Start a batch."""

    def allocate(self, shape: Any, dtype: Any) -> Any:
        """Memory for one of batchify's outputs (a numpy array), in the batch's slot when
        it fits."""

    def abort(self) -> None:
        """The batch failed: free its slot."""

    def pack(
        self, result: Any, promoted: Dict[int, Any], numpy_array: bool = False
    ) -> Tuple[Any, Optional[int], List[Tuple[int, int, int]]]:
        """``(skeleton, slot_id, [(slot_id, capacity, fd), ...])`` for a finished batch."""

    def sent(self, slot_id: int) -> None:
        """The batch in this slot was delivered."""

    def close(self) -> None:
        """Unmap and close every slot; idempotent."""


class MainSide(Protocol):
    """The main process's table of every worker's slots, in the order the pool uses it.

    Workers are named by ``worker_key`` (a restarted worker gets a new key). Before the pool
    asks what to send (each ``submit`` and each ``poll``):

    1. ``collect()`` runs the finalizers of batches MXNet has released since, which queue
       their slots for their worker. It is the only call that does; the queries below
       change nothing but what they hand out.
    2. ``take_releases(key)`` and ``take_resends(key)`` for the worker a ``Work`` goes to;
       then, for each worker in ``urgent()`` (a large slot came free), the same two for a
       ``Release`` of its own.

    For every ``Reply`` read from a worker:

    3. per new slot, ``adopt(key, slot_id, fd, capacity)`` (it closes ``fd``, whatever
       happens), or ``not_adopted(key, slot_id)`` when its descriptor did not arrive or
       could not be mapped;
    4. ``drop(key, reply.dropped)``;
    5. per batch: ``received(key, slot_id)`` for one that will be handed on, or
       ``discard(key, slot_id)`` for one that failed here.

    Later, for each batch that was received:

    6. ``materialize(key, slot_id, skeleton)`` when the user takes it (its slot is queued
       for the worker once every array over it is released, on whichever thread notices),
       or ``discard(key, slot_id)`` if nobody will (its epoch was closed).

    When a worker dies or is replaced, ``forget_worker(key)``. In the pool's shutdown (its
    ``finally``, also run by its finalizer), after every worker is joined or killed:
    ``close()``, which unmaps every slot no batch still uses.
    """

    bytes_delivered: int  # bytes of every batch materialised so far

    def collect(self) -> None:
        """Run the finalizers of released batches: their slots are queued to go home."""

    def take_releases(self, worker_key: int) -> List[int]:
        """Slot ids to hand back to this worker (emptied as they are taken)."""

    def take_resends(self, worker_key: int) -> List[int]:
        """Slot ids whose descriptor this worker must send again."""

    def urgent(self) -> List[int]:
        """Workers with a large slot waiting to go back to them (emptied as taken)."""

    def adopt(self, worker_key: int, slot_id: int, fd: int, capacity: int) -> None:
        """Map a worker's new slot from its descriptor; ``fd`` is closed."""

    def not_adopted(self, worker_key: int, slot_id: int) -> None:
        """A new slot that could not be mapped: it goes back, marked for resending."""

    def drop(self, worker_key: int, slot_ids: Sequence[int]) -> None:
        """The worker closed these slots."""

    def received(self, worker_key: int, slot_id: Optional[int]) -> None:
        """A batch in this slot arrived: keep the slot until the batch is done."""

    def materialize(self, worker_key: int, slot_id: Optional[int], skeleton: Any) -> Any:
        """The batch, over its slot's memory, with no copy."""

    def discard(self, worker_key: int, slot_id: Optional[int]) -> None:
        """A batch nobody will read: its slot goes back now."""

    def forget_worker(self, worker_key: int) -> None:
        """The worker is gone: unmap its idle slots."""

    def close(self) -> None:
        """Unmap every slot no batch uses; idempotent."""
