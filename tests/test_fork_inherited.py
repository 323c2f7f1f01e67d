"""A forked child that advances the epoch iterator it inherited (issue 32, item 1): it gets a
clear error at once, and the parent's epoch stays whole. Fails on 047df2f."""

from __future__ import annotations

import json

import pytest
from test_worker_failures_and_errors import run_program

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

_KINDS = ["process", "thread", "inline"]


def test_a_forked_child_cannot_advance_the_iterator_it_inherited(tmp_path):
    proc = run_program("fork_inherited.py", ",".join(_KINDS), str(tmp_path), timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["kind"] for r in results] == _KINDS, proc.stdout + proc.stderr
    whole = list(range(32))
    for r in results:
        kind = r["kind"]
        # The parent: the epoch open at the fork, and the next, whole and in order, on the
        # same workers.
        assert "error" not in r, r
        assert r["epoch"] == whole and r["next_epoch"] == whole, r
        assert r["same_workers"] and r["child_status"] == 0, r
        # The child: at once, an error that names the fork and the remedy; then an epoch of
        # its own from iter(loader).
        child = json.loads((tmp_path / f"{kind}.json").read_text())
        message = child["next"]
        assert message.startswith("RuntimeError: "), (kind, message)
        assert "os.fork()" in message and "iter(loader) anew" in message, (kind, message)
        assert child["next_s"] < 1.0, (kind, child)
        assert child["own_epoch"] == whole, (kind, child)
