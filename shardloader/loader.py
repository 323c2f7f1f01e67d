"""``ShardedDataLoader``: Gluon's DataLoader signature over shardloader's data path.

    batch sampler --(seq, indices)--> pool --> reorder buffer --> pin/device --> user

This module holds the arguments, the epoch bookkeeping (the next epoch's number, the
position of the epoch being consumed, an epoch started ahead of ``iter()``) and
checkpoints. ``_pipeline`` puts the stages together; each stage lives
in its own module (docs/design.md, "The data path").
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

from mxnet.gluon.data import DataLoader as _GluonDataLoader

from . import _checkpoint
from . import batchify as _batchify
from ._compat import gluon_positional_order
from ._engine import interrupts as _interrupts
from ._engine import options as _options
from ._engine.consumer import ConsumerStage, Position
from ._engine.device import check_shards_fit
from ._engine.gluon_cpp import cpp_pipeline
from ._engine.stats import Stats
from ._errors import ClosedIteratorError
from ._pipeline import Pipeline, build_batch_sampler
from ._validate import check_bool, check_int, check_keywords
from .recordio import inline_safe, thread_safe
from .sampler import Sampler

__all__ = ["ShardedDataLoader", "DataLoader"]


class ShardedDataLoader(_GluonDataLoader):
    """Loads mini-batches from a dataset, with Gluon's ``DataLoader`` signature.

    Code written for ``mxnet.gluon.data.DataLoader`` (1.9.1's or 2.x's) runs unchanged and
    gets the same batches in the same order. The positional parameters are those of the
    installed MXNet's Gluon: under MXNet 2.x the 14th is ``try_nopython`` and
    ``auto_reload`` is keyword-only. It *is* a Gluon ``DataLoader``
    (``isinstance`` holds, so ``Estimator`` accepts it), with Gluon's private attributes
    (``_dataset``, ``_batch_sampler``, ``_pin_memory``, ...) for code that reads them.
    Beyond Gluon it never hangs (dead workers and timeouts become errors within seconds),
    never leaks shared memory, yields per-device shards whose steps are always full, and
    can checkpoint and resume in the middle of an epoch.

    Parameters
    ----------
    dataset : Dataset
        Anything with ``__len__`` and ``__getitem__`` (a Gluon ``Dataset``, a numpy array,
        an NDArray, a list).
    batch_size : int
        Samples per batch. Required unless ``batch_sampler`` is given.
    shuffle : bool, default False
        Shuffle the samples every epoch (seeded by ``seed`` and the epoch number).
    sampler : Sampler
        Yields sample indices. Not together with ``shuffle``.
    last_batch : {'keep', 'discard', 'rollover'}, default 'keep'
        What to do with an incomplete last batch (and, with ``num_shards``, an incomplete
        last group of shards).
    batch_sampler : Sampler
        Yields lists of indices (a batch) or lists of lists of indices (a sharded step: one
        batch per shard). Not together with ``batch_size``, ``shuffle``, ``sampler`` or
        ``last_batch``.
    batchify_fn : callable
        Merges a list of samples into a batch. Defaults to the installed Gluon's default:
        ``shardloader.batchify.default_batchify_fn`` under MXNet 1.x; under 2.x, 2.x's
        ``batchify.Stack()``, which also splits list samples into fields. Gluon's own
        batchify functions run as shardloader's equivalents (``batchify.gluon_equivalent``).
    num_workers : int, default 0
        Worker processes (or threads, with ``thread_pool``). 0 loads in the calling thread.
    pin_memory : bool, default False
        Return batches in ``mx.cpu_pinned(pin_device_id)``, copied as the loop receives them
        (a plain memcpy for host memory; Gluon copies there too).
    pin_device_id : int, default 0
        The device id of the pinned memory.
    prefetch : int, optional
        Batches in flight ahead of the consumer; defaults to 2 * num_workers. 0 is valid
        (one batch is still loaded when the consumer asks for it).
    thread_pool : bool, default False
        Use threads instead of processes.
    timeout : float or None, default 120
        Seconds a batch may take before ``shardloader.LoaderTimeoutError``.
    auto_reload : bool, default False
        Start loading the next epoch as soon as the current one ends (and at construction).
    try_nopython : bool, optional
        MXNet 2.x's switch to its C++ pipeline. ``None`` and ``False``: shardloader's own
        workers, with the batches of Gluon's Python pipeline. ``True`` with ``num_workers >
        0``, under MXNet 2.x: Gluon's C++ pipeline loads the batches where Gluon can use it
        (else Gluon's ``RuntimeError``), and options it cannot honour raise ``ValueError``.
        Under MXNet 1.x, ``True`` raises ``ValueError``: 1.x has no C++ pipeline.
    seed : int, optional
        Makes the batch order a pure function of ``(seed, epoch)``. Before every sample is
        loaded, ``random`` and ``numpy.random`` are seeded from ``(seed, epoch, sample
        index)``, and MXNet's RNG once per batch from ``(seed, epoch, batch)`` (reseeding
        MXNet costs about a millisecond, paid only by a batch that draws from MXNet), so
        random augmentation is reproducible for any ``num_workers`` and pool type.
    mxnet_seed : {'batch', 'sample'}, default 'batch'
        With ``seed``: reseed MXNet's RNG once per batch, or before every sample as well
        (then a sample's MXNet draws do not depend on its batch, at about 1 ms per sample
        that draws from MXNet).
    num_shards : int, default 0
        Group every ``num_shards`` batches into one step (a list of batches, one per shard).
    num_parts : int, default 1
        Split every epoch into this many disjoint parts (one per machine in distributed
        training: ``num_parts=kv.num_workers``).
    part_index : int, default 0
        The part this loader reads (``part_index=kv.rank``).
    even_size : bool, default False
        Give every part the same number of samples (see ``PartitionSampler``).
    worker_init_fn : callable, optional
        Called as ``worker_init_fn(worker_id)`` in each worker, after seeding.
    start_method : {'fork', 'forkserver', 'spawn'}, default 'fork' on Linux
        How worker processes start.
    ctx : Context or list of Context, optional
        Place each batch on ``ctx``, or shard ``i`` of each step on ``ctx[i]``, on a
        background thread, so the step the user receives is already on its devices.
    device : Device or list of Device, optional
        MXNet 2.x's name for ``ctx``; give one of the two.
    on_worker_death : {'raise', 'restart'}, default 'raise'
        When a worker process dies: raise ``shardloader.WorkerDiedError``, or start a
        new worker, re-send its lost batches and finish the epoch with nothing lost.
    fuse_transforms : bool, default True
        Run a ``dataset.transform_first(Compose([...]))`` chain of Gluon's image transforms
        over an image dataset on the fused path: the workers decode the JPEGs with
        libjpeg-turbo, crop, resize and flip them, and normalise them into the batch, giving
        Gluon's batches within one uint8 level (docs/vision.md; needs the
        ``vision`` extra: simplejpeg and opencv-python-headless).
        ``stats()["image_path"]`` says which path ran and why. ``False`` runs the
        transforms as they are.

    Examples
    --------
    >>> import numpy as np
    >>> from mxnet.gluon.data import ArrayDataset
    >>> data = ArrayDataset(np.arange(10, dtype="float32"), np.arange(10) % 2)
    >>> loader = ShardedDataLoader(data, batch_size=4, last_batch="discard")
    >>> [x.asnumpy().tolist() for x, y in loader]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    """

    @check_keywords
    @gluon_positional_order
    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = None,
        shuffle: bool = False,
        sampler: Any = None,
        last_batch: Optional[str] = None,
        batch_sampler: Any = None,
        batchify_fn: Optional[Callable] = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        pin_device_id: int = 0,
        prefetch: Optional[int] = None,
        thread_pool: bool = False,
        timeout: Optional[float] = 120,
        auto_reload: bool = False,
        try_nopython: Optional[bool] = None,
        *,
        seed: Optional[int] = None,
        mxnet_seed: str = "batch",
        num_shards: int = 0,
        num_parts: int = 1,
        part_index: int = 0,
        even_size: bool = False,
        worker_init_fn: Optional[Callable] = None,
        start_method: Optional[str] = None,
        ctx: Any = None,
        device: Any = None,
        on_worker_death: str = "raise",
        fuse_transforms: bool = True,
    ) -> None:
        # Every argument but the dataset, checked where the options are made: this
        # signature is their one public spelling, LoaderOptions their defaults and checks
        # (a test holds the two to each other).
        self._opts = _options.LoaderOptions.from_arguments(locals())
        self._length = _options.check_dataset(dataset)
        self._given: Dict[str, Any] = {"dataset": dataset, "batchify_fn": batchify_fn}
        self._cpp_args = (sampler, batch_sampler, start_method)
        self._stats = Stats()
        self._batch_sampler = build_batch_sampler(self._opts, self._length, sampler, batch_sampler)
        if isinstance(self._batch_sampler, Sampler):
            self._batch_sampler.watch_repeats(self._stats)  # repeats to fill a step: stats()
        _interrupts.install()
        self._closed = False
        self._build()
        self._next_epoch = 0
        self._resume: Optional[Dict[str, Any]] = None
        # The epoch being consumed (the last one iter() handed out): for state_dict().
        self._current = Position(0, 0, _checkpoint.sampler_state(self._batch_sampler))
        self._prestarted: Optional[ConsumerStage] = None
        self._open: weakref.WeakSet[ConsumerStage] = weakref.WeakSet()
        if self._opts.auto_reload:
            self._prestarted = self._start_epoch()

    def _build(self) -> None:
        """Put the data path together from the options, the dataset and the batchify
        function (again when a subclass assigns one of Gluon's attributes)."""
        opts, dataset = self._opts, self._given["dataset"]
        from .vision.recognise import fuse_for_loader  # below the loader, imported when used

        fusion, self._stats.image_path = fuse_for_loader(
            dataset,
            self._given["batchify_fn"],
            fuse_transforms=opts.fuse_transforms,
            try_nopython=opts.try_nopython,
        )
        if fusion is not None:
            dataset = fusion.dataset
        # Gluon's record datasets share one file handle: one per thread instead, for thread
        # workers and for inline loaders that several threads iterate.
        if opts.num_workers == 0:
            dataset = inline_safe(dataset)
        elif opts.thread_pool:
            dataset = thread_safe(dataset)
        cpp = self._set_batchify(self._given["batchify_fn"], *self._cpp_args)
        if fusion is not None:
            self._batch_fn = fusion.batchify_fn
        built: Optional[Pipeline] = self.__dict__.get("_pipeline")  # None the first time
        if built is not None:
            built.close()
        on_device = fusion.on_device if fusion is not None else None
        self._pipeline = Pipeline(
            opts, dataset, self._length, self._batch_fn, self._stats, cpp, on_device
        )
        check_shards_fit(self._pipeline.ctx, opts.num_shards, self._batch_sampler, opts.ctx_name)

    def _set_batchify(self, batchify_fn, sampler, batch_sampler, start_method):
        """Sets what the workers run (``_batch_fn``); returns MXNet 2.x's C++ pipeline where
        ``try_nopython=True`` asks for it and Gluon can use it, else None."""
        if batchify_fn is None:
            batchify_fn = _batchify.loader_default()
            self._given["batchify_fn"] = batchify_fn
        # What the workers run: Gluon's own batchify functions swapped for ours.
        self._batch_fn = _batchify.gluon_equivalent(batchify_fn)
        return cpp_pipeline(
            self._opts,
            self._given["dataset"],
            sampler,
            batch_sampler,
            batchify_fn,
            start_method,
            default_batchify=isinstance(batchify_fn, _batchify._FieldStack),
        )

    # ------------------------------------------------------------------ epochs
    def _start_epoch(self) -> ConsumerStage:
        if self._closed:
            raise ClosedIteratorError("Trying to iterate a closed ShardedDataLoader")
        epoch, skip, sampler_state, resume = self._next_epoch, 0, None, self._resume
        if resume is not None:
            epoch, skip = resume["epoch"], resume["consumed"]
            sampler_state = resume["sampler"]
            self._resume = None
        self._next_epoch = epoch + 1
        bs = self._batch_sampler
        if sampler_state is not None and hasattr(bs, "load_state_dict"):
            bs.load_state_dict(sampler_state)
        if hasattr(bs, "set_epoch"):
            bs.set_epoch(epoch)
        position = _position(epoch, skip, _checkpoint.sampler_state(bs), resume)
        length = functools.partial(len, bs)
        if isinstance(position, _SharePosition):
            # This machine's share of a job's epoch (docs/distributed.md, "Resuming on another
            # number of machines"); the epochs after it are this loader's own.
            assert resume is not None  # a share position comes only from a resume
            share = resume["share"]
            items = itertools.islice(enumerate(share), skip, None)
            length = functools.partial(len, share)
            bs.set_epoch(epoch + 1)
        else:
            # Begun now: a batch sampler reads its epoch when first advanced, and another
            # iter() may set the next epoch on it before this one is (invariant 5).
            items = itertools.islice(_begun(enumerate(bs)), skip, None)
        then = None
        if self._opts.auto_reload:
            then = functools.partial(_refresh, weakref.ref(self))
        it = self._pipeline.open(
            items,
            position,
            end_state=functools.partial(_checkpoint.sampler_state, bs),
            length=length,
            then=then,
        )
        self._open.add(it)
        return it

    def __iter__(self) -> Iterator[Any]:
        it, self._prestarted = self._prestarted, None
        if it is None:
            it = self._start_epoch()
        self._current = it.position
        return it

    def refresh(self) -> None:
        """Start loading the next epoch now (Gluon 1.9.1's name); ``iter()`` then uses it."""
        if self._prestarted is None:
            self._prestarted = self._start_epoch()

    def clean(self) -> None:
        """Drop an epoch started by ``refresh()`` or ``auto_reload`` (Gluon 1.9.1's name)."""
        if self._prestarted is not None:
            self._prestarted.close()
            self._next_epoch = self._prestarted.epoch  # the dropped epoch was never handed out
            self._prestarted = None

    def __len__(self) -> int:
        return len(self._batch_sampler)

    @property
    def batch_size(self) -> Optional[int]:
        """Samples per batch (per shard with ``num_shards``); None with a ``batch_sampler``."""
        return self._opts.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run epoch ``epoch`` (later ones follow from it).

        An epoch already started ahead of ``iter()`` (by ``auto_reload`` or ``refresh()``)
        for another epoch number is dropped, and epoch ``epoch`` is started in its place.
        """
        epoch = check_int("epoch", epoch)
        ahead = self._prestarted
        prestarted = ahead is not None
        if ahead is not None and ahead.epoch != epoch:
            self.clean()
        self._next_epoch = epoch
        current = self._current
        between_epochs = current.ended or (
            current.consumed == 0 and all(it.position is not current for it in list(self._open))
        )
        if self._resume is None and between_epochs:
            # A checkpoint taken now starts where the next iter() will: at epoch ``epoch``,
            # with the batch sampler's state at its start (as _start_epoch reads it).
            bs = self._batch_sampler
            if hasattr(bs, "set_epoch"):
                bs.set_epoch(epoch)
            self._current = Position(epoch, 0, _checkpoint.sampler_state(bs))
        if prestarted and self._prestarted is None:
            self.refresh()

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> Dict[str, Any]:
        """Where the current epoch stands, as a small JSON-serialisable dict.

        Batches already prefetched but not handed to the user are not counted.
        """
        self._refuse_with_cpp("state_dict()")
        where = self._current.checkpoint()
        state = {
            "version": _checkpoint.STATE_VERSION,
            "epoch": where["epoch"],
            "consumed": where["consumed"],
            "sampler": where["sampler"],
            "seed": self._opts.seed,
            "dataset_len": self._length,
            "batch_size": self._opts.batch_size,
            "sampler_type": type(self._batch_sampler).__name__,
        }
        if isinstance(self._current, _SharePosition) and not self._current.ended:
            state["resumed_from"] = copy.deepcopy(self._current.job)
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Make the next ``iter()`` yield exactly the batches that remained in ``state``'s
        epoch, then continue with the following epochs as an uninterrupted run would.

        ``state`` may also be a job state (``shardloader.distributed.merge_states``): a
        loader with the job's number of parts loads its own part's state from it, and one
        with another number of parts yields its share of the batches that no machine of the
        job had consumed, then this loader's own epochs (docs/distributed.md, "Resuming on
        another number of machines"). A single machine's state of a job on one machine is
        such a job state too.

        Raises
        ------
        ValueError
            If ``state`` is not a state from ``state_dict()`` of a loader built like this one:
            a field missing, of the wrong type or out of range (``consumed`` beyond the
            batches of its epoch, say), or another dataset length, ``batch_size``, ``seed``
            or batch sampler. The message names the field. Every field is checked before
            anything changes, so a refused state leaves the loader as it was. Also if
            ``state`` is one machine's state of a job on another number of machines (merge
            them all first), or a job state this loader cannot share exactly: with
            ``rollover``, or a sampler that is not one of ``shardloader.sampler``'s.
        """
        self._refuse_with_cpp("load_state_dict()")
        resume = _checkpoint.check_state(
            state, self.state_dict(), self._batch_sampler, self._length
        )
        if self._prestarted is not None:
            self._prestarted.close()
            self._prestarted = None
        self._resume = resume
        self._current = _position(resume["epoch"], resume["consumed"], resume["sampler"], resume)
        self._next_epoch = resume["epoch"]

    def _refuse_with_cpp(self, what: str) -> None:
        if self._pipeline.cpp is not None:
            raise RuntimeError(
                f"{what} needs shardloader's own pipeline: with try_nopython=True this loader's "
                "batches come from MXNet's C++ pipeline, whose order shardloader can neither "
                "record nor replay; use try_nopython=None to checkpoint mid-epoch"
            )

    # ------------------------------------------------------------------ stats & lifecycle
    def stats(self) -> Dict[str, Any]:
        """Batches and bytes delivered, time the consumer waited for data and its share of
        wall-clock time (``data_stall``), per-worker busy time, the reorder depth, and
        ``repeated_samples``: how many samples the batch sampler repeated to give a last step
        ``num_shards`` shards (or, with ``FixedBucketSampler(last_group='pad')``, to pad it),
        counted as the step is sent to be loaded.

        Returns
        -------
        dict
            The keys ``batches``, ``bytes``, ``wait_s``, ``wall_s``, ``data_stall``,
            ``first_batch_s``, ``worker_busy_s``, ``reorder_depth``, ``max_reorder_depth``,
            ``repeated_samples`` and ``image_path`` (which path images take: ``'fused'``,
            ``'exact'`` or ``'exact: <why>'``, docs/vision.md); the API reference's table
            "What stats() returns" says what each one means.
        """
        return self._stats.snapshot()

    def reset_stats(self) -> None:
        """Zero every counter of ``stats()``; the wall-clock time restarts at the next batch
        asked for. Useful to measure one phase of training (after a warm-up epoch, say)."""
        self._stats.reset()

    def close(self) -> None:
        """Stop every open epoch and the workers, and release all shared memory.
        Idempotent; iterating afterwards raises ``ClosedIteratorError``."""
        self._closed = True
        for it in list(self._open):
            it.close()
        self._prestarted = None
        self._pipeline.close()

    def __enter__(self) -> ShardedDataLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Gluon's DataLoader attributes, which its subclasses and tools built on it (gluoncv,
    # gluon-nlp) read and assign: the same names, with Gluon's meaning. Assigning one takes
    # effect from the next epoch, as in Gluon (the data path is rebuilt with it), and is
    # refused while an epoch is open. ``_worker_pool`` is None because there is no
    # multiprocessing.Pool to terminate (Gluon's ``__del__`` terminates one a subclass sets).
    _worker_pool = None

    def _reconfigure(self, name: str, **changes: Any) -> None:
        """Apply an assignment to one of Gluon's attributes, refusing it mid-epoch."""
        if self._prestarted is not None or any(not it.ended for it in self._open):
            raise RuntimeError(
                f"cannot assign {name} while an epoch of this loader is open or started "
                "ahead (auto_reload/refresh); close it (or call clean()) first"
            )
        given: Dict[str, Any] = {k: changes[k] for k in ("dataset", "batchify_fn") if k in changes}
        changes.pop("dataset", None)
        if given.get("batchify_fn", True) is None:
            raise TypeError("_batchify_fn must be a callable, got None")
        length = _options.check_dataset(given["dataset"]) if "dataset" in given else None
        # A copy is made (and checked) like the original: a combination the constructor
        # refuses is refused here too, and leaves the loader as it was.
        self._opts = dataclasses.replace(self._opts, **changes)
        if length is not None:
            self._length = length
        self._given.update(given)
        self._build()

    def _set_num_workers(self, value: Any) -> None:
        workers, opts = check_int("_num_workers", value), self._opts
        # A default prefetch (2 * num_workers) follows the new count, as it would in Gluon.
        default = opts.prefetch == 2 * opts.num_workers
        prefetch = 2 * workers if default else opts.prefetch
        self._reconfigure("_num_workers", num_workers=workers, prefetch=prefetch)

    _num_workers = property(lambda self: self._opts.num_workers, _set_num_workers)
    _pin_memory = property(
        lambda self: self._opts.pin_memory,
        lambda self, v: self._reconfigure("_pin_memory", pin_memory=check_bool("_pin_memory", v)),
    )
    _pin_device_id = property(
        lambda self: self._opts.pin_device_id,
        lambda self, v: self._reconfigure(
            "_pin_device_id", pin_device_id=check_int("_pin_device_id", v)
        ),
    )
    _thread_pool = property(
        lambda self: self._opts.thread_pool,
        lambda self, v: self._reconfigure(
            "_thread_pool", thread_pool=check_bool("_thread_pool", v)
        ),
    )
    _timeout = property(
        lambda self: self._opts.timeout,
        lambda self, v: self._reconfigure("_timeout", timeout=v),
    )
    _prefetch = property(
        lambda self: self._opts.prefetch,
        lambda self, v: self._reconfigure("_prefetch", prefetch=check_int("_prefetch", v)),
    )
    _dataset = property(
        lambda self: self._given["dataset"],
        lambda self, v: self._reconfigure("_dataset", dataset=v),
    )
    _batchify_fn = property(
        lambda self: self._given["batchify_fn"],
        lambda self, v: self._reconfigure("_batchify_fn", batchify_fn=v),
    )
    auto_reload = property(
        lambda self: self._opts.auto_reload,
        lambda self, v: self._reconfigure("auto_reload", auto_reload=check_bool("auto_reload", v)),
    )

    @property
    def _iter(self) -> Optional[ConsumerStage]:
        """The epoch started ahead of ``iter()``; assigning None drops it (``clean()``)."""
        return self._prestarted

    @_iter.setter
    def _iter(self, value: Any) -> None:
        if value is not None:
            raise TypeError(
                "_iter can only be set to None (which drops the epoch started ahead, as "
                f"clean() does), got {type(value).__name__}"
            )
        self.clean()

    # MXNet 2.x's: Gluon's C++ pipeline where try_nopython=True uses it, else None.
    _mx_iter = property(lambda self: self._pipeline.cpp)

    def worker_pids(self) -> List[int]:
        """PIDs of the live worker processes (empty for inline or thread workers)."""
        return self._pipeline.worker_pids()


class _SharePosition(Position):
    """The position of a share of a job's epoch, with the job state (``resumed_from``)."""

    __slots__ = ("job",)
    job: Dict[str, Any]


def _position(epoch: int, consumed: int, start_state: Any, resume: Any) -> Position:
    """The ``Position`` of an epoch; a ``_SharePosition`` if ``resume`` (what
    ``_checkpoint.check_state`` returned, or None) is a share of a job's epoch."""
    if resume is None or "share" not in resume:
        return Position(epoch, consumed, start_state)
    position = _SharePosition(epoch, consumed, start_state)
    position.job = resume["job"]
    return position


def _refresh(loader_ref: Callable[[], Optional[ShardedDataLoader]]) -> None:
    """``auto_reload``: start the next epoch when one ends, unless the loader is gone or
    closed (held weakly, so an epoch never keeps its loader alive)."""
    loader = loader_ref()
    if loader is not None and not loader._closed:
        loader.refresh()


def _begun(items: Iterator[Any]) -> Iterable[Any]:
    """``items`` with its first item already drawn (an error drawing it is raised when the
    epoch reaches it)."""
    try:
        first = next(items)
    except StopIteration:
        return iter(())
    except Exception as exc:  # noqa: BLE001 - the user's sampler: raised in order, later
        return _raising(exc)
    return itertools.chain((first,), items)


def _raising(exc: BaseException) -> Iterator[Any]:
    raise exc
    yield  # a generator: the error is raised when it is first advanced


DataLoader = ShardedDataLoader
