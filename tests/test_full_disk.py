"""A full disk during ``pack_records``/``pack_images`` (issue 32, item 3): one error naming the
file, the record and the full disk; no descriptor, file or space left behind. Fails on
047df2f. The writer runs in a mount namespace of its own over a 1 MiB tmpfs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

pytestmark = pytest.mark.timeout(60)

# Mount a 1 MiB tmpfs in a private mount namespace, then run the writer over it.
_SANDBOX = 'mkdir -p "$1" && mount -t tmpfs -o size=1m shardloader-full "$1" && shift && exec "$@"'


def _sandboxed(directory: str, *argv: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    )
    return subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _SANDBOX,
            "sh",
            directory,
            *argv,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )


def _can_mount(tmp_path) -> bool:
    probe = _sandboxed(str(tmp_path / "probe"), "true")
    return probe.returncode == 0


def test_a_full_disk_while_packing_leaves_nothing_and_says_so(tmp_path):
    if not _can_mount(tmp_path):
        pytest.skip(
            "cannot mount a tmpfs in a private mount namespace here (unshare --mount needs "
            "root, or user namespaces)"
        )
    directory = str(tmp_path / "disk")
    proc = _sandboxed(
        directory, sys.executable, os.path.join(HERE, "scripts", "full_disk.py"), directory
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    writers = [r["writer"] for r in results]
    assert writers == ["records", "images", "tail"], proc.stdout + proc.stderr
    for r in results:
        assert r["outcome"] == "raised", r
        message = r["message"]
        rec = os.path.join(directory, f"{r['writer']}.rec")
        # One error: the file, the record, and the cause; nothing raised while cleaning up.
        assert r["type"] == "RecordIOError", r
        if r["writer"] == "tail":  # MXNet's writer ignored its failed last flush
            start = f"{rec}: cannot finish it after record 0: 0 of its 3008 bytes were written"
            assert message.startswith(f"{start}: no space left on the device"), r
        else:
            assert message.startswith(f"{rec}: cannot write record {r['key']}: no space left"), r
            assert 20 < r["key"] < 40, r
        assert r["clean_context"], r["traceback"]
        # No descriptor, no hidden .tmp file, and the space came back.
        assert r["fds_left"] == [] and r["files_left"] == [], r
        assert r["fits_after"], r
