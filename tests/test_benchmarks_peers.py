"""benchmarks.peers, the side-by-side run against torchvision and FFCV: its plan, its paired
statistics, its arguments and the runner's plumbing, without torch. The one test that runs a
peer skips where the peers' venv (``make bench-peers``) is absent."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

# benchmarks/ is not an installed package: make it importable however pytest is started.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import peers, peers_runner  # noqa: E402
from benchmarks.harness import time_loader  # noqa: E402

pytestmark = [pytest.mark.timeout(60)]


def _run(loader, round_, rate=None, **extra):
    result = {"samples_per_s": rate, **extra} if rate is not None else extra
    return {"loader": loader, "round": round_, "result": result}


def test_rounds_alternate_and_probe_the_bound_beside_the_loader():
    loaders = ["w7-ours", "w7-torch", "w5-ours", "w5-recorditer"]
    first, second = peers.round_order(loaders, 0), peers.round_order(loaders, 1)
    assert first == ["w7-ours", "w7-torch", "floor", "w5-ours", "floor", "w5-recorditer"]
    assert second == list(reversed(first))
    assert peers.round_order(["w7-ours"], 3) == ["w7-ours"]  # no probe without W5's run


def test_loaders_argument_keeps_the_table_order_and_names_unknown_ids():
    assert peers.parse_loaders(" ffcv,w7-ours ") == ["w7-ours", "ffcv"]
    with pytest.raises(ValueError, match=r"w7-ours, w7-torch.*'w7-ours,torch' \(torch unknown\)"):
        peers.parse_loaders("w7-ours,torch")
    with pytest.raises(ValueError, match="got ','"):
        peers.parse_loaders(",")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rounds", "0"], "--rounds must be >= 1, got 0"),
        (["--floor-images", "10"], "--floor-images must be >= 64"),
        (["--loaders", "dali"], "dali unknown"),
        (["--background", "gpu"], "invalid choice: 'gpu'"),
    ],
)
def test_bad_arguments_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        peers.parse_args(argv)
    assert message in capsys.readouterr().err


def test_ratios_pair_rounds_and_skip_failed_runs():
    runs = [
        _run("w7-ours", 0, 1000.0),
        _run("w7-torch", 0, 400.0),
        _run("w7-ours", 1, 900.0),
        _run("w7-torch", 1, error="died"),
        _run("w7-ours", 2, 1200.0),
        _run("w7-torch", 2, 600.0),
    ]
    ratio = peers.paired(peers.rates(runs, "w7-ours"), peers.rates(runs, "w7-torch"))
    assert ratio["per_round"] == {0: 2.5, 2: 2.0}  # round 1 has no torch rate: not paired
    assert (ratio["median"], ratio["min"], ratio["max"]) == (2.25, 2.0, 2.5)
    summary = peers.summarise(runs, ["w7-ours", "w7-torch"])
    assert summary["loaders"]["w7-torch"]["errors"] == ["died"]
    assert summary["loaders"]["w7-ours"]["median"] == 1000.0
    assert summary["ratios"]["W7 shardloader / torchvision"]["need"] == 1.5
    assert "W7 shardloader / FFCV" not in summary["ratios"]  # FFCV did not run


def test_decode_bound_per_round_from_its_probes():
    runs = [
        _run("floor", 0, s_per_sample=0.001, cpu_per_sample=0.0009, together_per_s=1800.0),
        _run("w5-ours", 0, 1600.0, cpu_ms_per_sample=1.0),
        _run("floor", 0, s_per_sample=0.00125, cpu_per_sample=0.0008, together_per_s=1400.0),
        _run("floor", 1, s_per_sample=0.001, cpu_per_sample=0.001),  # no processes at once
        _run("w5-ours", 1, 1000.0),
        _run("floor", 1, error="timed out"),
    ]
    per_round = peers.bounds(runs)
    assert per_round[0]["probe_ms"] == [1.0, 1.25]
    # Load only slows a probe down: the faster probe of the two makes the bound.
    assert per_round[0]["bound"] == 2000.0 and per_round[0]["bound_together"] == 1800.0
    assert per_round[0]["fraction"]["w5-ours"] == 0.8
    assert per_round[0]["fraction_together"]["w5-ours"] == pytest.approx(1600 / 1800)
    assert per_round[0]["cpu_fraction"]["w5-ours"] == pytest.approx(0.8)  # 0.8 ms of 1.0
    assert per_round[0]["cores"]["w5-ours"] == 1.6
    assert per_round[0]["fraction"]["w7-ours"] is None  # W7 did not run
    assert per_round[1]["bound"] == 2000.0 and per_round[1]["bound_together"] is None
    assert per_round[1]["cpu_fraction"]["w5-ours"] is None  # the run has no CPU figure
    frac = peers.fraction_summary(per_round, "w5-ours")
    assert (frac["median"], frac["min"], frac["max"]) == (pytest.approx(0.65), 0.5, 0.8)
    assert frac["steady"] is False  # 0.5 and 0.8 are 0.15 from the median
    steady = peers.fraction_summary({0: per_round[0]}, "w5-ours", "fraction_together")
    assert steady["steady"] is True and steady["median"] == pytest.approx(1600 / 1800)


def test_markdown_shows_rates_ratios_failures_and_the_bound():
    runs = [
        _run("w7-ours", 0, 1500.0, foreign_cores=0.1),
        _run("w7-torch", 0, 500.0, foreign_cores=0.2, cpu_ms_per_sample=3.5),
        _run("ffcv", 0, error="ModuleNotFoundError: No module named 'ffcv'"),
        _run("floor", 0, s_per_sample=0.001, cpu_per_sample=0.0009, together_per_s=1900.0),
        _run("w5-ours", 0, 1700.0, cpu_ms_per_sample=1.0),
        _run("floor", 0, s_per_sample=0.001, cpu_per_sample=0.0009, together_per_s=1900.0),
    ]
    loaders = ["w7-ours", "w7-torch", "ffcv", "w5-ours"]
    meta = {
        "date": "today",
        "cpu": "cpu",
        "cores": 2,
        "rounds": 1,
        "total_s": 60.0,
        "background": "none",
        "load_start": 0.5,
        "load_end": 0.7,
        "loads": [0.5],
        "mxnet": "1.9.1",
        "versions": {"torch": "2.14.1"},
        "floor_images": 384,
        "runs": runs,
    }
    md = peers.markdown(peers.summarise(runs, loaders), meta)
    row = (
        "| W7 | torchvision + torch DataLoader | 500 (500-500) | 3.00x (3.00-3.00) | 3.50 | 1.75 |"
    )
    assert row in md
    assert "| W7 | FFCV (.beton of W7's JPEGs) | failed: ModuleNotFoundError" in md
    assert "| W7 shardloader / torchvision | 3.00x (3.00-3.00) | >= 1.5x | met |" in md
    assert "decode bound (2 x one process) | 0.85 (0.85-0.85) | >= 0.85" in md
    assert "over the loader's (not a target) | 0.90 (0.90-0.90) | - |  |" in md
    row = "| 1 | 1.000 / 1.000 | 2,000 | 1,900 | 1,700 | 0.85 (0.89) | 0.90 | 1.70 | 0.75 (0.79) |"
    assert row in md


def test_runner_folder_order_and_its_errors_come_back_as_json(tmp_path, no_leaks):
    for name in ("b", "a"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "1.jpg").write_bytes(b"")
        (tmp_path / name / "0.jpg").write_bytes(b"")
    files = peers_runner.folder_files(str(tmp_path))
    assert [(os.path.relpath(p, tmp_path), label) for p, label in files] == [
        ("a/0.jpg", 0),
        ("a/1.jpg", 0),
        ("b/0.jpg", 1),
        ("b/1.jpg", 1),
    ]
    # The driver's plumbing, with this venv's Python: the runner's error is the run's result.
    case = {"loader": "dali", "folder": str(tmp_path)}
    result = peers.run_peer(sys.executable, case, timeout_s=30)
    assert result["error"].startswith("ValueError: loader must be 'torch', 'ffcv' or 'beton'")
    assert result["process_s"] > 0 and "foreign_cores" in result
    # A runner that prints no result (here a "Python" that does nothing) is a failed run.
    broken = peers.run_peer("/bin/true", case, timeout_s=30)
    assert broken["error"] == "the runner exited with 0 and no result: "


@pytest.mark.parametrize("memory", [True, False])
def test_time_loader_samples_memory_only_when_asked(memory, no_leaks):
    seen = []

    class Loader:  # records the threads running while it is iterated
        def __iter__(self):
            seen.extend(t.name for t in threading.enumerate())
            return iter([(np.zeros((4, 2), "float32"), np.arange(4))] * 3)

    result = time_loader(Loader, min_time_s=0.0, memory=memory)
    assert ("peak-memory" in seen) is memory
    assert (result["peak_rss_mb"] is None) is not memory and result["samples"] == 12
    assert result["cpu_ms_per_sample"] >= 0 and result["timed_cpu_s"] >= 0


def test_missing_peers_venv_says_how_to_make_it(tmp_path):
    with pytest.raises(ValueError, match="make bench-peers"):
        peers.peer_versions(str(tmp_path / "bin" / "python"))


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isfile(peers.PEERS_PYTHON), reason="no .venv-peers")
def test_torchvision_runner_delivers_normalised_batches(tmp_path, no_leaks):
    from PIL import Image

    for k in range(2):
        (tmp_path / f"c{k}").mkdir()
        for i in range(64):
            pixels = bytes((i * 7 + j) % 256 for j in range(96 * 80 * 3))
            Image.frombytes("RGB", (96, 80), pixels).save(tmp_path / f"c{k}" / f"{i}.jpg")
    case = {"loader": "torch", "folder": str(tmp_path), "num_workers": 0, "min_time_s": 0}
    result = peers.run_peer(peers.PEERS_PYTHON, case, timeout_s=50)
    assert "error" not in result, result
    assert result["samples"] == 128 and result["epochs"] == 1
    assert result["versions"]["torch"].startswith("2.") and result["samples_per_s"] > 0
    json.dumps(result)
