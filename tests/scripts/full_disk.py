"""``pack_records`` and ``pack_images`` into a file system that fills up (issue 32, item 3).
Run it in a mount namespace of its own, with DIR a fresh 1 MiB tmpfs: 40 records of 30 kB do
not fit. Prints one JSON line per writer: the error, the descriptors left open, the files
left in DIR, and whether a small pair fits afterwards (the space came back). Last, one small
record into a disk that is already full.

    unshare --mount --propagation private python tests/scripts/full_disk.py DIR
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np

from shardloader.recordio import pack_images, pack_records


def fds():
    return set(os.listdir("/proc/self/fd"))


def attempt(directory: str, name: str, write, filler: str = "") -> dict:
    out = {"writer": name}
    before = fds()
    try:
        write(os.path.join(directory, f"{name}.rec"))
        out["outcome"] = "written"
    except Exception as exc:  # noqa: BLE001 - what it raised is the point
        out["outcome"] = "raised"
        out["type"] = type(exc).__name__
        out["message"] = str(exc)
        out["key"] = getattr(exc, "key", None)
        out["traceback"] = "".join(traceback.format_exception(exc))
        # Nothing raised while cleaning up: the error's context is its cause, if anything.
        out["clean_context"] = exc.__context__ in (None, exc.__cause__)
    out["fds_left"] = sorted(
        os.readlink(f"/proc/self/fd/{fd}")
        for fd in fds() - before
        if os.path.exists(f"/proc/self/fd/{fd}")
    )
    out["files_left"] = sorted(set(os.listdir(directory)) - {os.path.basename(filler)})
    if filler:
        os.remove(filler)
    # The space is free again: a pair of 600 kB fits now.
    small = os.path.join(directory, "small.rec")
    pack_records(small, [b"x" * 30000] * 20)
    out["fits_after"] = os.path.getsize(small) >= 600000
    os.remove(small)
    os.remove(os.path.join(directory, "small.idx"))
    return out


def main(directory: str) -> None:
    rng = np.random.default_rng(0)
    records = [rng.bytes(30000) for _ in range(40)]
    images = rng.integers(0, 256, size=(40, 100, 100, 3), dtype=np.uint8)  # ~30 kB as PNG
    print(json.dumps(attempt(directory, "records", lambda p: pack_records(p, records))))
    print(json.dumps(attempt(directory, "images", lambda p: pack_images(p, images, range(40)))))
    # A disk already full: the record fits MXNet's write buffer, whose failed flush at close
    # MXNet's writer ignores; the .rec left short is caught.
    filler = os.path.join(directory, "filler")
    with open(filler, "wb") as f:
        try:
            f.write(bytes(1 << 20))
        except OSError:
            pass
    out = attempt(directory, "tail", lambda p: pack_records(p, [records[0][:3000]]), filler)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
