"""The data path: each stage of it is one module here (docs/design.md, "The data path").

Each batch goes one way, and comes back by return value: every stage pulls from the one
before it by calling it (``stage``: the contract they all follow)::

    iter(loader) -> ConsumerStage -> placement -> PooledEpoch ------> Router ------> Pool
                    (consumer)       (device,     (epoch: in-flight   (router:       (pools)
                                      prefetch)    bound, deadline)    reorder,        |
                                                                       restart)       v
                                                 or InlineEpoch             worker: BatchMaker
                                                 (epoch: loads in           (worker, batch)
                                                 the caller's thread)       into a slot (ipc)

``take`` on the router returns a batch already received (``protocol``), reordered
(``reorder``) and materialised over its slot (``ipc.table``). Placement is one of: nothing;
``PinStage`` on the consumer's thread (``pin_memory``); a prefetch thread that copies to
``ctx=`` (``shardloader.prefetch``). ``shardloader._pipeline`` chooses it.

=============  =================================================================================
module         what it does
=============  =================================================================================
options        every loader argument, validated once (``LoaderOptions``)
stage          the contract of every stage: ``__next__``, idempotent ``close()``, ``closed``,
               ``with``, ``cancel()``, one ``ClosedIteratorError`` message
consumer       what ``iter(loader)`` returns (``ConsumerStage``): wait time, Ctrl-C, and a
               ``Position`` record the loader reads for checkpoints
epoch          an epoch's source: inline (``InlineEpoch``) or over the router
               (``PooledEpoch``: the in-flight bound and the deadline)
router         the only door to the pool: ``open``/``dispatch``/``take``/``close``; one reorder
               buffer per epoch, the registry of outstanding work, worker death and restart
timing         every timing constant of the data path
pools          one ``Pool`` protocol; ``pools.process`` and ``pools.thread``;
               ``pools.lifecycle`` starts (all at once), stops and reaps worker processes
protocol       every message: ``Task``/``Result``/``WorkerLost``, and the worker pipe's
worker         the one worker loop, for threads and processes; ``get_worker_info``
batch          ``BatchMaker``: a batch's samples, seeded, and batchify
seeding        randomness as a function of ``(seed, epoch, sample)``
reorder        results back in sampler order
stats          what ``stats()`` reports
ipc            shared memory and allocation (``slots``, ``table``, ``alloc``, ``bufferpool``,
               ``lease``, ``inherit``)
device         ``pin_memory`` (``PinStage``), ``ctx=`` and per-shard placement
nest           the one walker over nested batches
interrupts     Ctrl-C that Python swallowed in a destructor, raised again
lifeline       a worker process dies with the main process
pickling       which part of a worker's start-up data does not pickle, for its error
gluon_cpp      MXNet 2.x's C++ pipeline, for ``try_nopython=True``
=============  =================================================================================

Nothing is imported here: a module that needs one stage (batchify needs ``ipc.alloc``,
the samplers ``seeding``) imports only that stage.

``shardloader._pipeline`` puts the stages together for the loader, in one place.
"""
