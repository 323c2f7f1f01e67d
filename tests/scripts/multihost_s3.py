"""The lab's object-storage scenario: two machines read their parts of ``s3://`` RecordIO from
a SeaweedFS server on h1 (used by tests/scripts/multihost_lab.py's ``Scenarios.s3``).

Three roles, one file:

- ``scenario(scenarios, run_dir)`` (in the driver): takes the small ``.rec``/``.idx`` that
  ``prepare`` packed (or packs it), starts the server on h1 (``serve``), launches a
  ``dist_sync`` job whose workers are on h2 and h3 (``machine``) with each host's own
  ``XDG_CACHE_HOME``, stops the server once both machines have read their first epoch, and
  reports.
- ``serve FOLDER ADDRESS REC IDX`` (on h1): ``weed mini`` bound to ADDRESS, the bucket
  ``lab`` holding the pair as ``data.rec``/``data.idx``; prints ``ready ENDPOINT`` and serves
  until its stdin closes.
- ``machine RUN_DIR URL`` (under the launcher): reads its part (``num_parts`` and
  ``part_index`` from the kvstore) with two process workers, writes ``epoch0-rank<r>``, waits
  for ``server-stopped``, reads its part again through a fresh loader, and writes
  ``rank<r>.json``: each epoch's records (index, SHA-256) and the cache's entries (one per
  ranged GET of the machine, named by its bytes) after each epoch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NUM_RECORDS = 160
CHUNK_BYTES = 16 * 1024
MAX_RECORD_BYTES = 4 + 2400  # its index and its payload
_WAIT_S = 60


def make_records() -> list:
    """Records of 4 + 400-2400 bytes, each starting with its index."""
    import numpy as np

    rng = np.random.default_rng(29)
    sizes = rng.integers(400, 2400, size=NUM_RECORDS)
    return [i.to_bytes(4, "little") + rng.bytes(int(n)) for i, n in enumerate(sizes)]


def digest(record: bytes) -> str:
    return hashlib.sha256(record).hexdigest()


def _wait_for(paths, deadline_s: float, alive=lambda: True) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and alive():
        if all(p.exists() for p in paths):
            return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------------- the driver's side


def prepare(out_dir: Path) -> None:
    """Pack the records into ``OUT_DIR/s3-data.rec`` (and ``.idx``), with their digests in
    ``s3-data.json``. The test calls it before the driver, in a process that has imported
    MXNet already: importing it in the driver would take seconds of the scenario's time."""
    from shardloader.recordio import pack_records

    records = make_records()
    pack_records(out_dir / "s3-data.rec", records)
    (out_dir / "s3-data.json").write_text(json.dumps([digest(r) for r in records]))


def scenario(scenarios, run_dir: Path) -> dict:
    lab = scenarios.lab
    data = run_dir.parent / "s3-data"
    if not data.with_suffix(".json").exists():  # the driver run by hand
        prepare(run_dir.parent)
    rec, idx = str(data.with_suffix(".rec")), str(data.with_suffix(".idx"))
    h1 = lab.host("h1").address
    with open(run_dir / "serve.log", "wb") as log:
        server = lab.popen(
            "h1",
            [sys.executable, __file__, "serve", str(run_dir / "weed"), h1, rec, idx],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
    try:
        line = server.stdout.readline().decode().split()
        if line[:1] != ["ready"]:
            log_text = (run_dir / "serve.log").read_text()
            raise RuntimeError(f"the server on h1 did not start: {log_text}")
        endpoint = line[1]
        started = time.monotonic()
        # Each host's own cache folder, as on separate machines.
        template = f"{lab.template} env XDG_CACHE_HOME={run_dir}/cache-{{host}}"
        proc = scenarios.launcher(
            lab.hosts_arg(),
            "--env", f"AWS_ENDPOINT_URL={endpoint}",
            "--env", "AWS_ACCESS_KEY_ID=shardloader-test",
            "--env", "AWS_SECRET_ACCESS_KEY=shardloader-test-secret",
            "--env", "AWS_DEFAULT_REGION=us-east-1",
            "--env", "SHARDLOADER_S3_ATTEMPTS=2",
            "--env", "SHARDLOADER_S3_CONNECT_TIMEOUT=2",
            "--timeout", "80",
            sys.executable, __file__, "machine", str(run_dir), "s3://lab/data.rec",
            template=template,
        )  # fmt: skip
        first = [run_dir / f"epoch0-rank{r}" for r in (0, 1)]
        read_first = _wait_for(first, _WAIT_S, lambda: proc.poll() is None)
    finally:
        server.stdin.close()  # stops the server
        server.wait(timeout=30)
    (run_dir / "server-stopped").touch()
    report = scenarios.finish(
        proc,
        started,
        read_first=read_first,
        server_code=server.returncode,
        expected=json.loads(data.with_suffix(".json").read_text()),
        offsets=[int(line.split()[1]) for line in Path(idx).read_text().splitlines()],
        size=os.path.getsize(rec),
        chunk_bytes=CHUNK_BYTES,
    )
    report["ranks"] = [json.loads(p.read_text()) for p in sorted(run_dir.glob("rank*.json"))]
    return report


# ---------------------------------------------------------------------- on h1


def serve(folder: str, address: str, rec: str, idx: str) -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.s3server import Weed

    weed = Weed(folder, address)
    weed.start()
    try:
        client = weed.client()
        client.create_bucket(Bucket="lab")
        for path, key in ((rec, "data.rec"), (idx, "data.idx")):
            with open(path, "rb") as f:
                client.put_object(Bucket="lab", Key=key, Body=f.read())
        print("ready", weed.endpoint, flush=True)
        sys.stdin.read()
    finally:
        weed.kill()  # gone at once (stop() waits out weed's 2 s graceful shutdown)


# ---------------------------------------------------------------------- on h2 and h3


def _cache_entries() -> list:
    """The machine's cached ranges, ``[start, stop]``: one per ranged GET it made."""
    from shardloader.recordio import _cache

    root = Path(_cache.default_root()) / "objects"
    names = [p.name for p in root.glob("*/*") if re.fullmatch(r"\d+-\d+", p.name)]
    return sorted([int(n) for n in name.split("-")] for name in names)


def _epoch(loader) -> list:
    got = [(int.from_bytes(r[:4], "little"), digest(r)) for batch in loader for r in batch]
    loader.close()
    return got


def machine(run_dir: str, url: str) -> None:
    import mxnet as mx  # a scheduler or server runs its role here and exits

    from shardloader import ShardedDataLoader
    from shardloader.distributed import fail_fast, parts_from_kvstore
    from shardloader.recordio import RecordDataset, _source

    _source._CHUNK_BYTES = CHUNK_BYTES  # several GETs per part; the workers are forked
    kv = mx.kv.create("dist_sync")
    out = Path(run_dir)
    with fail_fast(kv):
        num_parts, part_index = parts_from_kvstore(kv)
        dataset = RecordDataset(url)  # the cache under this host's $XDG_CACHE_HOME

        def loader():
            return ShardedDataLoader(
                dataset, batch_size=8, num_parts=num_parts, part_index=part_index,
                num_workers=2, batchify_fn=list, timeout=60,
            )  # fmt: skip

        first = _epoch(loader())
        fetched = _cache_entries()
        (out / f"epoch0-rank{kv.rank}").touch()
        if not _wait_for([out / "server-stopped"], _WAIT_S):
            sys.exit("the driver did not stop the server")
        dataset.close()  # drops this process's maps; the fresh workers read the cache's files
        second = _epoch(loader())
        report = {
            "rank": kv.rank,
            "host": os.environ["DMLC_NODE_HOST"],
            "cache": os.environ["XDG_CACHE_HOME"],
            "num_parts": num_parts,
            "epochs": [first, second],
            "fetched": fetched,
            "fetched_after": _cache_entries(),
        }
    path = out / f"rank{kv.rank}.json"
    path.with_suffix(".tmp").write_text(json.dumps(report))
    os.replace(path.with_suffix(".tmp"), path)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    if sys.argv[1] == "serve":
        serve(*sys.argv[2:])
    else:
        machine(*sys.argv[2:])
