"""The epoch's consumer path (docs/design.md, "The data path"), and the round-three defects
that lived in it: a batch sampler that raises mid-epoch, ``set_epoch`` against an epoch
started ahead, two iterators opened before either is advanced, two threads reading Gluon's
record datasets inline, ``break`` with ``ctx=``, Gluon subclasses that assign Gluon's
attributes, and the loader's argument checks (booleans, misspelled keywords)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import warnings

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon.data import RecordFileDataset

from shardloader import DataLoader, ShardedDataLoader
from tests._backends import BACKENDS, backends


def _values(loader_or_iter):
    return [b.asnumpy().tolist() for b in loader_or_iter]


class RaisingBatchSampler:
    """Yields ``good`` batches of 4, then raises (a user's sampler with a bug)."""

    def __init__(self, good: int) -> None:
        self.good = good

    def __iter__(self):
        for i in range(self.good):
            yield list(range(4 * i, 4 * i + 4))
        raise ValueError("sampler broke after its batches")

    def __len__(self) -> int:
        return self.good + 1


@pytest.mark.mx2_smoke
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["inline", "thread", "fork"])
def test_a_sampler_error_comes_after_the_batches_it_yielded(backend, no_leaks):
    data = np.arange(64, dtype="float32")
    loader = DataLoader(data, batch_sampler=RaisingBatchSampler(5), **BACKENDS[backend])
    for _ in range(3):  # and again: nothing stays mapped, the loader still works
        got = []
        with pytest.raises(ValueError, match="sampler broke"):
            for batch in loader:
                got.append(batch.asnumpy().tolist())
        assert got == [list(range(4 * i, 4 * i + 4)) for i in range(5)]
    del batch
    loader.close()


def _epoch_orders(**kwargs):
    data = np.arange(24, dtype="float32")
    with DataLoader(data, batch_size=4, shuffle=True, seed=7, **kwargs) as loader:
        return {e: (loader.set_epoch(e), _values(loader))[1] for e in (0, 1, 2, 10, 11)}


@pytest.mark.mx2_smoke
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["auto_reload", "refresh"])
def test_set_epoch_replaces_an_epoch_started_ahead(how, no_leaks):
    want = _epoch_orders()
    data = np.arange(24, dtype="float32")
    kwargs = dict(auto_reload=True) if how == "auto_reload" else {}
    with DataLoader(data, batch_size=4, shuffle=True, seed=7, num_workers=1, **kwargs) as loader:
        assert _values(loader) == want[0]
        if how == "refresh":
            loader.refresh()
        loader.set_epoch(10)
        it = iter(loader)
        assert loader.state_dict()["epoch"] == 10
        assert _values(it) == want[10]
        assert loader.state_dict()["epoch"] == 11
        assert _values(loader) == want[11]


@pytest.mark.mx2_smoke
@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefetch", [None, 0])
@pytest.mark.parametrize("backend", ["inline", "thread", "fork"])
def test_iterators_opened_together_get_their_own_epochs(backend, prefetch, no_leaks):
    want = _epoch_orders()
    data = np.arange(24, dtype="float32")
    with DataLoader(
        data, batch_size=4, shuffle=True, seed=7, prefetch=prefetch, **BACKENDS[backend]
    ) as loader:
        it0, it1 = iter(loader), iter(loader)
        assert (it0.epoch, it1.epoch) == (0, 1)
        second = _values(it1)
        first = _values(it0)
    assert first == want[0] and second == want[1]


@pytest.fixture(scope="module")
def numbered_records(tmp_path_factory):
    """A .rec of 200 records, record i holding 64 bytes of i's value."""
    folder = tmp_path_factory.mktemp("records")
    rec, idx = str(folder / "n.rec"), str(folder / "n.idx")
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    for i in range(200):
        writer.write_idx(i, bytes([i]) * 64)
    writer.close()
    return rec


class _Bytes:
    def __call__(self, samples):
        return [bytes(s) for s in samples]


class _Wrapper:
    """A dataset class shardloader does not know, holding a Gluon record dataset."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wrapped", [False, True], ids=["gluon", "in-an-unknown-class"])
def test_threads_reading_gluon_records_inline_get_their_own_records(numbered_records, wrapped):
    dataset = RecordFileDataset(numbered_records)
    if wrapped:  # no per-thread handles for it: its reads take turns instead
        dataset = _Wrapper(dataset)
    loader = DataLoader(dataset, batch_size=1, batchify_fn=_Bytes())
    wrong = []

    def read():
        for _ in range(10):
            for seq, (record,) in enumerate(loader):
                if record != bytes([seq]) * 64:
                    wrong.append((seq, record[:1]))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert not wrong, f"{len(wrong)} records held another record's bytes: {wrong[:5]}"


class _SlowAfter:
    """Fast for the first ``fast`` samples, then ``seconds`` each."""

    def __init__(self, fast: int, seconds: float) -> None:
        self.fast, self.seconds = fast, seconds

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i):
        if i >= self.fast:
            time.sleep(self.seconds)
        return np.float32(i)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["thread", "fork"])
def test_break_with_ctx_while_the_next_batch_is_slow_is_quick_and_silent(backend, no_leaks):
    # A slow batch takes 3 s (4 samples of 0.75 s): a break that waited for it would take
    # that long. (Thread workers cannot be stopped mid-sample: each finishes the slow batch
    # it holds before the leak check passes, so the batch is kept no slower than that.)
    loader = DataLoader(
        _SlowAfter(fast=4, seconds=0.75), batch_size=4, ctx=mx.cpu(0), **BACKENDS[backend]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "did not stop" RuntimeWarning fails the test
        for _batch in loader:
            started = time.monotonic()
            break
        took = time.monotonic() - started  # the epoch was dropped: its thread has stopped
        del _batch
        loader.close()
    assert took < 1.0, f"break took {took:.1f} s (the slow batch takes 3 s)"


# -- Gluon's attributes, assigned by subclasses written against Gluon's internals


class _EveryOther(ShardedDataLoader):
    """A subclass of our own that overrides only ``__iter__``."""

    def __iter__(self):
        for n, batch in enumerate(super().__iter__()):
            if n % 2 == 0:
                yield batch


def _double(samples):
    return mx.nd.array(np.stack(samples) * 2)


@pytest.mark.timeout(60)
def test_a_subclass_overriding_iter_and_assigning_gluons_attributes(no_leaks):
    data = np.arange(16, dtype="float32")
    loader = _EveryOther(data, batch_size=4, num_workers=0)
    assert _values(loader) == [[0, 1, 2, 3], [8, 9, 10, 11]]
    loader._batchify_fn = _double  # Gluon uses the new value: so must we
    loader._num_workers = 2
    loader._prefetch = 1
    loader._pin_device_id = 0
    assert loader._num_workers == 2 and loader._prefetch == 1 and loader._batchify_fn is _double
    assert _values(loader) == [[0, 2, 4, 6], [16, 18, 20, 22]]
    assert len(loader.worker_pids()) == 2  # really on two workers now
    loader._dataset = np.arange(100, 116, dtype="float32")
    assert _values(loader) == [[200, 202, 204, 206], [216, 218, 220, 222]]
    loader.close()


@pytest.mark.timeout(60)
def test_assigning_gluons_attributes_mid_epoch_is_refused_not_ignored(no_leaks):
    with DataLoader(np.arange(16, dtype="float32"), batch_size=4) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(RuntimeError, match="cannot assign _batchify_fn while an epoch"):
            loader._batchify_fn = _double
        with pytest.raises(TypeError, match="_num_workers must be a non-negative int"):
            loader._num_workers = "2"
        it.close()
        loader._batchify_fn = _double
        assert _values(loader)[0] == [0, 2, 4, 6]


_GLUONCV_PROGRAM = textwrap.dedent(
    """
    import mxnet as mx, numpy as np
    import shardloader
    # installed globally, before gluoncv imports it
    mx.gluon.data.DataLoader = mx.gluon.data.dataloader.DataLoader = shardloader.DataLoader
    from gluoncv.data.dataloader import RandomTransformDataLoader
    from mxnet.gluon.data import ArrayDataset

    data = ArrayDataset(np.arange(32, dtype="float32").reshape(16, 2), np.arange(16))
    def shift(x, y):  # module level: gluoncv's worker pool pickles it by name
        return x + 100, y

    add = [shift, shift]
    for workers in (0, 2):
        loader = RandomTransformDataLoader(add, data, batch_size=4, num_workers=workers)
        assert isinstance(loader, shardloader.DataLoader)
        batches = [(x.asnumpy(), y.asnumpy()) for x, y in loader]
        assert len(batches) == 4, len(batches)
        xs = np.concatenate([x for x, _ in batches])
        assert np.array_equal(xs, np.arange(32).reshape(16, 2) + 100), xs
        print("ok", workers)
    """
)


@pytest.mark.timeout(120)
def test_gluoncvs_random_transform_loader_over_shardloader():
    pytest.importorskip("gluoncv")
    run = subprocess.run(
        [sys.executable, "-c", _GLUONCV_PROGRAM], capture_output=True, text=True, timeout=100
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[:2] == ["ok 0", "ok 2"]


# -- argument checks


@pytest.mark.parametrize("name", ["shuffle", "pin_memory", "thread_pool", "auto_reload"])
@pytest.mark.parametrize("value", ["False", "no", 2, 0.0, None])
def test_boolean_arguments_refuse_non_booleans(name, value):
    with pytest.raises(TypeError, match=rf"^{name} must be a bool \(True or False; 0 and 1 also"):
        DataLoader(np.arange(8), batch_size=2, **{name: value})


@pytest.mark.parametrize("value", [1, 0, np.int64(1), np.bool_(True), np.bool_(False)])
def test_boolean_arguments_take_what_gluon_takes(value):
    """Gluon's DataLoader takes ``shuffle=1``; so does this one (and 0, numpy's bools)."""
    with DataLoader(np.arange(8), batch_size=2, shuffle=value, seed=3) as loader:
        got = [v for batch in _values(loader) for v in batch]
    assert sorted(got) == list(range(8))
    assert (got != list(range(8))) == bool(value)  # seed 3 shuffles 8 samples out of order


@pytest.mark.mx2_smoke
@pytest.mark.parametrize(
    "typo, meant", [("num_worker", "num_workers"), ("batchsize", "batch_size"), ("sed", "seed")]
)
def test_a_misspelled_keyword_gets_a_suggestion(typo, meant):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{typo}'; did you mean "):
        DataLoader(np.arange(8), batch_size=2, **{typo: 1})
    try:
        DataLoader(np.arange(8), batch_size=2, **{typo: 1})
    except TypeError as exc:
        assert f"did you mean '{meant}'?" in str(exc)


def test_an_unknown_keyword_lists_the_accepted_ones():
    with pytest.raises(TypeError, match="accepted keywords are: .*num_workers"):
        DataLoader(np.arange(8), batch_size=2, zzzzzz=1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", backends("inline", "fork"))
def test_closing_the_consumer_closes_the_whole_chain(backend, no_leaks):
    with DataLoader(
        np.arange(32, dtype="float32"), batch_size=4, ctx=mx.cpu(1), **BACKENDS[backend]
    ) as loader:
        it = iter(loader)
        next(it)
        it.close()
        assert it.closed and it.ended
        with pytest.raises(Exception, match="closed iterator"):
            next(it)
        assert len(_values(loader)) == 8
