"""LoaderDataIter (Module.fit over a loader) and the safe PrefetchingIter."""

import gc
import struct
import threading
import time
import traceback

import mxnet as mx
import numpy as np
import pytest
from _programs import run_program
from conftest import our_threads, requires_mx1
from mxnet.gluon.data import ArrayDataset, DataLoader

from shardloader._engine import timing
from shardloader._errors import ClosedIteratorError, LoaderTimeoutError
from shardloader.dataiter import LoaderDataIter, PrefetchingIter

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_thread_leak")]


def separable(n, seed, classes=3, dim=4):
    """A linearly separable problem: Gaussian blobs around well-spread class centres."""
    rng = np.random.RandomState(seed)
    centres = np.random.RandomState(123).randn(classes, dim) * 3
    y = rng.randint(0, classes, size=n)
    X = centres[y] + rng.randn(n, dim) * 0.5
    return X.astype(np.float32), y  # int64 labels: the adapter casts them to float32


def as_numpy(batch):
    return (
        [a.asnumpy() for a in batch.data],
        [a.asnumpy() for a in batch.label or []],
        batch.pad,
    )


# -- LoaderDataIter -----------------------------------------------------------------------------


def mlp(classes=3):
    data = mx.sym.Variable("data")
    net = mx.sym.FullyConnected(data, num_hidden=16, name="fc1")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.FullyConnected(net, num_hidden=classes, name="fc2")
    return mx.sym.SoftmaxOutput(net, name="softmax")


@requires_mx1("mx.mod.Module, which 2.x removed with the symbolic DataIter training loop")
@pytest.mark.filterwarnings("ignore:Parameters already initialized")
def test_module_fit_trains_through_the_adapter():
    mx.random.seed(7)
    np.random.seed(7)
    X, y = separable(300, seed=1)
    X_test, y_test = separable(150, seed=2)
    loader = DataLoader(ArrayDataset(X, y), batch_size=32, shuffle=True)
    train = LoaderDataIter(loader, batch_size=32)
    held_out = mx.io.NDArrayIter(X_test, y_test, batch_size=32)

    mod = mx.mod.Module(mlp(), context=mx.cpu())
    mod.bind(data_shapes=train.provide_data, label_shapes=train.provide_label)
    mod.init_params(initializer=mx.init.Xavier())
    before = mod.score(held_out, "acc")[0][1]
    mod.fit(
        train,
        num_epoch=6,
        optimizer="sgd",
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
    )
    after = mod.score(held_out, "acc")[0][1]
    assert after > 0.9, (before, after)
    assert after > before + 0.2, (before, after)


def test_pad_of_last_batch_matches_ndarrayiter():
    X, y = separable(300, seed=3)
    ours = LoaderDataIter(DataLoader(ArrayDataset(X, y), batch_size=32), batch_size=32)
    ref = mx.io.NDArrayIter(X, y, batch_size=32, last_batch_handle="pad")
    ours_batches, ref_batches = list(ours), list(ref)
    assert len(ours_batches) == len(ref_batches) == 10
    for mine, theirs in zip(ours_batches, ref_batches):
        assert mine.pad == theirs.pad
        assert [a.shape for a in mine.data] == [a.shape for a in theirs.data]
        assert [a.shape for a in mine.label] == [a.shape for a in theirs.label]
        real = 32 - mine.pad
        for a, b in zip(mine.data + mine.label, theirs.data + theirs.label):
            np.testing.assert_array_equal(a.asnumpy()[:real], b.asnumpy()[:real])
    last = ours_batches[-1]
    assert last.pad == 20
    rows = last.data[0].asnumpy()
    np.testing.assert_array_equal(rows[12:], rows[np.arange(20) % 12])  # filler wraps the batch
    wrapped = np.concatenate([np.arange(12), np.arange(20) % 12])
    np.testing.assert_array_equal(last.index, 288 + wrapped)


def test_batches_are_numpy_lists_or_dicts():
    X = np.arange(20, dtype=np.float64).reshape(10, 2)
    dict_batches = [{"x": X[i : i + 4], "y": np.arange(i, min(i + 4, 10))} for i in (0, 4, 8)]
    it = LoaderDataIter(dict_batches, data_names="x", label_names="y", batch_size=4)
    assert [d.name for d in it.provide_data] == ["x"]
    assert it.provide_data[0].shape == (4, 2)
    out = list(it)
    assert [b.pad for b in out] == [0, 0, 2]
    assert all(isinstance(a, mx.nd.NDArray) and a.dtype == np.float32 for a in out[2].data)
    np.testing.assert_array_equal(out[2].label[0].asnumpy(), [8, 9, 8, 9])


class CountingLoader:
    """A re-iterable of batches that counts epochs and closes its epoch iterators."""

    def __init__(self, batches, dataset=None, batch_size=None):
        self.batches = batches
        if dataset is not None:
            self._dataset = dataset
        if batch_size is not None:
            self.batch_size = batch_size
        self.epochs_started = 0
        self.closed_epochs = 0

    def __iter__(self):
        self.epochs_started += 1
        return self._epoch()

    def _epoch(self):
        try:
            yield from self.batches
        finally:
            self.closed_epochs += 1


class CountingDataset:
    def __init__(self, X, y):
        self.X, self.y = X, y
        self.reads = 0

    def __len__(self):
        return len(self.X)

    def __getitem__(self, i):
        self.reads += 1
        return self.X[i], self.y[i]


def gluon_batches(X, y, batch_size):
    return list(DataLoader(ArrayDataset(X, y), batch_size=batch_size))


def test_provide_data_inferred_from_one_sample_without_starting_an_epoch():
    X = np.random.rand(10, 3, 8, 8)  # float64 samples, int labels
    y = np.arange(10)
    dataset = CountingDataset(X, y)
    loader = CountingLoader(gluon_batches(X, y, 4), dataset=dataset, batch_size=4)
    it = LoaderDataIter(loader)
    assert loader.epochs_started == 0
    assert dataset.reads == 1
    (data,), (label,) = it.provide_data, it.provide_label
    assert (data.name, data.shape, np.dtype(data.dtype), data.layout) == (
        "data",
        (4, 3, 8, 8),
        np.float32,
        "NCHW",
    )
    assert (label.name, label.shape, np.dtype(label.dtype)) == ("softmax_label", (4,), np.float32)
    kept = LoaderDataIter(loader, dtype=None)
    assert np.dtype(kept.provide_data[0].dtype) == np.float64
    assert np.dtype(kept.provide_label[0].dtype) == np.int64
    batch = next(it)
    assert batch.data[0].dtype == np.float32 and batch.label[0].dtype == np.float32


def test_provide_data_inferred_from_first_batch_which_is_not_wasted():
    X, y = separable(10, seed=4)
    loader = CountingLoader(gluon_batches(X, y, 4))
    it = LoaderDataIter(loader, label_names=["label"])
    assert it.batch_size == 4
    assert it.provide_data[0].shape == (4, 4)
    assert [d.name for d in it.provide_label] == ["label"]
    it.reset()  # nothing consumed yet: the epoch read ahead is kept
    out = list(it)
    assert loader.epochs_started == 1
    assert [b.pad for b in out] == [0, 0, 2]
    np.testing.assert_array_equal(out[0].data[0].asnumpy(), X[:4])


def test_explicit_descs_win_and_cast():
    X, y = separable(8, seed=5)
    descs = [mx.io.DataDesc("data", (4, 4), np.float16)]
    loader = CountingLoader(gluon_batches(X, y, 4))
    it = LoaderDataIter(loader, provide_data=descs, provide_label=[("softmax_label", (4,))])
    assert loader.epochs_started == 0 and it.batch_size == 4
    batch = next(it)
    assert batch.data[0].dtype == np.float16
    assert batch.label[0].dtype == np.float32
    with pytest.raises(ValueError, match="disagree"):
        LoaderDataIter(loader, data_names=["x"], provide_data=descs)


def test_reset_mid_epoch_closes_the_old_epoch():
    X, y = separable(20, seed=6)
    loader = CountingLoader(gluon_batches(X, y, 4), batch_size=4)
    it = LoaderDataIter(loader, provide_data=[("data", (4, 4))])
    first = next(it).data[0].asnumpy()
    next(it)
    it.reset()
    assert loader.closed_epochs == 1
    epoch = list(it)
    assert len(epoch) == 5
    np.testing.assert_array_equal(epoch[0].data[0].asnumpy(), first)
    assert epoch[0].index.tolist() == [0, 1, 2, 3]
    with pytest.raises(StopIteration):
        it.next()
    it.reset()
    assert it.iter_next() and it.getpad() == 0
    np.testing.assert_array_equal(it.getdata()[0].asnumpy(), first)
    it.close()
    with pytest.raises(ClosedIteratorError):
        it.next()


def test_reset_mid_epoch_with_a_gluon_dataloader():
    X, y = separable(50, seed=8)
    it = LoaderDataIter(DataLoader(ArrayDataset(X, y), batch_size=8), batch_size=8)
    next(it)
    it.reset()
    assert sum(1 for _ in it) == 7
    it.reset()
    assert sum(1 for _ in it) == 7


def test_accessors_without_a_batch_say_to_call_next_first():
    # They used to fail with "'NoneType' object has no attribute 'data'".
    X, y = separable(8, seed=9)
    it = LoaderDataIter(DataLoader(ArrayDataset(X, y), batch_size=4), batch_size=4)
    for accessor in (it.getdata, it.getlabel, it.getindex, it.getpad):
        with pytest.raises(RuntimeError, match=r"LoaderDataIter\.get\w+\(\) has no batch"):
            accessor()
    assert it.iter_next() and it.getpad() == 0
    it.reset()
    with pytest.raises(RuntimeError, match="again after reset"):
        it.getdata()
    it.close()
    with pytest.raises(ClosedIteratorError, match=r"getlabel\(\) on a closed LoaderDataIter"):
        it.getlabel()


def test_adapter_rejects_bad_input():
    with pytest.raises(TypeError, match="re-iterable"):
        LoaderDataIter(iter([[np.zeros((2, 2)), np.zeros(2)]]))
    with pytest.raises(ValueError, match="2 fields"):
        LoaderDataIter([[np.zeros((2, 2)), np.zeros(2)]], label_names=["a", "b"])
    with pytest.raises(ValueError, match="no batches"):
        LoaderDataIter([])
    too_big = LoaderDataIter([[np.zeros((5, 2)), np.zeros(5)]], batch_size=4)
    with pytest.raises(ValueError, match="5 rows"):
        next(too_big)


# -- PrefetchingIter ----------------------------------------------------------------------------


def assert_same_batches(wrapped, plain, epochs=2):
    """Both iterators give identical batches for several epochs (wrapped read first, in full)."""
    for _ in range(epochs):
        got = [as_numpy(b) for b in list(wrapped)]  # held all at once: buffers must not recycle
        want = [as_numpy(b) for b in plain]
        assert len(got) == len(want) > 0
        for (gd, gl, gp), (wd, wl, wp) in zip(got, want):
            assert gp == wp
            for a, b in zip(gd + gl, wd + wl):
                np.testing.assert_array_equal(a, b)
        wrapped.reset()
        plain.reset()


def test_prefetching_ndarrayiter_matches_unwrapped():
    X, y = separable(50, seed=9)
    make = lambda: mx.io.NDArrayIter(X, y, batch_size=8, last_batch_handle="pad")  # noqa: E731
    with PrefetchingIter(make()) as it:
        assert it.provide_data == make().provide_data
        assert it.batch_size == 8
        assert_same_batches(it, make())


def test_prefetching_csviter_matches_unwrapped(tmp_path):
    X, y = separable(45, seed=10)
    np.savetxt(tmp_path / "data.csv", X, delimiter=",")
    np.savetxt(tmp_path / "label.csv", y.reshape(-1, 1), delimiter=",")

    def make():
        return mx.io.CSVIter(
            data_csv=str(tmp_path / "data.csv"),
            data_shape=(4,),
            label_csv=str(tmp_path / "label.csv"),
            label_shape=(1,),
            batch_size=8,
        )

    with PrefetchingIter(make(), buffer_size=3) as it:
        assert_same_batches(it, make())


def bmp_bytes(img):
    """Encode an RGB uint8 image as an uncompressed BMP (the cv2 package is not installed)."""
    h, w, _ = img.shape
    row = (w * 3 + 3) & ~3
    pixels = np.zeros((h, row), np.uint8)
    pixels[:, : w * 3] = img[::-1, :, ::-1].reshape(h, w * 3)  # bottom-up rows, BGR
    header = struct.pack("<IHHI", 54 + pixels.nbytes, 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, pixels.nbytes, 2835, 2835, 0, 0)
    return b"BM" + header + info + pixels.tobytes()


@pytest.fixture
def image_rec(tmp_path):
    rec, idx = str(tmp_path / "images.rec"), str(tmp_path / "images.idx")
    rng = np.random.RandomState(0)
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    for i in range(40):
        img = rng.randint(0, 256, size=(12, 12, 3), dtype=np.uint8)
        header = mx.recordio.IRHeader(0, float(i % 5), i, 0)
        writer.write_idx(i, mx.recordio.pack(header, bmp_bytes(img)))
    writer.close()
    assert (mx.image.imdecode(bmp_bytes(img)).asnumpy() == img).all()
    return rec, idx


def test_prefetching_image_record_iter_matches_unwrapped(image_rec):
    rec, idx = image_rec

    def make():
        return mx.io.ImageRecordIter(
            path_imgrec=rec,
            path_imgidx=idx,
            data_shape=(3, 12, 12),
            # Whole batches only: on a short last batch MXNet 1.9.1's iterator itself is not
            # repeatable (round_batch=True moves the pad between runs; False leaves garbage rows).
            batch_size=8,
            preprocess_threads=1,
            prefetch_buffer=1,  # recycles a batch's memory at the next call: copies must happen
        )

    with PrefetchingIter(make(), buffer_size=4) as it:
        assert it.provide_data[0].shape == (8, 3, 12, 12)
        assert_same_batches(it, make())


def test_prefetching_combines_two_iterators_with_renames():
    X, y = separable(40, seed=11)
    a = mx.io.NDArrayIter(X, y, batch_size=8)
    b = mx.io.NDArrayIter(X * 2, y + 1, batch_size=8)
    with PrefetchingIter(
        [a, b],
        rename_data=[{"data": "a"}, {"data": "b"}],
        rename_label=[{"softmax_label": "la"}, {"softmax_label": "lb"}],
    ) as it:
        assert [d.name for d in it.provide_data] == ["a", "b"]
        assert [d.name for d in it.provide_label] == ["la", "lb"]
        batches = list(it)
    assert len(batches) == 5
    for i, batch in enumerate(batches):
        assert len(batch.data) == 2 and len(batch.label) == 2
        rows = X[i * 8 : (i + 1) * 8]
        np.testing.assert_allclose(batch.data[0].asnumpy(), rows)
        np.testing.assert_allclose(batch.data[1].asnumpy(), rows * 2)
        np.testing.assert_array_equal(batch.label[1].asnumpy(), y[i * 8 : (i + 1) * 8] + 1)
        assert [d.name for d in batch.provide_data] == ["a", "b"]


def test_prefetching_combined_iterators_of_different_lengths_is_an_error():
    a = mx.io.NDArrayIter(np.zeros((16, 2)), batch_size=8)
    b = mx.io.NDArrayIter(np.zeros((24, 2)), batch_size=8)
    with PrefetchingIter([a, b]) as it, pytest.raises(ValueError, match="different lengths"):
        list(it)


class FailingIter(mx.io.DataIter):
    """Yields ``fail_at`` good batches, then its next() raises RuntimeError."""

    def __init__(self, fail_at=3):
        super().__init__(batch_size=4)
        self.fail_at = fail_at
        self.cursor = 0

    @property
    def provide_data(self):
        return [mx.io.DataDesc("data", (4, 2))]

    @property
    def provide_label(self):
        return [mx.io.DataDesc("softmax_label", (4,))]

    def reset(self):
        self.cursor = 0

    def next(self):
        if self.cursor == self.fail_at:
            raise RuntimeError(f"disk read failed at batch {self.cursor}")
        self.cursor += 1
        return mx.io.DataBatch([mx.nd.full((4, 2), self.cursor)], [mx.nd.zeros((4,))], pad=0)


def test_prefetching_error_midway_reaches_consumer():
    it = PrefetchingIter(FailingIter(fail_at=3))
    got = []
    with pytest.raises(RuntimeError, match="disk read failed at batch 3") as info:
        for batch in it:
            got.append(batch.data[0].asnumpy()[0, 0])
    assert got == [1, 2, 3]
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "next" in frames  # the wrapped iterator's frame, from the thread
    it.reset()  # a new epoch after an error works
    assert it.next().data[0].asnumpy()[0, 0] == 1
    it.close()
    assert not our_threads()


def test_prefetching_reset_mid_epoch():
    X, y = separable(64, seed=12)
    inner = mx.io.NDArrayIter(X, y, batch_size=8)
    it = PrefetchingIter(inner, buffer_size=2)
    for _ in range(3):
        next(it)
        next(it)
        it.reset()  # mid-epoch, while the thread is reading ahead
    batches = list(it)
    assert len(batches) == 8
    np.testing.assert_allclose(batches[0].data[0].asnumpy(), X[:8])
    np.testing.assert_allclose(batches[-1].data[0].asnumpy(), X[56:])
    it.close()


def test_prefetching_loads_at_construction():
    class Counting(FailingIter):
        calls = 0

        def next(self):
            Counting.calls += 1
            return super().next()

    it = PrefetchingIter(Counting(fail_at=100))
    deadline = time.monotonic() + 5
    while Counting.calls < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert Counting.calls >= 2
    it.close()


def test_prefetching_close_gc_and_break_leave_no_thread():
    X, y = separable(400, seed=13)
    before = len(threading.enumerate())

    it = PrefetchingIter(mx.io.NDArrayIter(X, y, batch_size=4))
    next(it)
    it.close()
    assert not our_threads()
    with pytest.raises(ClosedIteratorError):
        it.next()
    with pytest.raises(ClosedIteratorError):
        it.reset()

    it = PrefetchingIter(mx.io.NDArrayIter(X, y, batch_size=4))
    next(it)
    del it
    gc.collect()
    deadline = time.monotonic() + 2
    while our_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not our_threads()

    for _ in range(10):
        for _batch in PrefetchingIter(mx.io.NDArrayIter(X, y, batch_size=4)):
            break
    gc.collect()
    deadline = time.monotonic() + 2
    while len(threading.enumerate()) != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(threading.enumerate()) == before


@requires_mx1("mx.mod.Module, which 2.x removed with the symbolic DataIter training loop")
def test_loader_dataiter_under_prefetching_iter_trains():
    X, y = separable(200, seed=14)
    source = LoaderDataIter(DataLoader(ArrayDataset(X, y), batch_size=25), batch_size=25)
    with PrefetchingIter(source) as train:
        mod = mx.mod.Module(mlp(), context=mx.cpu())
        mod.fit(train, num_epoch=3, optimizer="sgd", optimizer_params={"learning_rate": 0.1})
        assert mod.score(mx.io.NDArrayIter(X, y, batch_size=25), "acc")[0][1] > 0.8


class EpochStarts:
    """A re-iterable of two batches that records the thread each epoch starts on; with
    ``fail=True`` starting an epoch raises."""

    def __init__(self, fail=False):
        self.fail = fail
        self.threads = []

    def __iter__(self):
        self.threads.append(threading.current_thread())
        if self.fail:
            raise OSError("the shard is gone")
        return iter([(np.ones((4, 2), "float32"), np.zeros(4, "float32"))] * 2)


def described(loader):
    """A LoaderDataIter that starts no epoch to describe its fields."""
    return LoaderDataIter(
        loader, provide_data=[("data", (4, 2))], provide_label=[("softmax_label", (4,))]
    )


def test_prefetching_starts_loader_epochs_on_the_calling_thread():
    source = EpochStarts()
    it = PrefetchingIter(described(source))
    assert source.threads == [threading.current_thread()]  # forks of its workers happen here
    assert len(list(it)) == 2
    it.reset()
    assert source.threads == [threading.current_thread()] * 2
    assert len(list(it)) == 2
    it.close()


def test_prefetching_error_starting_an_epoch_reaches_next():
    it = PrefetchingIter(described(EpochStarts(fail=True)))
    with pytest.raises(OSError, match="the shard is gone"):
        it.next()
    with pytest.raises(StopIteration):
        it.next()
    it.close()


@pytest.mark.timeout(60)
def test_prefetching_forks_no_worker_beside_the_callers_mxnet_work():
    """PrefetchingIter over a loader with a fork worker, while the caller runs MXNet right
    after making it (Module.fit binds its module then). The worker used to be forked on the
    prefetch thread; MXNet's fork handlers, racing the caller's operations, hung the worker or
    the caller: this program in 6 of 6 runs on 72462c7 (tests/scenarios/module_fit.py --iter
    prefetching in 4 of 60). About 3.5 s on 2 cores."""
    done = run_program("prefetch_fork_race.py", "30", "20", timeout=30)
    assert done.returncode == 0 and "OK 30 rounds" in done.stdout, done.stdout + done.stderr


def test_prefetching_reset_refuses_to_race_a_stuck_iterator(monkeypatch):
    monkeypatch.setattr(timing, "PREFETCH_JOIN_S", 0.05)

    class Slow(FailingIter):
        def next(self):
            time.sleep(0.5)
            return super().next()

    it = PrefetchingIter(Slow(fail_at=100))
    time.sleep(0.1)  # the thread is now inside Slow.next()
    with pytest.warns(RuntimeWarning, match="did not stop"), pytest.raises(LoaderTimeoutError):
        it.reset()
    deadline = time.monotonic() + 5
    while our_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    it.reset()  # once the thread is out of next(), reset works
    assert it.next().data[0].asnumpy()[0, 0] == 1
    with pytest.warns(RuntimeWarning, match="did not stop"):
        it.close()  # the thread is inside Slow.next() again
