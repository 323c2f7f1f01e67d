"""``benchmarks.gpu``: placement against Gluon's split_and_load, here on ``mx.cpu(1)``."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import mxnet as mx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gpu  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.usefixtures("no_leaks")]


def test_one_round_on_cpu_measures_every_cell(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    argv = ["--device", "cpu", "--rounds", "1", "--samples", "640", "--workers", "2"]
    argv += ["--min-time-s", "0.01"]  # one timed epoch a cell: the test checks the cells run
    assert gpu.main([*argv, "--out", str(out)]) == 0
    table = capsys.readouterr().out
    for workload, variant in gpu.CELLS:
        row = re.search(rf"^\| {workload} \| {variant} \| ([\d,]+) \(", table, re.M)
        assert row is not None and int(row.group(1).replace(",", "")) > 0, table
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {f"{w} {v}" for w, v in gpu.CELLS}
    for key, (result,) in runs.items():
        assert "error" not in result, (key, result)
        assert result["samples"] == result["epochs"] * 640 and result["epochs"] >= 1, key


def test_a_step_on_the_wrong_context_fails_the_check():
    _, adapt, check = gpu._build("W1", "ours-ctx", "cpu", 2, 64)
    assert adapt is None
    check((mx.nd.zeros((32, 64), ctx=mx.cpu(1)), mx.nd.zeros((32,), ctx=mx.cpu(1))))
    with pytest.raises(RuntimeError, match=r"W1 ours-ctx: 2 arrays, expected 2 on cpu\(1\)"):
        check((mx.nd.zeros((32, 64), ctx=mx.cpu(0)), mx.nd.zeros((32,), ctx=mx.cpu(1))))


@pytest.mark.parametrize("option", ["--rounds", "--workers", "--samples"])
def test_counts_below_one_are_refused(option, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu.main([option, "0"])
    assert exc.value.code == 2
    assert f"{option} must be >= 1, got 0" in capsys.readouterr().err


def test_a_timed_span_of_zero_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        gpu.main(["--min-time-s", "0"])
    assert exc.value.code == 2
    assert "--min-time-s must be > 0, got 0.0" in capsys.readouterr().err
