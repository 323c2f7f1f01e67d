"""The data path: each stage of it is one module here (docs/design.md, "The data path").

::

    batch sampler --(seq, indices)--> router --Task--> pool --> worker: BatchMaker makes
    (shardloader.sampler)             (router)         (pools)  the batch (batch), into a
                                                                 slot (ipc.slots)
                                                                        |
    user <-- pin / device <-- LoaderEpoch <-- reorder <-- Result <-- protocol.Reply
             (device)         (epoch)         (reorder)  (protocol)  (ipc.table maps the slot)

=============  =================================================================================
module         what it does
=============  =================================================================================
options        every loader argument, validated once (``LoaderOptions``)
epoch          an epoch: inline (``InlineEpoch``) or over a pool (``PooledEpoch``: the in-flight
               bound, timeouts); ``LoaderEpoch`` counts what the user consumed
router         routes a pool's results to the open epochs; worker death and restart
pools          one ``Pool`` protocol; ``pools.process`` and ``pools.thread``
protocol       every message: ``Task``/``Result``/``WorkerLost``, and the worker pipe's
worker         the one worker loop, for threads and processes; ``get_worker_info``
batch          ``BatchMaker``: a batch's samples, seeded, and batchify
seeding        randomness as a function of ``(seed, epoch, sample)``
reorder        results back in sampler order
stats          what ``stats()`` reports
ipc            shared memory and allocation (``slots``, ``table``, ``alloc``, ``bufferpool``,
               ``lease``, ``inherit``)
device         ``pin_memory``, ``ctx=`` and per-shard placement
nest           the one walker over nested batches
interrupts     Ctrl-C that Python swallowed in a destructor, raised again
lifeline       a worker process dies with the main process
gluon_cpp      MXNet 2.x's C++ pipeline, for ``try_nopython=True``
=============  =================================================================================

Nothing is imported here: a module that needs one stage (batchify needs ``ipc.alloc``,
the samplers ``seeding``) imports only that stage.

``shardloader._pipeline`` puts the stages together for the loader, in one place.
"""
