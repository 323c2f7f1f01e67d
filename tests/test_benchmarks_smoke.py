"""The benchmark harness itself works: tiny workloads, result structure only, no timings."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

# benchmarks/ is not an installed package: make it importable however pytest is started.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report  # noqa: E402
from benchmarks.harness import count_samples, run_isolated, time_loader, touch  # noqa: E402
from benchmarks.workloads import Case, build  # noqa: E402

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_leaks")]

_KEYS = {
    "samples_per_s",
    "batches_per_s",
    "mb_per_s",
    "us_per_batch",
    "lat_p50_us",
    "lat_p99_us",
    "first_batch_ms",
    "peak_rss_mb",
    "peak_pss_mb",
}


def _time(case: Case) -> dict:
    prepared = build(case)
    return time_loader(
        prepared.factory,
        adapt=prepared.adapt,
        check=prepared.check,
        expect_samples=prepared.samples,
        min_time_s=0.0,
    )


@pytest.mark.parametrize("loader", ["gluon", "ours"])
def test_time_loader_reports_every_metric(loader):
    result = _time(Case("W1", loader, num_workers=0, samples=320))
    assert set(result) >= _KEYS
    assert result["epochs"] == 1
    assert result["samples"] == 320 and result["batches"] == 10
    assert result["bytes"] == 320 * (64 * 4 + 8)  # float32 features + int64 label
    assert result["peak_rss_mb"] >= result["base_rss_mb"] > 0
    json.dumps(result)  # plain numbers only


@pytest.mark.parametrize("loader", ["gluon", "ours"])
def test_sharded_workload_delivers_two_placed_shards(loader):
    result = _time(Case("W4", loader, num_workers=0, samples=128))
    assert result["samples"] == 128 and result["batches"] == 2
    assert result["bytes"] == 128 * (3 * 224 * 224 + 8)


def test_cpu_workload_runs_with_tiny_work():
    result = _time(Case("W3", "ours", num_workers=0, samples=64, work_passes=1))
    assert result["samples"] == 64


def test_check_rejects_a_wrong_batch():
    check = build(Case("W1", "ours", num_workers=0, samples=64)).check
    features = np.zeros((32, 64), dtype="float32")
    check((features, np.arange(32)))
    with pytest.raises(RuntimeError, match="wrong first batch"):
        check((features, np.arange(32)[::-1]))


def test_touch_and_count_walk_nested_batches():
    batch = [(np.zeros((4, 2), "float32"), np.arange(4)), (np.zeros((3, 2), "uint8"), [0, 1, 2])]
    assert count_samples(batch) == 7
    assert touch(batch) == 4 * 2 * 4 + 4 * 8 + 3 * 2


def test_isolated_runs_feed_the_report(tmp_path):
    cells = [report.Cell("W1", 2, reps=1)]
    runs = []
    for loader in cells[0].loaders:
        case = {"workload": "W1", "loader": loader, "num_workers": 2, "samples": 320}
        result = run_isolated(case, min_time_s=0.0, timeout_s=45)
        assert "error" not in result, result
        runs.append({"cell": cells[0].key, "loader": loader, "round": 0, "result": result})
    machine = {"cpu": "test", "cores": 2, "ram_gb": 1.0, "python": "3", "mxnet": "1.9.1"}
    machine["numpy"] = "1.23.5"
    meta = {"date": "today", "total_s": 1.0, "rounds": 1, "load_start": 0.0, "load_end": 0.0}
    out = report.write_results(str(tmp_path), cells, runs, machine, meta)
    ratio = out["summary"][cells[0].key]["ratios"]["ours"]
    assert ratio["median"] > 0 and len(ratio["per_round"]) == 1
    assert [t.name for t in out["targets"]] == ["W1 ours/gluon"]
    assert out["targets"][0].status in ("PASS", "FAIL")
    assert "| W1 process nw=2 | ours | 1 |" in out["markdown"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["targets"][0]["name"] == "W1 ours/gluon" and len(saved["runs"]) == 2
    doc, img = tmp_path / "doc.md", tmp_path / "img" / "plot.png"
    doc.write_text("# Benchmarks\n\nprose\n")
    report.publish(out["markdown"], out["paths"]["png"], str(doc), str(img))
    report.publish(out["markdown"], out["paths"]["png"], str(doc), str(img))  # idempotent
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nprose\n") and text.count("| target |") == 1
