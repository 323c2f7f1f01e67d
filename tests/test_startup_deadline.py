"""A spawn worker that never reads its start-up payload (issue 32, item 2): the hand-over
honours ``timeout`` and ends with an error that says so, leaving nothing behind. Fails (hangs
past its deadline) on 047df2f."""

from __future__ import annotations

import json

import pytest
from test_worker_failures_and_errors import run_program

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_leaks")]


def test_a_spawn_hand_over_to_workers_stuck_importing_the_main_module_times_out():
    proc = run_program("spawn_stuck_import.py", timeout=40)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome["outcome"] == "raised", outcome
    assert outcome["type"] == "LoaderTimeoutError" and "TimeoutError" in outcome["mro"], outcome
    message = outcome["message"]
    for part in (
        "spawn worker 0",
        "did not take its start-up payload",
        "1.0 MB",
        "timeout=2.0s",
        "importing the program's main module",
        "__main__",
    ):
        assert part in message, (part, message)
    # Within timeout (2 s) and the time to stop the workers; none is left, nor a descriptor.
    assert 1.5 < outcome["seconds"] < 7, outcome
    assert outcome["children"] == [] and outcome["fds_leaked"] == 0, outcome
