"""``benchmarks.seeded``: seeded against unseeded loading, paired by round (issue 32, item 5).
Tiny settings: the structure of the results, no timings."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import seeded  # noqa: E402

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]


def test_one_round_reports_the_paired_ratio_and_the_target():
    said = []
    result = seeded.run(1, ["inline", "process"], [4], 64, 0.0, say=said.append, isolated=False)
    assert len(said) == 2, said
    for line in said:
        assert re.search(r"no seed [\d,]+ samples/s, seed=1 [\d,]+: [\d.]+x$", line), said
    assert [r["mode"] for r in result["runs"]] == ["inline", "process"]
    for run in result["runs"]:
        sides = run["result"]["unseeded"], run["result"]["seeded"]
        assert all(side["epochs"] == 2 and side["samples_per_s"] > 0 for side in sides)
    text = seeded.report(result, 1, 64)
    for mode in ("inline", "process"):
        row = re.search(
            rf"^\| {mode} \| 4 \| [\d,]+ \(.*\) \| [\d,]+ \(.*\) \| ([\d.]+)x \(", text, re.M
        )
        assert row is not None and float(row.group(1)) > 0, text
    assert text.count("| >= 0.5x |") == 2


def test_a_child_run_prints_its_result_as_json(capsys):
    spec = dict(mode="inline", batch_size=4, samples=64, min_time_s=0.0)
    assert seeded.main(["--child", json.dumps(spec)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        result["ratio"] == result["seeded"]["samples_per_s"] / result["unseeded"]["samples_per_s"]
    )


def test_the_summary_takes_the_median_of_the_rounds_ratios():
    def result(unseeded, seeded_):
        return {
            "unseeded": {"samples_per_s": unseeded},
            "seeded": {"samples_per_s": seeded_},
            "ratio": seeded_ / unseeded,
        }

    runs = [
        {"round": 1, "mode": "inline", "batch_size": 32, "result": result(50.0, 30.0)},
        {"round": 0, "mode": "inline", "batch_size": 32, "result": result(100.0, 90.0)},
        {"round": 2, "mode": "inline", "batch_size": 32, "result": {"error": "timed out"}},
    ]
    (cell,) = seeded.summarise(runs, [("inline", 32)])
    assert cell["per_round"] == [0.9, 0.6]
    assert cell["ratio"] == {"median": 0.75, "min": 0.6, "max": 0.9}
    assert cell["unseeded"] == {"median": 75.0, "min": 50.0, "max": 100.0}
    assert cell["target"] == 0.8 and cell["met"] is False


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--modes", "inline,gpu"], "--modes takes inline, process, thread, got 'inline,gpu'"),
        (["--batch-sizes", "4,x"], "--batch-sizes takes positive ints, got '4,x'"),
        (["--rounds", "0"], "need --rounds >= 1"),
    ],
)
def test_bad_arguments_are_refused_before_measuring(argv, said, capsys):
    with pytest.raises(SystemExit) as exc:
        seeded.main(argv)
    assert exc.value.code == 2
    assert said in capsys.readouterr().err
