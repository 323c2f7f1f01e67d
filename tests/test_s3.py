"""Records read from S3-compatible object storage: a real server (SeaweedFS's ``weed mini``)
on 127.0.0.1, the same bytes and batches as the local file, the per-machine cache (the second
epoch with the server gone, damaged and stale entries, unsafe folders), each machine's part,
and a clear error naming the URL for every fault."""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest

pytest.importorskip("boto3")

from benchmarks.s3server import Weed  # noqa: E402
from shardloader import ShardedDataLoader  # noqa: E402
from shardloader.recordio import (  # noqa: E402
    ImageRecordDataset,
    RecordDataset,
    RecordIOError,
    _s3,
    _source,
    pack_images,
    pack_records,
)

pytestmark = pytest.mark.timeout(90)

MAGIC = b"\x0a\x23\xd7\xce"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    weed = Weed(str(tmp_path_factory.mktemp("weed")))
    weed.start()
    weed.client().create_bucket(Bucket="data")
    yield weed
    weed.kill()


@pytest.fixture
def s3env(server, monkeypatch):
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SHARDLOADER_S3_ATTEMPTS", "2")
    monkeypatch.setenv("SHARDLOADER_S3_CONNECT_TIMEOUT", "2")
    return server


def upload(server, rec, idx, key, bucket="data"):
    client = server.client()
    for path, suffix in ((rec, ".rec"), (idx, ".idx")):
        with open(path, "rb") as f:
            client.put_object(Bucket=bucket, Key=key + suffix, Body=f.read())
    return f"s3://{bucket}/{key}.rec"


@pytest.fixture(scope="module")
def raw(tmp_path_factory, server):
    """600 raw records of 0-3000 bytes, some holding RecordIO's magic number, one empty."""
    rng = np.random.default_rng(1)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 3000, size=600)]
    records[3] = b""
    records[10] = MAGIC * 3 + b"x"
    rec, idx = pack_records(tmp_path_factory.mktemp("raw") / "raw.rec", records)
    url = upload(server, rec, idx, "raw")
    return types.SimpleNamespace(rec=str(rec), idx=str(idx), records=records, url=url)


@pytest.fixture(scope="module")
def images(tmp_path_factory, server):
    """96 random 40x48 RGB images, JPEG-encoded, with labels 0..95."""
    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 256, size=(96, 40, 48, 3), dtype=np.uint8)
    rec, idx = pack_images(
        tmp_path_factory.mktemp("img") / "img.rec", pixels, np.arange(96), img_fmt=".jpg"
    )
    url = upload(server, rec, idx, "img/train")
    return types.SimpleNamespace(rec=str(rec), idx=str(idx), url=url)


def test_the_bytes_are_the_local_readers(raw, images, s3env, tmp_path):
    remote = RecordDataset(raw.url, cache_dir=tmp_path / "cache")
    assert remote.idx_path == "s3://data/raw.idx"
    local = RecordDataset(raw.rec)
    assert len(remote) == len(local) == len(raw.records)
    assert [remote[i] for i in range(len(remote))] == raw.records
    remote_images = ImageRecordDataset(images.url, cache_dir=tmp_path / "cache")
    local_images = ImageRecordDataset(images.rec)
    for i in (0, 17, 95):
        (a, la), (b, lb) = remote_images[i], local_images[i]
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
        assert la == lb


def test_requests_are_coalesced_and_the_cache_is_shared(raw, s3env, tmp_path, monkeypatch):
    monkeypatch.setattr(_source, "_CHUNK_BYTES", 64 * 1024)
    first = RecordDataset(raw.url, cache_dir=tmp_path)
    for i in range(len(first)):
        first[i]
    size = first._source.size
    fetched = sorted(first._source.requests)
    # Neighbouring records share a request; each byte is fetched once.
    assert 1 < len(fetched) <= size // (64 * 1024) + 1
    assert fetched[0][0] == 0 and fetched[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(fetched, fetched[1:]))
    # A second loader on this machine reads from the cache: no request.
    second = RecordDataset(raw.url, cache_dir=tmp_path)
    assert [second[i] for i in range(len(second))] == raw.records
    assert second._source.requests == []


@pytest.mark.parametrize("shuffled", [False, True], ids=["in-order", "shuffled-read-ahead"])
def test_each_machine_fetches_only_its_part(raw, s3env, tmp_path, monkeypatch, shuffled):
    from shardloader.sampler import SplitSampler

    monkeypatch.setattr(_source, "_CHUNK_BYTES", 16 * 1024)
    fetched = []
    for part in (0, 1):
        dataset = RecordDataset(raw.url, cache_dir=tmp_path / f"machine{part}")
        # Shuffled within the part, the reads ahead run, and stay in the part's records.
        split = SplitSampler(len(dataset), num_parts=2, part_index=part, shuffle=True, seed=4)
        parts = {"sampler": split} if shuffled else {"num_parts": 2, "part_index": part}
        loader = ShardedDataLoader(dataset, batch_size=50, batchify_fn=list, **parts)
        got = [record for batch in loader for record in batch]
        half = len(raw.records) // 2
        mine = raw.records[part * half : (part + 1) * half]
        assert sorted(got) == sorted(mine) and (shuffled or got == mine)
        dataset.close()  # waits for the reads ahead under way
        fetched.append(sum(stop - start for start, stop in dataset._source.requests))
    size = os.path.getsize(raw.rec)
    # Each machine fetches its half, and at most the one chunk around the cut in common.
    assert sum(fetched) >= size
    assert all(part_bytes <= size / 2 + 16 * 1024 + 3100 for part_bytes in fetched)


def test_process_workers_over_gluon_transforms_give_the_local_batches(
    images, s3env, tmp_path, no_leaks
):
    from mxnet.gluon.data.vision import transforms

    augment = transforms.Compose(
        [transforms.RandomResizedCrop(32), transforms.RandomFlipLeftRight(), transforms.ToTensor()]
    )

    def batches(path):
        dataset = ImageRecordDataset(path, cache_dir=tmp_path).transform_first(augment)
        with ShardedDataLoader(
            dataset, batch_size=16, shuffle=True, num_workers=2, seed=7, timeout=60
        ) as loader:
            return [(x.asnumpy(), y.asnumpy()) for x, y in loader]

    remote, local = batches(images.url), batches(images.rec)
    assert len(remote) == len(local) == 6
    for (a, la), (b, lb) in zip(remote, local):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


def test_the_fused_image_loader_reads_s3(images, s3env, tmp_path, monkeypatch):
    from shardloader.vision import ImageRecordLoader

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def batches(path):
        loader = ImageRecordLoader(path_imgrec=path, data_shape=(3, 32, 32), batch_size=32)
        return [(x.asnumpy(), y.asnumpy()) for x, y in loader]

    remote, local = batches(images.url), batches(images.rec)
    assert len(remote) == 3
    for (a, la), (b, lb) in zip(remote, local):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    assert os.listdir(tmp_path / "shardloader" / "objects")  # the default cache folder


@contextlib.contextmanager
def own_server(tmp_path, monkeypatch, raw, bucket):
    """A server of the test's own, which it may kill, holding ``raw`` in ``bucket``; the
    environment points at it, with short retries. Killed at the end, and this process's
    client closed (it keeps its connections pooled for the next dataset, by design). (The
    tests kill their servers: a killed server is gone as surely as a stopped one, without
    weed's 2 s of graceful shutdown.)"""
    weed = Weed(str(tmp_path / "weed"))
    weed.start()
    try:
        weed.client().create_bucket(Bucket=bucket)
        url = upload(weed, raw.rec, raw.idx, "raw", bucket=bucket)
        for name, value in weed.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("SHARDLOADER_S3_ATTEMPTS", "2")
        monkeypatch.setenv("SHARDLOADER_S3_CONNECT_TIMEOUT", "1")
        yield weed, url
    finally:
        weed.kill()
        _s3.close_clients()


def test_the_second_epoch_comes_from_the_cache_with_the_server_gone(
    raw, tmp_path, monkeypatch, no_leaks
):
    with own_server(tmp_path, monkeypatch, raw, "gone") as (weed, url):
        monkeypatch.setattr(_source, "_CHUNK_BYTES", 16 * 1024)
        dataset = RecordDataset(url, cache_dir=tmp_path / "cache")
        loader = ShardedDataLoader(dataset, batch_size=100, num_parts=2, batchify_fn=list)
        first = [r for batch in loader for r in batch]
        requests = len(dataset._source.requests)
        assert requests > 1
        weed.kill()
        dataset.close()  # drops this process's maps: the second epoch reads the cache's files
        second = [r for batch in loader for r in batch]
        assert second == first == raw.records[:300]
        assert len(dataset._source.requests) == requests  # none more
        # A record of the other part was never fetched: a clear error naming URL and record.
        started = time.monotonic()
        with pytest.raises(RecordIOError, match=r"s3://gone/raw\.rec: record 599 .*cannot reach"):
            dataset[599]
        assert time.monotonic() - started < 30
        dataset.close()


def test_a_damaged_cache_entry_is_fetched_again(raw, s3env, tmp_path):
    dataset = RecordDataset(raw.url, cache_dir=tmp_path)
    assert dataset[5] == raw.records[5]
    (entry,) = [
        os.path.join(d, n)
        for d, _, names in os.walk(tmp_path / "objects")
        for n in names
        if not n.endswith(".lock")
    ]
    with open(entry, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff")
    fresh = RecordDataset(raw.url, cache_dir=tmp_path)
    assert [fresh[i] for i in range(len(fresh))] == raw.records
    assert len(fresh._source.requests) == 1


def test_a_changed_object_is_never_served_stale(raw, s3env, tmp_path):
    server = s3env
    url = upload(server, raw.rec, raw.idx, "changing")
    assert RecordDataset(url, cache_dir=tmp_path)[0] == raw.records[0]
    records = [b"new %d" % i for i in range(5)]
    rec, idx = pack_records(tmp_path / "new.rec", records)
    upload(server, rec, idx, "changing")
    dataset = RecordDataset(url, cache_dir=tmp_path)
    assert [dataset[i] for i in range(5)] == records


def test_a_cache_folder_others_can_write_is_refused(raw, s3env, tmp_path):
    from shardloader._folders import UnsafeFolder

    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(UnsafeFolder, match=r"can be written by others.*cache_dir="):
        RecordDataset(raw.url, cache_dir=folder)


@pytest.mark.parametrize(
    "url, env, message",
    [
        ("s3://data/missing.rec", {}, r"s3://data/missing\.rec: cannot open the object: no such"),
        ("s3://nobucket/raw.rec", {}, r"s3://nobucket/raw\.rec: cannot open the object: "),
        (
            "s3://data/raw.rec",
            {"AWS_SECRET_ACCESS_KEY": "wrong"},
            r"s3://data/raw\.rec: cannot open the object: access denied",
        ),
        (
            "s3://data/raw.rec",
            {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
            r"s3://data/raw\.rec: .*cannot reach the server at http://127\.0\.0\.1:9",
        ),
    ],
    ids=["missing-key", "missing-bucket", "wrong-credentials", "server-down"],
)
def test_faults_at_the_start_name_the_url(raw, s3env, tmp_path, monkeypatch, url, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    with pytest.raises(RecordIOError, match=message):
        RecordDataset(url, cache_dir=tmp_path)
    assert time.monotonic() - started < 30


def test_a_missing_index_is_named(raw, s3env, tmp_path):
    s3env.client().put_object(Bucket="data", Key="noindex.rec", Body=b"")
    with pytest.raises(RecordIOError, match=r"s3://data/noindex\.idx: cannot read the object"):
        RecordDataset("s3://data/noindex.rec", cache_dir=tmp_path)


def test_an_index_of_another_file_names_the_record(raw, images, s3env, tmp_path):
    s3env.client().copy_object(
        Bucket="data", Key="mixed.rec", CopySource={"Bucket": "data", "Key": "raw.rec"}
    )
    s3env.client().copy_object(
        Bucket="data", Key="mixed.idx", CopySource={"Bucket": "data", "Key": "img/train.idx"}
    )
    dataset = RecordDataset("s3://data/mixed.rec", cache_dir=tmp_path)
    errors = 0
    for i in range(len(dataset)):
        try:
            dataset[i]
        except RecordIOError as exc:
            assert str(exc).startswith(f"s3://data/mixed.rec: record {i} ")
            errors += 1
    assert errors > len(dataset) // 2


def test_a_truncated_object_is_an_error_never_wrong_bytes(raw, s3env, tmp_path):
    with open(raw.rec, "rb") as f:
        data = f.read()
    client = s3env.client()
    client.put_object(Bucket="data", Key="cut.rec", Body=data[: len(data) - 1001])
    client.copy_object(
        Bucket="data", Key="cut.idx", CopySource={"Bucket": "data", "Key": "raw.idx"}
    )
    with pytest.raises(RecordIOError, match=r"point past the end of s3://data/cut\.rec"):
        RecordDataset("s3://data/cut.rec", cache_dir=tmp_path)
    # Cut inside the last record: that record is an error, the others are exact.
    client.put_object(Bucket="data", Key="cut.rec", Body=data[:-3])
    dataset = RecordDataset("s3://data/cut.rec", cache_dir=tmp_path)
    assert [dataset[i] for i in range(len(dataset) - 1)] == raw.records[:-1]
    with pytest.raises(RecordIOError, match=r"s3://data/cut\.rec: record 599 "):
        dataset[599]


@pytest.mark.timeout(60)
def test_without_boto3_an_s3_path_says_how_to_install():
    code = (
        "import sys; sys.modules['boto3'] = None\n"
        "from shardloader.recordio import RecordDataset\n"
        "try:\n    RecordDataset('s3://data/raw.rec')\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True
    ).stdout
    clone = pathlib.Path(__file__).resolve().parent.parent
    assert "needs the 's3' extra" in out
    assert f"-e '{clone}[s3]'" in out  # the clone the test runs from
    assert "pip install boto3==1.35.99" in out


@pytest.mark.timeout(150)
def test_shardloader_bench_reads_s3(images, s3env, tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=os.getcwd())
    proc = subprocess.run(
        [sys.executable, "-m", "shardloader", "bench", "--recordio", images.url,
         "--workers", "0", "--batches", "2", "--batch-size", "8", "--crop-size", "32",
         "--rounds", "1"],
        capture_output=True, text=True, timeout=140, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{images.url} through shardloader's ImageRecordDataset" in proc.stdout


def _read_all_and_report(url, cache, chunk_bytes, conn, seed=None):
    _source._CHUNK_BYTES = chunk_bytes
    dataset = RecordDataset(url, cache_dir=cache)
    order = range(len(dataset))
    if seed is not None:  # shuffled: the reads ahead fetch most chunks
        order = np.random.default_rng(seed).permutation(len(dataset)).tolist()
    got = {i: dataset[i] for i in order}
    dataset.close()  # waits for the reads ahead under way
    conn.send(([got[i] for i in range(len(dataset))], dataset._source.requests))
    conn.close()


@pytest.mark.parametrize("shuffled", [False, True], ids=["in-order", "shuffled-read-ahead"])
def test_processes_of_a_machine_fetch_each_chunk_once(raw, s3env, tmp_path, no_leaks, shuffled):
    import multiprocessing

    context = multiprocessing.get_context("fork")
    pipes, processes = [], []
    for seed in range(3):
        ours, theirs = context.Pipe(duplex=False)
        process = context.Process(
            target=_read_all_and_report,
            args=(raw.url, str(tmp_path), 32 * 1024, theirs, seed if shuffled else None),
        )
        process.start()
        theirs.close()
        pipes.append(ours)
        processes.append(process)
    try:
        results = [pipe.recv() for pipe in pipes]
    finally:
        for pipe, process in zip(pipes, processes):
            process.join(30)
            pipe.close()
    assert [process.exitcode for process in processes] == [0, 0, 0]
    fetched = sorted(request for _, requests in results for request in requests)
    assert all(records == raw.records for records, _ in results)
    # Three processes read every record at once; each chunk came from the server once.
    assert len(fetched) == len(set(fetched)) > 10
    assert fetched[0][0] == 0 and fetched[-1][1] == os.path.getsize(raw.rec)
    assert all(a[1] == b[0] for a, b in zip(fetched, fetched[1:]))


def test_the_cache_stays_within_its_bound(raw, s3env, tmp_path, monkeypatch):
    monkeypatch.setattr(_source, "_CHUNK_BYTES", 32 * 1024)
    monkeypatch.setattr(_source, "_MEMORY_CHUNKS", 2)
    bound = 200 * 1024
    dataset = RecordDataset(raw.url, cache_dir=tmp_path, cache_bytes=bound)
    for _ in range(2):  # the second pass refetches what was evicted
        assert [dataset[i] for i in range(len(dataset))] == raw.records
    # Its reads ahead end: none writes or evicts an entry while the folder is measured (an
    # entry evicted between the walk and its getsize failed the test once, FileNotFoundError).
    dataset.close()

    def held():
        return sum(
            os.path.getsize(os.path.join(d, n))
            for d, _, names in os.walk(tmp_path / "objects")
            for n in names
            if not n.endswith(".lock")
        )

    # Checked every bound/8 bytes written: at most that, and a chunk, over the bound.
    assert held() <= bound + bound // 8 + 40 * 1024
    assert len(dataset._source.requests) > 2 * (os.path.getsize(raw.rec) // (40 * 1024))


def test_a_server_gone_mid_epoch_fails_the_workers_epoch_clearly(
    raw, tmp_path, monkeypatch, no_leaks
):
    with own_server(tmp_path, monkeypatch, raw, "mid") as (weed, url):
        monkeypatch.setattr(_source, "_CHUNK_BYTES", 8 * 1024)
        dataset = RecordDataset(url, cache_dir=tmp_path / "cache")
        started = time.monotonic()
        loader = ShardedDataLoader(
            dataset, batch_size=10, num_workers=2, batchify_fn=list, timeout=60
        )
        gone = r"s3://mid/raw\.rec: record \d+ .*cannot reach"
        with pytest.raises(RecordIOError, match=gone), loader:
            for number, batch in enumerate(loader):
                assert batch == raw.records[number * 10 : number * 10 + 10]
                if number == 0:
                    weed.kill()
        assert time.monotonic() - started < 45


def test_reads_ahead_fetch_each_chunk_once_and_end_with_the_dataset(
    raw, s3env, tmp_path, monkeypatch, no_leaks
):
    monkeypatch.setattr(_source, "_CHUNK_BYTES", 16 * 1024)
    dataset = RecordDataset(raw.url, cache_dir=tmp_path)
    last = len(dataset) - 1
    assert (dataset[0], dataset[last]) == (raw.records[0], raw.records[last])
    # The two reads asked for the first and the last chunk; the reads ahead fetch those
    # between, on threads of their own.
    assert any(t.name == "shardloader-s3-read-ahead" for t in threading.enumerate())
    order = np.random.default_rng(3).permutation(len(dataset)).tolist()
    assert all(dataset[i] == raw.records[i] for i in order)
    dataset.close()
    assert not any(t.name == "shardloader-s3-read-ahead" for t in threading.enumerate())
    fetched = sorted(dataset._source.requests)
    assert len(fetched) == len(set(fetched)) > 10
    assert fetched[0][0] == 0 and fetched[-1][1] == os.path.getsize(raw.rec)
    assert all(a[1] == b[0] for a, b in zip(fetched, fetched[1:]))
    # The client keeps the reads' connections pooled for the next dataset, by design.
    _s3.close_clients()


def test_a_read_ahead_failure_is_raised_at_the_record_that_needs_it(
    raw, tmp_path, monkeypatch, no_leaks
):
    with own_server(tmp_path, monkeypatch, raw, "ahead") as (weed, url):
        monkeypatch.setattr(_source, "_CHUNK_BYTES", 8 * 1024)
        dataset = RecordDataset(url, cache_dir=tmp_path / "cache")
        last = len(dataset) - 1
        dataset[0], dataset[last]  # the reads ahead fetch a few chunks after the first
        dataset.close()
        fetched = {start for start, _ in dataset._source.requests}
        offsets = dataset._offsets
        starts = dataset._source.chunk_starts(offsets).tolist()
        assert len(fetched) > 2 and starts[1] in fetched
        missing = min(start for start in starts if start not in fetched)
        weed.kill()
        started = time.monotonic()
        # From the cache: the reads ahead it starts fail, and are not raised here.
        assert dataset[last] == raw.records[last]
        second = int(np.flatnonzero(offsets == starts[1])[0])
        assert dataset[second] == raw.records[second]
        record = int(np.flatnonzero(offsets == missing)[0])
        with pytest.raises(
            RecordIOError, match=rf"s3://ahead/raw\.rec: record {record} .*cannot reach"
        ):
            dataset[record]
        dataset.close()
        assert time.monotonic() - started < 30
