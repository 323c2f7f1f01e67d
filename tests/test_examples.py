"""The scripts in examples/ run as documented and do what they claim."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def run_example(name, *args, timeout=90):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, name), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_train_bucketing_loss_goes_down():
    out = run_example("train_bucketing.py", "--epochs", "3", "--samples", "800")
    losses = [float(v) for v in re.findall(r"^epoch \d+ loss ([0-9.]+)", out, re.M)]
    assert len(losses) == 3, out
    assert losses[-1] < losses[0], out
    # Per-shard padding is the point of the sharded steps: it must cost less than padding
    # every shard of a step to the step's longest sequence.
    for per_shard, across in re.findall(r"padding tokens (\d+) per shard \(vs (\d+)", out):
        assert int(per_shard) < int(across), out
