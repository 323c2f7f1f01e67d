"""W5 from S3-compatible object storage: ``python -m benchmarks.s3 [--quick] [--rounds N]``.

A real server (SeaweedFS's ``weed mini``, :mod:`benchmarks.s3server`) on 127.0.0.1 holds W5's
``.rec``/``.idx``. Each round, in this order, reads one shuffled epoch of W5's pipeline
(shardloader's ``ImageRecordDataset`` + W5's transforms, batch 64, 2 worker processes):

1. **cold**: from ``s3://``, with an empty cache: every chunk comes from the server;
2. **cached**: the next epoch of the same loader: every chunk comes from the cache;
3. **local**: two epochs of the local file;
4. **cold, no read-ahead**: a cold epoch with the readers' read-ahead turned off (each worker
   then has one GET in flight at a time), to measure what the read-ahead gains. Rounds
   alternate which cold epoch comes first.

Rates are images per second. The ratios are within a round (paired), and first epochs are
compared with first epochs (both start their workers): cold over the local file's first
epoch, cached over its second, cold over cold without read-ahead; the summary gives their
medians. Requests per epoch are counted as the chunks the cache received (each chunk is one
ranged GET; opening a dataset adds one HEAD and one GET of the ``.idx``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Dict, List, Optional

from . import images


def _epoch(loader: Any) -> float:
    started = time.perf_counter()
    count = 0
    for data, _ in loader:
        count += data.shape[0]
    return count / (time.perf_counter() - started)


def _chunks(cache: str) -> int:
    return sum(
        1
        for _, _, names in os.walk(os.path.join(cache, "objects"))
        for name in names
        if not name.endswith(".lock") and not name.startswith(".tmp-")
    )


def _loader(path: str, cache: str, workers: int) -> Any:
    from shardloader import ShardedDataLoader
    from shardloader.recordio import ImageRecordDataset

    dataset = ImageRecordDataset(path, cache_dir=cache).transform_first(images.jpeg_transform())
    return ShardedDataLoader(
        dataset, batch_size=64, shuffle=True, num_workers=workers, seed=0, last_batch="discard"
    )


def _cold_without_read_ahead(url: str, cache: str, workers: int) -> float:
    """A cold epoch with read-ahead off (the worker processes fork with the setting)."""
    from shardloader.recordio import _source

    ahead, _source._AHEAD = _source._AHEAD, 0
    try:
        with _loader(url, cache, workers) as loader:
            return _epoch(loader)
    finally:
        _source._AHEAD = ahead


def run(n: int, rounds: int, workers: int, folder: str) -> Dict[str, Any]:
    from .s3server import Weed

    rec = images.jpeg_records(folder, n)
    weed = Weed(os.path.join(folder, "weed"))
    weed.start()
    try:
        client = weed.client()
        client.create_bucket(Bucket="bench")
        for path, suffix in ((rec, ".rec"), (os.path.splitext(rec)[0] + ".idx", ".idx")):
            with open(path, "rb") as f:
                client.put_object(Bucket="bench", Key="w5" + suffix, Body=f.read())
        os.environ.update(weed.env())
        url = "s3://bench/w5.rec"
        results: List[Dict[str, Any]] = []
        for number in range(rounds):
            cache = os.path.join(folder, f"cache{number}")
            plain_cache = os.path.join(folder, f"plain{number}")
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(plain_cache, ignore_errors=True)
            if number % 2:
                plain = _cold_without_read_ahead(url, plain_cache, workers)
            with _loader(url, cache, workers) as loader:
                cold = _epoch(loader)
                cold_requests = _chunks(cache)
                cached = _epoch(loader)
                cached_requests = _chunks(cache) - cold_requests
            with _loader(rec, cache, workers) as loader:
                local_first = _epoch(loader)
                local = _epoch(loader)
            if not number % 2:
                plain = _cold_without_read_ahead(url, plain_cache, workers)
            results.append(
                {
                    "cold": cold,
                    "cached": cached,
                    "local_first": local_first,
                    "local": local,
                    "cold_requests": cold_requests + 2,
                    "cached_requests": cached_requests,
                    "cached_over_local": cached / local,
                    "cold_over_local": cold / local_first,
                    "cold_no_read_ahead": plain,
                    "cold_over_no_read_ahead": cold / plain,
                    "cold_no_read_ahead_over_local": plain / local_first,
                }
            )
            print(json.dumps({"round": number, **results[-1]}), flush=True)
    finally:
        weed.stop()
    summary = {
        key: statistics.median(r[key] for r in results)
        for key in (
            "cold",
            "cached",
            "local_first",
            "local",
            "cached_over_local",
            "cold_over_local",
            "cold_no_read_ahead",
            "cold_over_no_read_ahead",
            "cold_no_read_ahead_over_local",
        )
    }
    return {
        "images": n,
        "bytes": os.path.getsize(rec),
        "workers": workers,
        "rounds": results,
        "median": summary,
        "requests": {"cold": results[0]["cold_requests"], "cached": results[0]["cached_requests"]},
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="512 images, 2 rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args(argv)
    n, rounds = (512, 2) if args.quick else (2048, args.rounds)
    with tempfile.TemporaryDirectory(prefix="shardloader-s3-bench-") as folder:
        result = run(n, rounds, args.workers, folder)
    median = result["median"]
    print(
        f"W5 from S3 ({n} JPEGs, {result['bytes'] / 1e6:.1f} MB, {args.workers} workers, "
        f"{rounds} rounds): cold {median['cold']:.0f} img/s, cached {median['cached']:.0f} "
        f"img/s, local {median['local_first']:.0f} then {median['local']:.0f} img/s; "
        f"cached/local {median['cached_over_local']:.2f}, "
        f"cold/local {median['cold_over_local']:.2f}; cold without read-ahead "
        f"{median['cold_no_read_ahead']:.0f} img/s, cold with/without "
        f"{median['cold_over_no_read_ahead']:.2f}; requests per epoch: cold "
        f"{result['requests']['cold']}, cached {result['requests']['cached']}"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
