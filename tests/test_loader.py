"""The Gluon contract: same arguments, same batches, same order, for every backend."""

from __future__ import annotations

import collections
import time

import mxnet as mx
import numpy as np
import pytest
from _backends import backends
from _datasets import RangeDataset, ReverseSlowDataset, VarLenDataset
from conftest import ARRAY_TYPE, ARRAYS, requires_mx1, where
from mxnet.gluon.data import ArrayDataset, SimpleDataset
from mxnet.gluon.data import DataLoader as GluonDataLoader

from shardloader import ShardedDataLoader, batchify
from shardloader.sampler import SequentialSampler

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_leaks")]

BACKENDS = backends("inline", "thread", "fork")


@pytest.fixture(params=list(BACKENDS))
def backend(request):
    return BACKENDS[request.param]


def as_lists(batch):
    """A comparable form of a batch: nested lists of (dtype, shape, values)."""
    if isinstance(batch, (list, tuple)):
        return [as_lists(b) for b in batch]
    if isinstance(batch, mx.nd.NDArray):
        return ("nd", str(batch.dtype), batch.shape, batch.asnumpy().tolist())
    if isinstance(batch, np.ndarray):
        return ("np", str(batch.dtype), batch.shape, batch.tolist())
    return batch


def collect(loader):
    return [as_lists(b) for b in loader]


def gluon(dataset, **kwargs):
    return collect(GluonDataLoader(dataset, **kwargs))


DATASETS = {
    "numpy-tuple": lambda: ArrayDataset(
        np.arange(23 * 3, dtype="float32").reshape(23, 3), np.arange(23)
    ),
    # MXNet arrays of the default type (mx.np under 2.x, whose Stack refuses legacy mx.nd).
    "nd-samples": lambda: ArrayDataset(ARRAYS.arange(23 * 2).reshape(23, 2)),
    # Gluon 1.x stacks list samples; 2.x's Stack splits them into fields, as tuples.
    "list-samples": lambda: SimpleDataset([[i, i * 0.5] for i in range(23)]),
    "python-numbers": lambda: SimpleDataset([float(i) / 3 for i in range(23)]),
    # Binary formats (FITS, network byte order) hand out big-endian arrays: their batches
    # are native, with the same values.
    "big-endian": lambda: ArrayDataset(
        np.arange(23 * 3, dtype=">f4").reshape(23, 3) / 7, np.arange(23, dtype=">i8")
    ),
    "int-tuples": lambda: SimpleDataset([(i, i * 2) for i in range(23)]),
    "nested": lambda: SimpleDataset(
        [(np.ones(2, "float32") * i, (i, np.float64(i))) for i in range(23)]
    ),
}


@pytest.mark.parametrize("name", list(DATASETS))
@pytest.mark.parametrize("last_batch", [None, "keep", "discard", "rollover"])
def test_same_batches_as_gluon(backend, name, last_batch):
    dataset = DATASETS[name]()
    kwargs = dict(batch_size=5, last_batch=last_batch)
    expected = gluon(dataset, **kwargs)
    with ShardedDataLoader(dataset, **kwargs, **backend) as loader:
        assert len(loader) == len(GluonDataLoader(dataset, **kwargs))
        assert collect(loader) == expected


def test_rollover_carries_into_next_epoch(backend):
    dataset = RangeDataset(10)
    ours = ShardedDataLoader(dataset, batch_size=4, last_batch="rollover", **backend)
    theirs = GluonDataLoader(dataset, batch_size=4, last_batch="rollover")
    with ours:
        for _ in range(3):
            assert len(ours) == len(theirs)
            assert collect(ours) == collect(theirs)


def test_many_epochs_reuse_one_pool(backend):
    with ShardedDataLoader(RangeDataset(12), batch_size=4, **backend) as loader:
        pids = None
        for _ in range(20):
            batches = list(loader)
            assert [b[1].asnumpy().tolist() for b in batches] == [
                [0, 1, 2, 3],
                [4, 5, 6, 7],
                [8, 9, 10, 11],
            ]
            if pids is None:
                pids = loader.worker_pids()
            assert loader.worker_pids() == pids


def test_order_holds_when_later_batches_finish_first(backend):
    dataset = ReverseSlowDataset(40)
    with ShardedDataLoader(dataset, batch_size=2, prefetch=8, **backend) as loader:
        labels = [int(x) for _, y in loader for x in y.asnumpy()]
    assert labels == list(range(40))


# Spawn workers give Gluon's batches (an ArrayDataset, a ragged last batch, two epochs): the
# spawn case of tests/test_mx2_smoke.py's test_same_batches_as_gluons_python_pipeline, which
# runs under both MXNets (each spawned worker spends seconds importing MXNet).


def test_transform_and_transform_first(backend):
    base = ArrayDataset(np.arange(12, dtype="float32"), np.arange(12))
    for ds in (base.transform_first(lambda x: x * 2), base.transform(lambda x, y: (x + y, y))):
        expected = gluon(ds, batch_size=4)
        with ShardedDataLoader(ds, batch_size=4, **backend) as loader:
            assert collect(loader) == expected


def _sum_batchify(samples):
    return mx.nd.array([sum(float(s[0].sum()) for s in samples)])


def test_custom_batchify_fn(backend):
    ds = RangeDataset(10)
    with ShardedDataLoader(ds, batch_size=5, batchify_fn=_sum_batchify, **backend) as loader:
        assert [b.asnumpy().tolist() for b in loader] == [[40.0], [140.0]]


def test_gluon_nlp_style_batchify(backend):
    ds = VarLenDataset(14)
    fn = batchify.Tuple(batchify.Pad(pad_val=-1), batchify.Stack())
    expected = [as_lists(fn([ds[i] for i in range(j, min(j + 4, 14))])) for j in range(0, 14, 4)]
    with ShardedDataLoader(ds, batch_size=4, batchify_fn=fn, **backend) as loader:
        assert collect(loader) == expected


def test_sharded_steps_from_a_batch_sampler(backend):
    steps = [[[0, 1], [2, 3, 4]], [[5], [6, 7]], [[8, 9], [10, 11]]]
    ds = RangeDataset(12)
    with ShardedDataLoader(ds, batch_sampler=steps, **backend) as loader:
        out = [[shard[1].asnumpy().tolist() for shard in step] for step in loader]
    assert out == [[[0, 1], [2, 3, 4]], [[5], [6, 7]], [[8, 9], [10, 11]]]


def test_prefetch_bounds_work_in_flight():
    ds = RangeDataset(100)
    for prefetch in (0, 1, 3):
        with ShardedDataLoader(ds, batch_size=1, num_workers=2, prefetch=prefetch) as loader:
            it = iter(loader)
            time.sleep(0.3)
            # Nothing consumed yet: only `prefetch` batches may have been dispatched.
            assert it._source.in_flight == prefetch
            next(it)
            assert it._source.in_flight <= max(prefetch, 1)


def test_pin_memory_returns_pinned_ndarrays(backend):
    ds = RangeDataset(8)
    with ShardedDataLoader(ds, batch_size=4, pin_memory=True, pin_device_id=0, **backend) as loader:
        batches = list(loader)
    assert len(batches) == 2
    for data, label in batches:
        assert where(data) == mx.cpu_pinned(0)
        assert where(label) == mx.cpu_pinned(0)
    assert batches[1][1].asnumpy().tolist() == [4, 5, 6, 7]


def test_numpy_and_ndarray_datasets_directly():
    for ds in (np.arange(10, dtype="float32"), ARRAYS.arange(10)):
        expected = gluon(ds, batch_size=4)
        with ShardedDataLoader(ds, batch_size=4) as loader:
            assert collect(loader) == expected


def test_sampler_argument():
    ds = RangeDataset(9)
    with ShardedDataLoader(ds, batch_size=3, sampler=SequentialSampler(6, start=3)) as loader:
        assert [y.asnumpy().tolist() for _, y in loader] == [[3, 4, 5], [6, 7, 8]]


def test_auto_reload_prestarts_the_next_epoch():
    ds = RangeDataset(8)
    with ShardedDataLoader(ds, batch_size=4, num_workers=1, auto_reload=True) as loader:
        assert loader._prestarted is not None  # loading began at construction
        for _ in range(3):
            assert len(list(loader)) == 2
            assert loader._prestarted is not None


def test_gluon_refresh_and_clean():
    ds = RangeDataset(8)
    with ShardedDataLoader(ds, batch_size=4, num_workers=1) as loader:
        loader.refresh()  # loading starts now
        assert loader._prestarted is not None
        assert len(list(loader)) == 2
        loader.refresh()
        loader.clean()  # dropped: the next iter() starts that epoch afresh
        assert loader._prestarted is None
        assert [y.asnumpy().tolist() for _, y in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


GLUON_ERRORS = [
    (dict(), ValueError, "batch_size must be specified"),
    (
        dict(batch_size=2, shuffle=True, sampler=SequentialSampler(4)),
        ValueError,
        "shuffle must not be specified",
    ),
    (dict(batch_sampler=[[0]], batch_size=2), ValueError, "must not be specified if batch_sampler"),
    (dict(batch_sampler=[[0]], last_batch="keep"), ValueError, "batch_sampler"),
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(batch_size=2.5), TypeError, "batch_size"),
    (dict(batch_size=2, last_batch="drop"), ValueError, "last_batch"),
    (dict(batch_size=2, prefetch=-1), ValueError, "prefetch"),
    (dict(batch_size=2, timeout=-1), ValueError, "timeout"),
    (dict(batch_size=2, num_workers=-2), ValueError, "num_workers"),
    (dict(batch_size=2, try_nopython="yes"), TypeError, "try_nopython"),
    (dict(batch_size=2, start_method="telepathy"), ValueError, "start_method"),
    (dict(batch_size=2, on_worker_death="ignore"), ValueError, "on_worker_death"),
    (dict(batch_size=2, batchify_fn=3), TypeError, "batchify_fn"),
    (dict(batch_size=2, num_parts=2, part_index=2), ValueError, r"part_index must be in \[0, "),
    (dict(batch_size=2, num_parts=2, shuffle=True), ValueError, "shuffle=True needs seed=<int>"),
]


@pytest.mark.parametrize("kwargs,exc,text", GLUON_ERRORS)
def test_argument_errors_name_the_argument(kwargs, exc, text):
    with pytest.raises(exc, match=text):
        ShardedDataLoader(RangeDataset(4), **kwargs)


@requires_mx1("try_nopython=True: 2.x has a C++ pipeline (see test_mx2_smoke.py)")
def test_try_nopython_true_says_this_mxnet_has_no_cpp_pipeline():
    with pytest.raises(ValueError, match=f"try_nopython=True .* MXNet {mx.__version__} does not"):
        ShardedDataLoader(RangeDataset(4), batch_size=2, try_nopython=True)


def test_bad_datasets_are_rejected_at_construction():
    with pytest.raises(TypeError, match="__len__"):
        ShardedDataLoader(object(), batch_size=2)


# ------------------------------------------------------------------ an empty dataset


@pytest.mark.parametrize("last_batch", [None, "keep", "discard", "rollover"])
def test_an_empty_dataset_has_no_batches_as_in_gluon(backend, last_batch):
    dataset = SimpleDataset([])
    for shuffle in (False, True):
        kwargs = dict(batch_size=3, last_batch=last_batch, shuffle=shuffle)
        theirs = GluonDataLoader(dataset, **kwargs)
        assert (len(theirs), list(theirs)) == (0, [])
        with ShardedDataLoader(dataset, **kwargs, seed=1, **backend) as loader:
            assert len(loader) == 0
            assert [list(loader) for _ in range(3)] == [[], [], []]
            assert loader.worker_pids() == []  # nothing to load, so no worker was started
            assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (3, 0)


@pytest.mark.parametrize(
    "extra",
    [
        dict(auto_reload=True),
        dict(pin_memory=True),
        dict(ctx="cpu1"),
        dict(num_shards=2, ctx="cpu0,cpu1"),
        dict(num_parts=2, part_index=1, shuffle=True, seed=3),
        dict(batch_sampler=[]),
    ],
    ids=["auto_reload", "pin_memory", "ctx", "shards", "parts", "batch_sampler"],
)
def test_an_empty_dataset_has_no_batches_with_any_option(extra):
    contexts = {"cpu1": mx.cpu(1), "cpu0,cpu1": [mx.cpu(0), mx.cpu(1)]}
    if "ctx" in extra:
        extra = dict(extra, ctx=contexts[extra["ctx"]])
    if "batch_sampler" not in extra:
        extra = dict(extra, batch_size=2)
    with ShardedDataLoader(np.zeros((0, 3), "float32"), num_workers=2, **extra) as loader:
        assert len(loader) == 0
        assert [list(loader) for _ in range(2)] == [[], []]
        assert loader.worker_pids() == []


def test_an_index_into_an_empty_dataset_is_still_an_index_error():
    with ShardedDataLoader([], batch_sampler=[[0]], num_workers=2) as loader:
        with pytest.raises(IndexError, match=r"index 0 .* outside the dataset's range \[0, 0\)"):
            list(loader)
        assert loader.worker_pids() == []


# ------------------------------------------------------------ batch containers, as in Gluon

Pair = collections.namedtuple("Pair", "data label")


def _tuple_batch(samples):
    return (mx.nd.array([s[1] for s in samples]), np.array([s[1] for s in samples]))


def _list_batch(samples):
    labels = [s[1] for s in samples]
    return [mx.nd.array(labels), (mx.nd.array(labels) * 2, len(labels)), [mx.nd.array(labels)]]


def _dict_batch(samples):
    labels = [s[1] for s in samples]
    return {"label": mx.nd.array(labels), "pair": (mx.nd.array(labels), "tag")}


def _namedtuple_batch(samples):
    labels = [s[1] for s in samples]
    return Pair(mx.nd.array(labels), (mx.nd.array(labels),))


BATCHIFY = {
    "default": None,
    "tuple": _tuple_batch,
    "list": _list_batch,
    "dict": _dict_batch,
    "namedtuple": _namedtuple_batch,
}


def structure(batch):
    """The containers of a batch, with its values: what code that indexes it relies on."""
    if isinstance(batch, dict):
        return (type(batch).__name__, {k: structure(v) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, [structure(b) for b in batch])
    return as_lists(batch)


def contexts(batch):
    if isinstance(batch, dict):
        return contexts(list(batch.values()))
    if isinstance(batch, (list, tuple)):
        return {c for b in batch for c in contexts(b)}
    return {where(batch)} if isinstance(batch, mx.nd.NDArray) else set()


@pytest.mark.parametrize("pin_memory", [False, True], ids=["plain", "pin_memory"])
def test_batches_have_gluons_containers(backend, pin_memory):
    """Gluon's pin_memory rebuilds tuples (namedtuples too) as lists, at any depth, so code
    such as ``batch[0] = batch[0].as_in_context(ctx)`` works; without it the batch is what
    batchify_fn returned."""
    dataset = RangeDataset(7)
    for name, fn in BATCHIFY.items():
        kwargs = dict(batch_size=3, batchify_fn=fn, pin_memory=pin_memory)
        expected = [structure(b) for b in GluonDataLoader(dataset, **kwargs)]
        with ShardedDataLoader(dataset, **kwargs, **backend) as loader:
            batches = list(loader)
        assert [structure(b) for b in batches] == expected, name
        if pin_memory:
            # Gluon leaves a dict batch in place; here its NDArrays are pinned too.
            assert all(contexts(b) == {mx.cpu_pinned(0)} for b in batches), name
            first = batches[0]
            if isinstance(first, list):
                first[0] = first[0].as_in_context(mx.cpu(0))  # what broke on a tuple


def test_ctx_keeps_the_containers_of_batchify_fn(backend):
    """``ctx`` is shardloader's own: it moves the arrays and keeps the batch as batchify_fn
    made it (namedtuples too), which is what Gluon returns without pin_memory."""
    dataset = RangeDataset(7)
    for name, fn in BATCHIFY.items():
        kwargs = dict(batch_size=3, batchify_fn=fn)
        expected = [structure(b) for b in GluonDataLoader(dataset, **kwargs)]
        with ShardedDataLoader(dataset, ctx=mx.cpu(1), **kwargs, **backend) as loader:
            batches = list(loader)
        assert [structure(b) for b in batches] == expected, name
        assert all(contexts(b) == {mx.cpu(1)} for b in batches), name


def test_sharded_steps_with_pin_memory_are_lists_of_lists():
    with ShardedDataLoader(RangeDataset(8), batch_size=2, num_shards=2, pin_memory=True) as loader:
        steps = list(loader)
    assert [structure(step)[0] for step in steps] == ["list"] * 2
    assert all(type(shard) is list and type(shard[0]) is ARRAY_TYPE for s in steps for shard in s)
    assert steps[1][1][1].asnumpy().tolist() == [6, 7]


# ---------------------------------------------------- numpy subclasses through the workers


class _RecordDataset:
    """Sample i is (a record array with named fields, a masked array with nothing masked)."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        records = np.rec.fromarrays([np.arange(3) + i, np.arange(3) / 2], names="id,score")
        return records, np.ma.masked_array([i, i + 1.0], mask=[False, False])


class _MaskedDataset:
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return np.ma.masked_array([i, i + 1.0], mask=[False, i == 4])


def test_record_arrays_keep_their_field_names_and_masks_are_not_dropped(backend):
    with ShardedDataLoader(_RecordDataset(), batch_size=3, **backend) as loader:
        for records, values in loader:
            assert [r.dtype.names for r in records] == [("id", "score")] * 3
            assert isinstance(values, mx.nd.NDArray) and values.shape == (3, 2)
    with ShardedDataLoader(_MaskedDataset(), batch_size=3, **backend) as loader:
        it = iter(loader)
        assert next(it).asnumpy().tolist() == [[0, 1], [1, 2], [2, 3]]
        with pytest.raises(ValueError, match="sample 1 is a masked array with 1 masked value"):
            next(it)


def test_try_nopython_false_and_none_are_accepted():
    for value in (None, False):
        with ShardedDataLoader(RangeDataset(4), batch_size=2, try_nopython=value) as loader:
            assert len(list(loader)) == 2


def test_gluon_1x_positional_signature():
    # dataset, batch_size, shuffle, sampler, last_batch, batch_sampler, batchify_fn,
    # num_workers, pin_memory, pin_device_id, prefetch, thread_pool, timeout, auto_reload
    loader = ShardedDataLoader(
        RangeDataset(6), 3, False, None, "keep", None, None, 0, False, 0, None, False, 120, False
    )
    assert len(list(loader)) == 2
