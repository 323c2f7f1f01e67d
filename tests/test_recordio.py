"""RecordIO datasets: exact round trips through every kind of worker, fork and spawn safety,
and a clear error (never a hang, never garbage) for every kind of damaged file."""

from __future__ import annotations

import errno
import multiprocessing
import os
import pickle
import re
import shutil
import struct
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import mxnet as mx
import numpy as np
import pytest
from _backends import BACKENDS, FixedSampler
from hypothesis import given, settings
from hypothesis import strategies as st

from shardloader import ShardedDataLoader
from shardloader.recordio import (
    ImageRecordDataset,
    RecordDataset,
    RecordIOError,
    pack_images,
    pack_records,
)

pytestmark = pytest.mark.timeout(60)

N_RECORDS = 1000
IMAGE_SHAPE = (8, 8, 3)
MAGIC = struct.pack("<I", 0xCED7230A)


# -- module-level helpers, so they pickle under spawn ----------------------------------------


def with_pid(image, label):
    """A transform that records which process decoded the sample."""
    return image, label, np.int64(os.getpid())


def as_list(samples):
    return list(samples)


def portable(sample):
    if isinstance(sample, mx.nd.NDArray):
        return sample.asnumpy()
    if isinstance(sample, tuple):
        return tuple(portable(x) for x in sample)
    return sample


def read_in_child(dataset, indices, conn) -> None:
    """Read ``indices`` in a child process and send back the records and who opened the file."""
    try:
        # NDArrays would travel by file descriptor, which needs the child alive: send numpy.
        records = [portable(dataset[i]) for i in indices]
        conn.send(("ok", records, dataset._reader.pid, os.getpid()))
    except BaseException as exc:
        conn.send(("error", repr(exc), None, os.getpid()))
    finally:
        conn.close()


def run_child(start_method, dataset, indices):
    ctx = multiprocessing.get_context(start_method)
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=read_in_child, args=(dataset, indices, sender))
    child.start()
    sender.close()
    try:
        assert receiver.poll(45), "the child sent nothing back"
        status, result, reader_pid, child_pid = receiver.recv()
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join(5)
    assert status == "ok", result
    assert child.exitcode == 0
    return result, reader_pid, child_pid


def as_numpy(batch):
    return batch.asnumpy() if isinstance(batch, mx.nd.NDArray) else np.asarray(batch)


# -- data ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    """1,000 random 8x8 RGB images with float labels i / 2, packed losslessly."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(N_RECORDS,) + IMAGE_SHAPE, dtype=np.uint8)
    labels = np.arange(N_RECORDS) / 2
    rec, idx = pack_images(tmp_path_factory.mktemp("images") / "images.rec", images, labels)
    return types.SimpleNamespace(rec=rec, idx=idx, images=images, labels=labels)


@pytest.fixture(scope="module")
def raw_file(tmp_path_factory):
    """1,000 raw records of varied lengths, some holding RecordIO's magic number, one empty."""
    rng = np.random.default_rng(1)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 40, size=N_RECORDS)]
    records[3] = b""
    records[10] = MAGIC
    records[11] = MAGIC * 3 + b"x"
    records[12] = b"ab" + MAGIC + b"cd" + MAGIC
    rec, idx = pack_records(tmp_path_factory.mktemp("raw") / "raw.rec", records)
    return types.SimpleNamespace(rec=rec, idx=idx, records=records)


def copy_pair(source, tmp_path, name="copy"):
    rec, idx = tmp_path / f"{name}.rec", tmp_path / f"{name}.idx"
    shutil.copyfile(source.rec, rec)
    shutil.copyfile(source.idx, idx)
    return rec, idx


def offsets_of(idx_path):
    with open(idx_path) as lines:
        return [int(line.split("\t")[1]) for line in lines]


# -- loaders ---------------------------------------------------------------------------------

LOADER_MODES = BACKENDS


def read_batches(dataset, mode, **kwargs):
    with ShardedDataLoader(dataset, **LOADER_MODES[mode], **kwargs) as loader:
        return list(loader)


@pytest.mark.parametrize("mode", list(LOADER_MODES))
def test_loader_reads_every_image_in_sampler_order(image_file, mode, no_leaks):
    order = np.random.default_rng(2).permutation(N_RECORDS)
    dataset = ImageRecordDataset(image_file.rec, transform=with_pid)
    batches = read_batches(dataset, mode, batch_size=32, sampler=FixedSampler(order))

    assert len(batches) == 32  # 31 full batches and 8 samples kept
    images = np.concatenate([as_numpy(b[0]) for b in batches])
    labels = np.concatenate([as_numpy(b[1]) for b in batches])
    pids = set(np.concatenate([as_numpy(b[2]) for b in batches]).tolist())
    np.testing.assert_array_equal(images, image_file.images[order])
    np.testing.assert_array_equal(labels, image_file.labels[order].astype(np.float32))
    assert labels.dtype == np.float32
    if mode in ("inline", "thread"):
        assert pids == {os.getpid()}
    else:  # decoded in the worker processes, not in the parent
        assert os.getpid() not in pids and 1 <= len(pids) <= 2


@pytest.mark.parametrize("mode", ["inline", "thread", "fork"])
def test_loader_reads_every_raw_record_in_sampler_order(raw_file, mode, no_leaks):
    order = np.random.default_rng(3).permutation(N_RECORDS)
    dataset = RecordDataset(raw_file.rec)
    batches = read_batches(
        dataset, mode, batch_size=50, sampler=FixedSampler(order), batchify_fn=as_list
    )
    records = [record for batch in batches for record in batch]
    assert records == [raw_file.records[i] for i in order]


@pytest.mark.parametrize("mode", ["inline", "thread", "fork"])
def test_loader_reports_a_broken_record_by_file_and_index(image_file, tmp_path, mode, no_leaks):
    rec, _ = copy_pair(image_file, tmp_path)
    offsets = offsets_of(image_file.idx)
    with open(rec, "r+b") as f:  # damage the PNG data in the middle of record 500
        f.seek((offsets[500] + offsets[501]) // 2)
        f.write(b"\xab" * 8)
    with pytest.raises(RecordIOError, match=re.escape(f"{rec}: record 500 (key 500")):
        read_batches(ImageRecordDataset(rec), mode, batch_size=100)


# -- processes and threads, directly ---------------------------------------------------------


def test_forked_child_opens_its_own_handle_and_leaves_the_parents_alone(raw_file):
    dataset = RecordDataset(raw_file.rec)
    assert dataset[5] == raw_file.records[5]  # the parent opens its handle before forking
    parent_reader = dataset._reader
    backwards = list(range(N_RECORDS - 1, -1, -1))

    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=read_in_child, args=(dataset, backwards, sender))
    child.start()
    sender.close()
    try:
        # Read in the parent while the child reads: shared file offsets would mix records.
        for _ in range(3):
            assert [dataset[i] for i in range(N_RECORDS)] == raw_file.records
        assert receiver.poll(45), "the child sent nothing back"
        status, records, reader_pid, child_pid = receiver.recv()
    finally:
        child.join(10)
    assert status == "ok", records
    assert child.exitcode == 0
    assert records == raw_file.records[::-1]
    assert reader_pid == child_pid != os.getpid()
    assert dataset._reader is parent_reader
    assert [dataset[i] for i in range(N_RECORDS)] == raw_file.records


def test_forked_child_decodes_images(image_file):
    dataset = ImageRecordDataset(image_file.rec)
    dataset[0]
    samples, _, _ = run_child("fork", dataset, [1, 998])
    for (image, label), i in zip(samples, [1, 998]):
        np.testing.assert_array_equal(image, image_file.images[i])
        assert label == image_file.labels[i]


def test_dataset_pickles_without_its_handle_and_reads_under_spawn(image_file):
    dataset = ImageRecordDataset(image_file.rec, transform=with_pid)
    dataset[0]  # a handle is open; pickling must leave it out and keep it working
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._reader is None and len(clone) == N_RECORDS
    np.testing.assert_array_equal(clone[7][0].asnumpy(), image_file.images[7])

    samples, reader_pid, child_pid = run_child("spawn", dataset, [0, 999])
    assert reader_pid == child_pid != os.getpid()
    for (image, label, pid), i in zip(samples, [0, 999]):
        np.testing.assert_array_equal(image, image_file.images[i])
        assert label == image_file.labels[i] and pid == child_pid
    np.testing.assert_array_equal(dataset[999][0].asnumpy(), image_file.images[999])


def test_threads_share_one_dataset_safely(raw_file):
    dataset = RecordDataset(raw_file.rec)
    with ThreadPoolExecutor(4) as pool:
        chunks = [range(start, N_RECORDS, 4) for start in range(4)]
        results = list(pool.map(lambda chunk: [dataset[i] for i in chunk], chunks * 3))
    for chunk, records in zip(chunks * 3, results):
        assert records == [raw_file.records[i] for i in chunk]


def test_close_while_other_threads_read(raw_file):
    dataset = RecordDataset(raw_file.rec)
    stop = threading.Event()

    def keep_closing():
        while not stop.is_set():
            dataset.close()
            time.sleep(0)

    closer = threading.Thread(target=keep_closing)
    closer.start()
    try:
        with ThreadPoolExecutor(3) as pool:
            records = list(pool.map(dataset.__getitem__, list(range(N_RECORDS)) * 3))
    finally:
        stop.set()
        closer.join(10)
    assert records == raw_file.records * 3


# -- samples ---------------------------------------------------------------------------------


def test_images_and_scalar_labels_round_trip_exactly(image_file):
    dataset = ImageRecordDataset(image_file.rec)
    assert len(dataset) == N_RECORDS
    for i in (0, 1, 500, 999, -1):
        image, label = dataset[i]
        assert isinstance(image, mx.nd.NDArray) and image.dtype == np.uint8
        np.testing.assert_array_equal(image.asnumpy(), image_file.images[i])
        assert isinstance(label, np.float32) and label == image_file.labels[i]


def test_vector_labels_come_back_as_float32_arrays_and_batch(tmp_path):
    images = np.zeros((6, 4, 5, 3), dtype=np.uint8)
    labels = [[i, -i, 0.25] for i in range(6)]
    pack_images(tmp_path / "v.rec", images, labels)
    dataset = ImageRecordDataset(tmp_path / "v.rec")
    image, label = dataset[4]
    assert image.shape == (4, 5, 3)
    assert label.dtype == np.float32 and label.flags.writeable
    np.testing.assert_array_equal(label, [4, -4, 0.25])

    batch = read_batches(dataset, "inline", batch_size=6)[0]
    assert batch[0].shape == (6, 4, 5, 3)
    np.testing.assert_array_equal(batch[1].asnumpy(), np.array(labels, dtype=np.float32))


def test_grey_images_and_the_decode_flag(tmp_path):
    grey = np.random.default_rng(4).integers(0, 256, size=(3, 6, 7), dtype=np.uint8)
    pack_images(tmp_path / "g.rec", grey, [0, 1, 2])
    image, _ = ImageRecordDataset(tmp_path / "g.rec", flag=0)[2]
    np.testing.assert_array_equal(image.asnumpy(), grey[2][:, :, None])
    image, _ = ImageRecordDataset(tmp_path / "g.rec", flag=1)[2]
    np.testing.assert_array_equal(image.asnumpy(), np.repeat(grey[2][:, :, None], 3, axis=2))
    with pytest.raises(ValueError, match="flag"):
        ImageRecordDataset(tmp_path / "g.rec", flag=2)


def test_raw_records_round_trip_including_magic_and_empty(raw_file):
    dataset = RecordDataset(raw_file.rec)
    assert [dataset[i] for i in range(N_RECORDS)] == raw_file.records
    assert dataset[-1] == raw_file.records[-1]


def test_transform_and_transform_first(image_file):
    def scale(image):
        return image.astype("float32") / 255

    dataset = ImageRecordDataset(image_file.rec).transform_first(scale)
    image, label = dataset[3]
    np.testing.assert_allclose(image.asnumpy(), image_file.images[3] / 255, rtol=1e-6)
    assert label == image_file.labels[3]

    numpy_dataset = ImageRecordDataset(image_file.rec, transform=lambda x, y: (x.asnumpy(), y))
    batch = read_batches(numpy_dataset, "inline", batch_size=10)[0]
    np.testing.assert_array_equal(batch[0].asnumpy(), image_file.images[:10])

    raw = RecordDataset(image_file.rec).transform(len)
    assert raw[0] == len(RecordDataset(image_file.rec)[0])


def test_index_errors_name_the_index_and_the_length(raw_file):
    dataset = RecordDataset(raw_file.rec)
    for bad in (N_RECORDS, -N_RECORDS - 1, np.int64(5000)):
        with pytest.raises(IndexError, match=rf"index {bad} .*length {N_RECORDS}"):
            dataset[bad]
    assert dataset[np.int64(7)] == raw_file.records[7]
    with pytest.raises(TypeError, match="integers"):
        dataset[1.0]


def test_a_sparse_index_reads_fine(raw_file, tmp_path):
    offsets = offsets_of(raw_file.idx)
    (tmp_path / "sparse.idx").write_text(f"7\t{offsets[7]}\n3\t{offsets[3]}\n12\t{offsets[12]}\n")
    dataset = RecordDataset(raw_file.rec, tmp_path / "sparse.idx")
    assert [dataset[i] for i in range(3)] == [raw_file.records[i] for i in (7, 3, 12)]


# -- damaged files ---------------------------------------------------------------------------


def test_missing_files_are_named(raw_file, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.rec"):
        RecordDataset(tmp_path / "nope.rec")
    with pytest.raises(FileNotFoundError, match="nope.idx"):
        RecordDataset(raw_file.rec, tmp_path / "nope.idx")


def test_an_index_pointing_past_the_end_is_refused_at_construction(raw_file, tmp_path):
    rec, idx = copy_pair(raw_file, tmp_path)
    with open(idx, "a") as f:
        f.write(f"{N_RECORDS}\t{os.path.getsize(rec) + 64}\n")
    with pytest.raises(RecordIOError, match=rf"{re.escape(str(idx))}.*past the end.*key 1000"):
        RecordDataset(rec)


def test_a_truncated_rec_is_refused_or_named(raw_file, tmp_path):
    rec, idx = copy_pair(raw_file, tmp_path)
    offsets = offsets_of(idx)
    os.truncate(rec, offsets[900] + 3)  # record 900's header is cut: the .idx points past it
    with pytest.raises(RecordIOError, match=r"past the end.*record 900 \(key 900"):
        RecordDataset(rec)

    with open(idx, "w") as f:  # an .idx of the first 900 records, whose last one is cut short
        f.writelines(f"{i}\t{offsets[i]}\n" for i in range(900))
    os.truncate(rec, offsets[900] - 2)
    dataset = RecordDataset(rec)
    with pytest.raises(RecordIOError, match=r"record 899 \(key 899.*corrupt or truncated"):
        dataset[899]
    assert dataset[898] == raw_file.records[898]


def test_truncation_after_construction_does_not_poison_the_handle(raw_file, tmp_path):
    rec, idx = copy_pair(raw_file, tmp_path)
    dataset = RecordDataset(rec)
    os.truncate(rec, offsets_of(idx)[700])
    # MXNet returns None past the end, and then None for every later read on that handle.
    with pytest.raises(RecordIOError, match=r"record 800 .*truncated"):
        dataset[800]
    assert dataset[5] == raw_file.records[5]
    assert dataset[699] == raw_file.records[699]


def test_every_read_of_a_truncated_file_is_exact_or_an_error(raw_file, tmp_path):
    rec, _ = copy_pair(raw_file, tmp_path)
    size = os.path.getsize(rec)
    for cut in np.random.default_rng(5).integers(size // 2, size, size=6):
        os.truncate(rec, int(cut))
        try:
            dataset = RecordDataset(rec)
        except RecordIOError:
            continue
        for i in range(N_RECORDS):
            try:
                assert dataset[i] == raw_file.records[i]
            except RecordIOError as exc:
                assert exc.index == i and exc.path == str(rec)


def write_header(rec, offset, magic=0xCED7230A, flag=0, length=0):
    with open(rec, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<II", magic, (flag << 29) | length))


@pytest.mark.parametrize(
    "damage",
    [
        dict(magic=0xDEADBEEF, length=20),  # not a header: MXNet raises, without the file
        dict(length=4),  # shorter: MXNet returns the first 4 bytes as if they were the record
        dict(length=36),  # longer: MXNet returns this record glued to the next one's header
        dict(flag=1, length=20),  # "continued": MXNet glues the next record on
        dict(length=1 << 20),  # longer than the file
    ],
)
def test_a_damaged_record_header_is_named_and_spares_its_neighbours(raw_file, tmp_path, damage):
    records = [bytes([i]) * 20 for i in range(30)]
    rec, idx = pack_records(tmp_path / "h.rec", records)
    write_header(rec, offsets_of(idx)[14], **damage)
    dataset = RecordDataset(rec)
    with pytest.raises(RecordIOError, match=re.escape(f"{rec}: record 14 (key 14, byte offset")):
        dataset[14]
    assert [dataset[i] for i in (13, 15, 0, 29)] == [records[i] for i in (13, 15, 0, 29)]


def test_overwritten_bytes_in_the_middle_of_the_file(image_file, tmp_path):
    rec, idx = copy_pair(image_file, tmp_path)
    offsets = offsets_of(idx)
    with open(rec, "r+b") as f:  # 64 bytes of zeros across the start of record 500
        f.seek(offsets[500] - 32)
        f.write(bytes(64))
    dataset = ImageRecordDataset(rec)
    with pytest.raises(RecordIOError, match=r"record 500 \(key 500"):
        dataset[500]
    with pytest.raises(RecordIOError, match=r"record 499 \(key 499.*not a decodable image"):
        dataset[499]  # its PNG end chunk is damaged
    for i in (0, 498, 501, 999):
        np.testing.assert_array_equal(dataset[i][0].asnumpy(), image_file.images[i])


def test_an_index_pointing_inside_a_record(raw_file, tmp_path):
    offsets = offsets_of(raw_file.idx)
    (tmp_path / "mid.idx").write_text(f"0\t{offsets[0]}\n1\t{offsets[20] + 4}\n")
    dataset = RecordDataset(raw_file.rec, tmp_path / "mid.idx")
    with pytest.raises(RecordIOError, match=r"record 1 \(key 1, byte offset"):
        dataset[1]
    assert dataset[0] == raw_file.records[0]


@pytest.mark.parametrize(
    "content, message",
    [
        ("0\t0\n\n", "line 2"),
        ("0\t0\n1 8\n", "line 2"),
        ("0\t0\n0\t8\n", "key 0 repeats line 1"),
        ("0\t-8\n", "negative"),
    ],
)
def test_a_malformed_index_names_the_line(raw_file, tmp_path, content, message):
    (tmp_path / "bad.idx").write_text(content)
    with pytest.raises(RecordIOError, match=re.escape(message)):
        RecordDataset(raw_file.rec, tmp_path / "bad.idx")


def test_records_that_are_not_images(tmp_path):
    header = mx.recordio.IRHeader(0, 1.0, 0, 0)
    records = [mx.recordio.pack(header, b"not an image"), b"short", mx.recordio.pack(header, b"")]
    rec, _ = pack_records(tmp_path / "n.rec", records)
    dataset = ImageRecordDataset(rec)
    with pytest.raises(RecordIOError, match=r"record 0 .*not a decodable image"):
        dataset[0]
    with pytest.raises(RecordIOError, match=r"record 1 .*no valid IRHeader"):
        dataset[1]
    with pytest.raises(RecordIOError, match=r"record 2 .*not a decodable image"):
        dataset[2]


def test_the_error_pickles_with_its_details():
    error = RecordIOError("boom", path="x.rec", index=3, key=4, offset=96)
    clone = pickle.loads(pickle.dumps(error))
    assert isinstance(clone, ValueError) and str(clone) == "boom"
    assert (clone.path, clone.index, clone.key, clone.offset) == ("x.rec", 3, 4, 96)


# -- packing ---------------------------------------------------------------------------------


def test_pack_images_checks_its_input_and_leaves_no_partial_files(tmp_path):
    good = np.zeros((4, 4, 3), dtype=np.uint8)
    target = tmp_path / "p.rec"
    cases = [
        ([good, good], [0], "differ in length"),
        ([good, good.astype(np.float32)], [0, 1], r"images\[1\]"),
        ([good, good[:, :, :2]], [0, 1], r"images\[1\]"),
        ([good], [[[1.0]]], r"labels\[0\]"),
        ([good], [[]], r"labels\[0\]"),
    ]
    for images, labels, message in cases:
        with pytest.raises(ValueError, match=message):
            pack_images(target, images, labels)
    with pytest.raises(TypeError, match=r"records\[1\]"):
        pack_records(target, [b"x", "text"])
    assert os.listdir(tmp_path) == []


def test_pack_images_from_a_generator_with_a_progress_bar(tmp_path, capsys):
    images = (np.full((2, 2, 3), i, dtype=np.uint8) for i in range(3))
    rec, idx = pack_images(tmp_path / "p.rec", images, [0, 1, 2], progress=True)
    assert (rec, idx) == (str(tmp_path / "p.rec"), str(tmp_path / "p.idx"))
    assert "p.rec" in capsys.readouterr().err
    assert ImageRecordDataset(rec)[2][0].asnumpy().max() == 2


def test_other_formats_use_pack_img_with_cv2(tmp_path, monkeypatch):
    from shardloader import recordio

    monkeypatch.setattr(mx.recordio, "cv2", None)
    with pytest.raises(ImportError, match="opencv-python"):
        pack_images(tmp_path / "j.rec", [np.zeros((2, 2, 3), np.uint8)], [0], img_fmt=".jpg")

    calls = []

    def imencode(fmt, image, params):
        # Like OpenCV: the array is BGR, the file is RGB. PNG stands in for JPEG here.
        calls.append((fmt, params))
        return True, np.frombuffer(recordio.writer._png(image[:, :, ::-1], 6), dtype=np.uint8)

    fake_cv2 = types.SimpleNamespace(
        IMWRITE_JPEG_QUALITY=1, IMWRITE_PNG_COMPRESSION=16, imencode=imencode
    )
    monkeypatch.setattr(mx.recordio, "cv2", fake_cv2)
    rgb = np.random.default_rng(6).integers(0, 256, size=(2, 5, 4, 3), dtype=np.uint8)
    rec, _ = pack_images(tmp_path / "j.rec", rgb, [1, 2], quality=80, img_fmt=".jpg")
    assert calls == [(".jpg", [1, 80])] * 2
    image, label = ImageRecordDataset(rec)[1]
    np.testing.assert_array_equal(image.asnumpy(), rgb[1])
    assert label == 2


# -- Gluon's own record datasets under thread workers -----------------------------------------

# Four threads sharing Gluon's one file handle (thread_safe left out) read dozens of wrong
# samples in the very first epoch of each case; five epochs leave a wide margin.
GLUON_EPOCHS = 5


def gluon_label(label):
    return np.float64(label)


def as_samples(samples):
    """Keep the samples one by one, as numpy, so that each can be checked."""
    return [portable(sample) for sample in samples]


def scaled(image):
    return image.astype("float32") / 255


def raw_and_length(record):
    return record, len(record)


@pytest.fixture(scope="module")
def gluon_files(tmp_path_factory):
    """A raw file and an image file, both written by mx.recordio's writer."""
    folder = tmp_path_factory.mktemp("gluon")
    rng = np.random.default_rng(7)
    records = [rng.bytes(int(n)) for n in rng.integers(1, 600, size=240)]
    raw_rec, _ = pack_records(folder / "raw.rec", records)
    images = rng.integers(0, 256, size=(240, 6, 6, 3), dtype=np.uint8)
    labels = np.arange(240) * 1.5
    image_rec, _ = pack_images(folder / "images.rec", images, labels)
    return types.SimpleNamespace(
        raw=str(raw_rec), records=records, images_rec=str(image_rec), images=images, labels=labels
    )


def gluon_case(name, files):
    """A Gluon record dataset, possibly wrapped, and what sample ``i`` must be."""
    from mxnet.gluon.data import RecordFileDataset
    from mxnet.gluon.data.vision import ImageRecordDataset as GluonImageRecordDataset

    if name == "raw":
        return RecordFileDataset(files.raw), lambda i: files.records[i]
    if name == "raw.transform":
        dataset = RecordFileDataset(files.raw).transform(raw_and_length)
        return dataset, lambda i: (files.records[i], len(files.records[i]))
    if name == "image":
        dataset = GluonImageRecordDataset(files.images_rec)
        return dataset, lambda i: (files.images[i], files.labels[i])
    if name == "image.transform_first":
        dataset = GluonImageRecordDataset(files.images_rec).transform_first(scaled)
        return dataset, lambda i: (files.images[i] / np.float32(255), files.labels[i])
    if name == "image.shard.transform":
        dataset = (
            GluonImageRecordDataset(files.images_rec)
            .shard(2, 1)
            .transform(lambda image, label: (image, label * 2))
        )
        return dataset, lambda i: (files.images[120 + i], files.labels[120 + i] * 2)
    raise AssertionError(name)


def assert_sample(got, expected):
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected)
        for a, b in zip(got, expected):
            assert_sample(a, b)
    elif isinstance(expected, np.ndarray):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    else:
        assert got == expected


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "name", ["raw", "raw.transform", "image", "image.transform_first", "image.shard.transform"]
)
def test_gluon_record_datasets_read_right_under_four_threads(gluon_files, name, no_leaks):
    dataset, expected = gluon_case(name, gluon_files)
    order = np.random.default_rng(8).permutation(len(dataset))
    wrong = []
    with ShardedDataLoader(
        dataset,
        batch_size=4,
        sampler=FixedSampler(order),
        batchify_fn=as_samples,
        num_workers=4,
        thread_pool=True,
        prefetch=16,
    ) as loader:
        for epoch in range(GLUON_EPOCHS):
            samples = [sample for batch in loader for sample in batch]
            assert len(samples) == len(dataset)
            for i, sample in zip(order, samples):
                try:
                    assert_sample(sample, expected(int(i)))
                except AssertionError:
                    wrong.append((epoch, int(i)))
    assert wrong == [], f"{len(wrong)} wrong samples, first {wrong[:5]}"


def test_thread_safe_gives_gluon_datasets_a_handle_per_thread(gluon_files):
    from mxnet.gluon.data import RecordFileDataset

    from shardloader.recordio import thread_safe

    original = RecordFileDataset(gluon_files.raw)
    wrapped = original.transform(raw_and_length)
    safe = thread_safe(wrapped)
    assert safe is not wrapped and safe._fn is wrapped._fn
    assert type(safe._data) is RecordFileDataset and safe._data is not original
    assert original._record.is_open  # the user's dataset is untouched and still works
    assert original[3] == gluon_files.records[3]

    n = len(original)
    with ThreadPoolExecutor(4) as pool:
        chunks = [range(start, n, 4) for start in range(4)] * 10
        results = list(pool.map(lambda chunk: [safe[i] for i in chunk], chunks))
    for chunk, samples in zip(chunks, results):
        assert samples == [(gluon_files.records[i], len(gluon_files.records[i])) for i in chunk]
    assert thread_safe(original)[n - 1] == gluon_files.records[n - 1]


def test_thread_safe_leaves_other_datasets_alone(raw_file, gluon_files):
    from mxnet.gluon.data import ArrayDataset, RecordFileDataset, SimpleDataset

    from shardloader.recordio import thread_safe

    ours = RecordDataset(raw_file.rec)
    for dataset in (
        ours,
        ours.transform_first(len),
        ImageRecordDataset(gluon_files.images_rec).transform(lambda x, y: y).shard(3, 1),
        ArrayDataset(np.arange(5), np.arange(5)),
        SimpleDataset([b"a", b"b"]),
        [1, 2, 3],
        np.arange(4),
    ):
        assert thread_safe(dataset) is dataset

    # Inside an ArrayDataset: replaced there, the other parts shared.
    gluon = RecordFileDataset(gluon_files.raw)
    labels = np.arange(len(gluon))
    pair = ArrayDataset(gluon, labels)
    safe = thread_safe(pair)
    assert safe is not pair and safe._data[1] is labels and safe._data[0] is not gluon
    assert safe[5] == (gluon_files.records[5], 5)

    # The loader keeps the user's object when nothing changes, and for process workers.
    with ShardedDataLoader(ours, batch_size=10, num_workers=2, thread_pool=True) as loader:
        assert loader._dataset is ours
    with ShardedDataLoader(gluon, batch_size=10, num_workers=0) as loader:
        assert loader._dataset is gluon
    with ShardedDataLoader(gluon, batch_size=10, num_workers=2, thread_pool=True) as loader:
        assert loader._dataset is gluon  # Gluon's attribute: the user's dataset
        assert list(loader)[0] == [gluon_files.records[i] for i in range(10)]


class Holder(mx.gluon.data.Dataset):
    """A dataset class shardloader does not know, holding a Gluon record dataset."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, idx):
        return self.inner[idx]


def test_a_gluon_record_dataset_that_cannot_be_made_safe_is_refused(gluon_files, no_leaks):
    from mxnet.gluon.data import RecordFileDataset

    from shardloader.recordio import thread_safe

    hidden = Holder(RecordFileDataset(gluon_files.raw)).transform(len)
    with pytest.raises(
        TypeError,
        match=r"dataset\._data\.inner is a RecordFileDataset.*"
        r"shardloader\.recordio\.RecordDataset",
    ):
        thread_safe(hidden)
    with pytest.raises(TypeError, match="Holder"):
        ShardedDataLoader(hidden, batch_size=4, num_workers=2, thread_pool=True)
    # Loaded inline, its reads take turns instead (several threads may iterate the loader).
    with ShardedDataLoader(hidden, batch_size=4, num_workers=0) as loader:
        assert loader._dataset is hidden
        assert len(list(loader)) == -(-len(hidden) // 4)

    odd = RecordFileDataset(gluon_files.raw)
    odd._record = object()
    with pytest.raises(TypeError, match="not an MXIndexedRecordIO"):
        thread_safe(odd)


# -- every single-bit flip in every record header -----------------------------------------------

FLIP_RECORDS = [
    b"",
    b"a",
    b"ab",
    b"abc",
    b"abcd",
    b"abc\0",  # ends with a zero byte: a length one short cannot be told apart
    b"ab\0\0",
    b"x" * 9,
    b"abcd" + MAGIC + b"efgh" + MAGIC + b"ij",  # three chunks: flags 1, 2, 3
    MAGIC,  # two empty chunks
    b"zz\0",
    b"last",
]


def parse_recordio(data):
    """A strict reading of a whole .rec file, independent of the code under test: the byte
    offset and payload of every record, or None when the file is not valid RecordIO."""
    records, pos = {}, 0
    while pos < len(data):
        start, chunks, flags = pos, [], (0, 1)
        while True:
            if pos + 8 > len(data):
                return None
            magic, word = struct.unpack_from("<II", data, pos)
            flag, length = word >> 29, word & ((1 << 29) - 1)
            padded = (length + 3) // 4 * 4
            body = data[pos + 8 : pos + 8 + padded]
            if magic != 0xCED7230A or flag not in flags or len(body) < padded:
                return None
            if any(body[length:]) or (flag in (1, 2) and length % 4):
                return None
            if any(body[i : i + 4] == MAGIC for i in range(0, length - 3, 4)):
                return None  # the writer would have split the record here
            chunks.append(body[:length])
            pos += 8 + padded
            if flag in (0, 3):
                break
            flags = (2, 3)
        records[start] = MAGIC.join(chunks)
    return records


def header_offsets(data):
    """The offset of every chunk header of a valid file."""
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += 8 + ((struct.unpack_from("<I", data, pos + 4)[0] & ((1 << 29) - 1)) + 3) // 4 * 4
    return offsets


@pytest.mark.parametrize("index_kind", ["full", "sparse"])
def test_every_header_bit_flip_is_detected_or_leaves_valid_recordio(tmp_path, index_kind):
    rec, idx = pack_records(tmp_path / "clean.rec", FLIP_RECORDS)
    with open(rec, "rb") as f:
        data = f.read()
    assert parse_recordio(data) == dict(zip(offsets_of(idx), FLIP_RECORDS))
    listed = list(range(len(FLIP_RECORDS)))
    if index_kind == "sparse":  # every other record: an end is checked against the next header
        listed = listed[::2]
        with open(idx) as f:
            lines = f.readlines()
        with open(idx, "w") as f:
            f.writelines(lines[i] for i in listed)
    offsets = offsets_of(idx)
    starts = sorted(parse_recordio(data))
    record_end = [(starts + [len(data)])[starts.index(o) + 1] for o in offsets]
    headers = header_offsets(data)
    assert len(headers) == len(FLIP_RECORDS) + 3  # the magic words add three chunk headers

    damaged_rec = tmp_path / "damaged.rec"
    unseen = []
    for header in headers:
        owner = max(o for o in starts if o <= header)  # the record this header belongs to
        owner_position = offsets.index(owner) if owner in offsets else None
        for bit in range(64):  # the magic number, then the flag and length word
            flipped = bytearray(data)
            flipped[header + bit // 8] ^= 1 << (bit % 8)
            damaged_rec.write_bytes(bytes(flipped))
            dataset = RecordDataset(damaged_rec, idx)
            failed = set()
            for position, record_index in enumerate(listed):
                original = FLIP_RECORDS[record_index]
                try:
                    got = dataset[position]
                except RecordIOError as exc:
                    assert (exc.path, exc.index) == (str(damaged_rec), position)
                    assert f"record {position} (key {record_index}," in str(exc)
                    failed.add(position)
                    continue
                if got == original:
                    continue
                # Not detected, so the damage must leave valid RecordIO that says exactly this:
                # the length in the header of the record's last chunk moved within its last
                # 4-byte word, over zero bytes.
                unseen.append((header, bit, record_index))
                parsed = parse_recordio(bytes(flipped))
                assert parsed is not None, (header, bit, record_index, got)
                assert parsed[offsets[position]] == got
                assert position == owner_position and 32 <= bit < 34
                assert header == max(h for h in headers if h < record_end[position])
                shorter, longer = sorted([got, original], key=len)
                assert longer == shorter + bytes(len(longer) - len(shorter))
            if owner_position is not None and (header, bit) not in [u[:2] for u in unseen]:
                assert failed == {owner_position}, (header, bit)
            elif owner_position is None:
                # A record the .idx leaves out: only the listed record before it can notice,
                # when the damage leaves no record start right after it.
                assert failed <= {offsets.index(max(o for o in offsets if o < owner))}
            dataset.close()
    # The only flips that cannot be seen, where the records are read: b"a" -> b"a\0" or
    # b"a\0\0", b"ab" -> b"ab\0", b"x" * 9 -> plus two zeros, the "ij" chunk -> "ij\0", and
    # b"zz\0" -> b"zz".
    assert 0 < len(unseen) <= 8


# -- writing safely ---------------------------------------------------------------------------


def current_umask():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise AssertionError("no Umask line in /proc/self/status")


def test_pack_records_does_not_follow_a_planted_symlink(tmp_path):
    rec, idx = tmp_path / "data.rec", tmp_path / "data.idx"
    victims = {}
    for target in (rec, idx):
        victim = tmp_path / f"victim-{target.suffix[1:]}"
        victim.write_bytes(b"precious")
        # The temporary names that the old pack_records used, planted in advance.
        os.symlink(victim, f"{target}.{os.getpid()}.tmp")
        victims[victim] = f"{target}.{os.getpid()}.tmp"

    pack_records(rec, [b"one", b"two"])
    pack_images(rec, [np.zeros((2, 2, 3), np.uint8)], [1])  # and again, over the first pair

    for victim, link in victims.items():
        assert victim.read_bytes() == b"precious"
        assert os.readlink(link) == str(victim)
    assert not rec.is_symlink() and not idx.is_symlink()
    assert float(ImageRecordDataset(rec)[0][1]) == 1.0
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["data.rec", "data.idx", "victim-rec", "victim-idx"]
        + [os.path.basename(v) for v in victims.values()]
    )
    for path in (rec, idx):  # the mode open() would give, not mkstemp's 0600
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~current_umask()


def test_pack_records_replaces_a_symlink_at_the_target_instead_of_writing_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, tmp_path / "link.rec")
    pack_records(tmp_path / "link.rec", [b"x"])
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "link.rec").is_symlink()
    assert RecordDataset(tmp_path / "link.rec")[0] == b"x"


# -- files that cannot be read ------------------------------------------------------------------


@pytest.mark.parametrize("which", ["rec", "idx"])
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_path_that_is_not_a_regular_file_is_named(raw_file, tmp_path, which, kind):
    rec, idx = copy_pair(raw_file, tmp_path)
    target = rec if which == "rec" else idx
    os.remove(target)
    if kind == "directory":
        os.mkdir(target)
        expected = "is a directory, not a regular file"
    else:
        os.mkfifo(target)  # opening it for reading would wait for a writer forever
        expected = "is a FIFO (named pipe), not a regular file"
    with pytest.raises(RecordIOError, match=re.escape(f"{target}: the RecordIO")) as error:
        RecordDataset(rec, idx)
    assert expected in str(error.value) and error.value.path == str(target)


def test_an_unreadable_file_is_named(raw_file, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their permissions")
    rec, idx = copy_pair(raw_file, tmp_path)
    for target in (rec, idx):
        os.chmod(target, 0)
        try:
            with pytest.raises(RecordIOError, match=re.escape(f"{target}: cannot open")):
                RecordDataset(rec, idx)
        finally:
            os.chmod(target, 0o644)
    dataset = RecordDataset(rec, idx)  # readable at construction, not when it reopens
    os.chmod(rec, 0)
    try:
        with pytest.raises(RecordIOError, match=r"record 5 \(key 5.*cannot open.*denied"):
            dataset[5]
    finally:
        os.chmod(rec, 0o644)
    assert dataset[5] == raw_file.records[5]


def test_a_read_error_is_named_by_record(raw_file, monkeypatch):
    dataset = RecordDataset(raw_file.rec)
    assert dataset[3] == raw_file.records[3]

    def failing_pread(fd, size, offset):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "pread", failing_pread)
    with pytest.raises(RecordIOError, match=r"raw\.rec: record 4 \(key 4.*Input/output error"):
        dataset[4]
    monkeypatch.undo()
    assert dataset[4] == raw_file.records[4]


@pytest.mark.parametrize(
    "content, message",
    [
        (f"0\t{1 << 64}\n", "line 1: byte offset 18446744073709551616 for key 0 is past the end"),
        (f"0\t0\n{1 << 70}\t8\n", "line 2: key 1180591620717411303424 is out of the 64-bit"),
        (f"0\t{(1 << 63) - 1}\n", "1 of 1 entries point past the end"),
    ],
)
def test_huge_numbers_in_the_index_are_named(raw_file, tmp_path, content, message):
    (tmp_path / "huge.idx").write_text(content)
    with pytest.raises(RecordIOError, match=re.escape(message)):
        RecordDataset(raw_file.rec, tmp_path / "huge.idx")


def test_an_index_that_is_not_utf8_text_is_named(raw_file, tmp_path):
    (tmp_path / "binary.idx").write_bytes(b"0\t0\n\xff\xfe\x00\x01\t8\n")
    with pytest.raises(RecordIOError, match=r"binary\.idx, line 2: .*not UTF-8") as error:
        RecordDataset(raw_file.rec, tmp_path / "binary.idx")
    assert error.value.path == str(tmp_path / "binary.idx")


def test_an_offset_that_is_not_a_multiple_of_4_is_named(raw_file, tmp_path):
    offsets = offsets_of(raw_file.idx)
    (tmp_path / "odd.idx").write_text(f"0\t{offsets[0]}\n1\t{offsets[20] + 2}\n")
    dataset = RecordDataset(raw_file.rec, tmp_path / "odd.idx")
    with pytest.raises(RecordIOError, match=r"record 1 \(key 1, .*not a multiple of 4"):
        dataset[1]
    assert dataset[0] == raw_file.records[0]


def test_a_length_that_swallows_the_next_record_is_caught_with_a_sparse_index(tmp_path):
    # Record 0 is 4 bytes; record 1 is empty (a bare 8-byte header). A length of 4 + 8 makes
    # record 0 end exactly where record 2 starts, over record 1's header.
    records = [b"abcd", b"", b"wxyz"]
    rec, idx = pack_records(tmp_path / "s.rec", records)
    offsets = offsets_of(idx)
    (tmp_path / "sparse.idx").write_text(f"0\t{offsets[0]}\n2\t{offsets[2]}\n")
    write_header(rec, offsets[0], length=12)
    dataset = RecordDataset(rec, tmp_path / "sparse.idx")
    with pytest.raises(RecordIOError, match=r"record 0 \(key 0.*runs over a record header"):
        dataset[0]
    assert dataset[1] == b"wxyz"


def test_a_file_the_system_refuses_to_open_is_named(raw_file, monkeypatch):
    """The same as chmod 000 for a user who is not root (tests may run as root)."""
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if os.fspath(path) == str(raw_file.rec):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    dataset = RecordDataset(raw_file.rec)
    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(RecordIOError, match=r"raw\.rec: cannot open the RecordIO file: Permiss"):
        RecordDataset(raw_file.rec)
    with pytest.raises(RecordIOError, match=r"record 2 \(key 2.*cannot open.*Permission denied"):
        dataset[2]  # its first read opens the file
    monkeypatch.undo()
    assert dataset[2] == raw_file.records[2]


def test_image_record_dataset_says_how_it_decodes(tmp_path):
    """``flag`` and ``transform_fn`` are public (the fused image path reads them), and
    Gluon's ``Dataset.transform`` method stays what it is."""
    rec, _ = pack_images(tmp_path / "f.rec", np.zeros((2, 4, 4, 3), np.uint8), [0, 1])

    def fn(image, label):
        return image, label

    grey, coloured = ImageRecordDataset(rec, flag=0, transform=fn), ImageRecordDataset(rec)
    assert (grey.flag, grey.transform_fn) == (0, fn)
    assert (coloured.flag, coloured.transform_fn) == (1, None)
    assert grey[0][0].shape == (4, 4, 1) and coloured[0][0].shape == (4, 4, 3)
    assert len(coloured.transform(lambda image, label: label)) == 2


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(0, 9000),
    places=st.lists(st.integers(0, 9000), max_size=4),
    cut=st.integers(0, 9000),
)
def test_the_magic_search_finds_the_first_aligned_copy_at_every_length(size, places, cut):
    """``_aligned_magic`` searches short data and compares long data word by word (from
    4,096 bytes): both give the first 4-aligned copy wholly inside ``data[:length]``."""
    from shardloader.recordio._format import _MAGIC_BYTES, _aligned_magic

    data = bytearray(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8))
    for place in places:
        if place + 4 <= size:
            data[place : place + 4] = _MAGIC_BYTES
    length = min(cut, size)
    expected = next((p for p in range(0, length - 3, 4) if data[p : p + 4] == _MAGIC_BYTES), -1)
    assert _aligned_magic(bytes(data), length) == expected


def test_a_long_record_that_swallows_the_next_header_is_caught(tmp_path):
    """The word-by-word search (records from 4,096 bytes) catches a length field that runs
    over the next record's header, as the short search does."""
    records = [bytes(8192), b"", b"wxyz"]
    rec, idx = pack_records(tmp_path / "long.rec", records)
    offsets = offsets_of(idx)
    (tmp_path / "sparse.idx").write_text(f"0\t{offsets[0]}\n2\t{offsets[2]}\n")
    write_header(rec, offsets[0], length=8192 + 8)
    dataset = RecordDataset(rec, tmp_path / "sparse.idx")
    with pytest.raises(RecordIOError, match=r"record 0 \(key 0.*runs over a record header"):
        dataset[0]
    assert dataset[1] == b"wxyz"
