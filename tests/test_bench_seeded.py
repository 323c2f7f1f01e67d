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
    assert len(said) == 4 and all(re.search(r"[\d,]+ samples/s$", line) for line in said), said
    assert [(r["mode"], r["seeded"]) for r in result["runs"]] == [
        ("inline", False),
        ("inline", True),
        ("process", False),
        ("process", True),
    ]
    text = seeded.report(result, 1, 64)
    for mode in ("inline", "process"):
        row = re.search(
            rf"^\| {mode} \| 4 \| [\d,]+ \(.*\) \| [\d,]+ \(.*\) \| ([\d.]+)x \(", text, re.M
        )
        assert row is not None and float(row.group(1)) > 0, text
    assert text.count("| >= 0.5x |") == 2


def test_a_child_run_prints_its_result_as_json(capsys):
    spec = dict(mode="inline", batch_size=4, seeded=True, samples=64, min_time_s=0.0)
    assert seeded.main(["--child", json.dumps(spec)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["samples_per_s"] > 0 and result["epochs"] == 1


def test_the_ratio_is_paired_by_round():
    runs = [
        {
            "round": k,
            "mode": "inline",
            "batch_size": 32,
            "seeded": s,
            "result": {"samples_per_s": v},
        }
        for k, s, v in [
            (0, False, 100.0),
            (0, True, 90.0),
            (1, False, 50.0),
            (1, True, 30.0),
            (2, True, 10.0),
        ]  # round 2's pair is incomplete: left out
    ]
    (cell,) = seeded.summarise(runs, [("inline", 32)])
    assert cell["per_round"] == [0.9, 0.6]
    assert cell["ratio"] == {"median": 0.75, "min": 0.6, "max": 0.9}
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
