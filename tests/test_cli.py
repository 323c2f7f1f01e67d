"""The command line: ``shardloader demo`` and ``shardloader bench``, run as a user would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shardloader
from shardloader.recordio import ImageRecordDataset
from shardloader.tools import bench, bench_data, bench_report, bench_timing, cli
from shardloader.tools.demo_data import CLASSES, generate_shapes, prepare

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("no_leaks")]

TESTS = Path(__file__).resolve().parent
FACTORY = str(TESTS / "bench_factory.py")
# Small enough for a few seconds per run; the options are hidden from --help.
TINY = ["--train-size", "400", "--test-size", "100"]
ACCURACY = re.compile(r"held-out accuracy: [\d.]+% \((\d+)/(\d+);")


def shardloader_cli(*args: str, cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess:
    """Run ``python -m shardloader ARGS`` and return it, stdout and stderr as text."""
    return subprocess.run(
        [sys.executable, "-m", "shardloader", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_clean(proc: subprocess.CompletedProcess) -> str:
    """The run succeeded without a traceback or a warning; return stdout + stderr."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Traceback" not in output, output
    assert "warning" not in output.lower(), output
    return output


# ------------------------------------------------------------------------------ parser
@pytest.mark.parametrize(
    "command, expected",
    [
        ([], ["demo", "bench", "--version"]),
        (["demo"], ["--epochs", "--num-workers", "--batch-size", "--gluon", "--resume",
                    "--stop-after-batches", "--cache-dir"]),
        (["bench"], ["--dataset", "--recordio", "--raw", "--no-transform", "--crop-size",
                     "--batch-size", "--workers", "--batches", "--epochs", "--thread-pool",
                     "--step-ms", "--repeat", "--plot", "--progress", "--no-progress"]),
    ],
)  # fmt: skip
def test_help_lists_every_option(tmp_path, command, expected):
    proc = shardloader_cli(*command, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: shardloader")
    for option in expected:
        assert option in proc.stdout
    assert "--train-size" not in proc.stdout  # test-only options stay hidden


def test_version(tmp_path):
    proc = shardloader_cli("--version", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"shardloader {shardloader.__version__}"


def test_help_does_not_import_the_subcommands(tmp_path):
    code = (
        "import sys\n"
        "from shardloader.tools.cli import main\n"
        "try:\n"
        "    main(['demo', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ['shardloader.tools.demo', 'shardloader.tools.bench',\n"
        "         'tqdm', 'matplotlib', 'psutil']\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--dataset", "no_such_module_xyz:make"], "cannot import module"),
        (["bench", "--dataset", "no-colon-here"], "must look like"),
        (["bench", "--dataset", f"{FACTORY}:missing"], "has no attribute 'missing'"),
        (["bench", "--dataset", "json:dumps"], "called without arguments"),
        (["bench", "--dataset", FACTORY + ":make", "--raw"], "--raw goes with --recordio"),
        (["bench", "--dataset", FACTORY + ":make", "--workers", "1,x"], "comma-separated"),
        (["bench", "--dataset", FACTORY + ":make", "--no-transform"], "goes with --recordio"),
        (["bench", "--dataset", FACTORY + ":make", "--crop-size", "32"], "goes with --recordio"),
        (["bench", "--recordio", "x.rec", "--raw", "--no-transform"], "not allowed with"),
        (["bench", "--recordio", "no_such_file.rec"], "no such file 'no_such_file.rec'"),
        (["demo", "--gluon", "--resume"], "cannot be combined"),
    ],
)
def test_usage_errors_are_one_line(capsys, argv, message):
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_resolve_factory_accepts_a_module_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    factory = bench_data.resolve_factory("bench_factory:make")
    assert len(factory()) == 160


# ------------------------------------------------------------------------------ bench
def test_bench_prints_a_table_and_a_recommendation(tmp_path):
    plot = tmp_path / "bench.png"
    proc = shardloader_cli(
        "bench", "--dataset", f"{FACTORY}:make", "--workers", "0,1", "--batches", "5",
        "--batch-size", "16", "--plot", str(plot), cwd=tmp_path,
    )  # fmt: skip
    output = assert_clean(proc)
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("workers"))
    for column in ("loader", "samples/s", "data stall", "first batch", "peak RSS", "vs gluon"):
        assert column in header
    rows = [line.split() for line in lines if re.match(r"\s+\d+\s+(shardloader|gluon)\s", line)]
    assert sorted((row[0], row[1]) for row in rows) == [
        ("0", "gluon"), ("0", "shardloader"), ("1", "gluon"), ("1", "shardloader"),
    ]  # fmt: skip
    assert "peak RSS by psutil" in output
    assert re.search(r"^Recommendation: num_workers=[01]", proc.stdout, re.MULTILINE)
    assert "within 5% of the best throughput" in proc.stdout
    assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.fixture(scope="module")
def small_rec(tmp_path_factory):
    """40 PNG records of 48x64 (PNG: no OpenCV needed to write them)."""
    from shardloader.recordio import pack_images

    folder = tmp_path_factory.mktemp("rec")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 48, 64, 3), dtype=np.uint8)
    rec, _ = pack_images(str(folder / "small.rec"), images, labels=np.arange(40) % 4)
    return Path(rec)


def test_bench_recordio_runs_the_gluon_image_pipeline(tmp_path, small_rec):
    proc = shardloader_cli(
        "bench", "--recordio", str(small_rec), "--workers", "0,1", "--batches", "3",
        "--batch-size", "8", "--crop-size", "32", "--progress", cwd=tmp_path,
    )  # fmt: skip
    assert_clean(proc)
    assert "RandomResizedCrop(32), RandomFlipLeftRight, ToTensor, Normalize" in proc.stdout
    assert "shuffled" in proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines()]
    rows = [r for r in rows if len(r) > 2 and r[1] in ("shardloader", "gluon")]
    assert sorted((r[0], r[1]) for r in rows) == [
        ("0", "gluon"), ("0", "shardloader"), ("1", "gluon"), ("1", "shardloader"),
    ]  # fmt: skip
    assert re.search(r"^Recommendation: num_workers=[01]", proc.stdout, re.MULTILINE)
    assert "bench:" in proc.stderr and "/12 " in proc.stderr  # 3 batches x 2 x 2 runs


def test_bench_recordio_explains_a_missing_or_broken_index(tmp_path, small_rec, capsys):
    lone = tmp_path / "lone.rec"
    lone.write_bytes(small_rec.read_bytes())
    assert cli.main(["bench", "--recordio", str(lone)]) == 2
    err = capsys.readouterr().err
    assert f"no index '{tmp_path / 'lone.idx'}' next to" in err and "Traceback" not in err
    (tmp_path / "lone.idx").write_text("")
    assert cli.main(["bench", "--recordio", str(lone)]) == 2
    assert "is empty" in capsys.readouterr().err
    (tmp_path / "junk.rec").write_bytes(b"not a record at all")
    (tmp_path / "junk.idx").write_text("0\t0\n")
    assert cli.main(["bench", "--recordio", str(tmp_path / "junk.rec")]) == 2
    err = capsys.readouterr().err
    assert "cannot read record 0" in err and "MXNetError: MXNetError" not in err


def test_failed_rows_are_reported_not_recommended():
    rows = [
        {"loader": "shardloader", "workers": 0, "samples_per_s": 100.0, "stall": 1.0,
         "first_batch_s": 0.1, "peak_rss_mb": 10.0, "batch_bytes": 1 << 20},
        {"loader": "gluon", "workers": 0, "samples_per_s": 90.0, "stall": 1.0,
         "first_batch_s": 0.1, "peak_rss_mb": 10.0, "batch_bytes": 1 << 20},
        {"loader": "shardloader", "workers": 2, "error": "MXNetError: Decoding failed"},
        {"loader": "gluon", "workers": 2, "error": "MXNetError: Decoding failed (1 of 3 runs)"},
    ]  # fmt: skip
    table = bench_report.format_table(rows)
    assert any(line.split()[:3] == ["2", "gluon", "failed:"] for line in table)
    assert any("1.11x" in line for line in table)
    assert bench_report.recommend(rows, step_ms=0)[0] == 0
    runs = [{"samples_per_s": 1.0, "peak_rss_mb": 1.0}, {"error": "boom"}]
    assert bench_timing.median_run(runs) == {"error": "boom (1 of 2 runs)"}


def test_recommendation_rule():
    def row(loader, workers, rate, stall=1.0):
        return {
            "loader": loader,
            "workers": workers,
            "samples_per_s": rate,
            "stall": stall,
            "batch_bytes": 64 << 20,
        }

    rows = [row("shardloader", 0, 100), row("shardloader", 2, 390), row("shardloader", 4, 400)]
    rows.append(row("gluon", 4, 1000))  # only shardloader's rows count
    workers, prefetch, why = bench_report.recommend(rows, step_ms=0)
    assert workers == 2  # within 5% of the best (4 workers)
    assert prefetch == 4  # 2 x workers; 4 batches of 64 MiB fit the 256 MiB budget
    rows[1]["batch_bytes"] = 100 << 20
    assert bench_report.recommend(rows, step_ms=0)[1] == 2  # capped by the memory budget
    assert len(why) == 2


def test_engine_thread_hint_for_thread_workers_and_inline_loading(monkeypatch, capsys):
    """MXNet operators in thread workers (or inline) share MXNET_CPU_WORKER_NTHREADS engine
    threads, one by default: the report says so, unless the variable is set."""
    import argparse

    row = {"loader": "shardloader", "samples_per_s": 100.0, "stall": 1.0, "batch_bytes": 1 << 20}
    rows = [{**row, "workers": 2, "first_batch_s": 0.1, "peak_rss_mb": 10.0}]
    hint = "MXNET_CPU_WORKER_NTHREADS=2"
    monkeypatch.delenv("MXNET_CPU_WORKER_NTHREADS", raising=False)
    for thread_pool, shown in ((True, True), (False, False)):
        bench._report(rows, argparse.Namespace(step_ms=0, thread_pool=thread_pool))
        assert (hint in capsys.readouterr().out) is shown
    monkeypatch.setenv("MXNET_CPU_WORKER_NTHREADS", "2")
    bench._report(rows, argparse.Namespace(step_ms=0, thread_pool=True))
    assert "MXNET_CPU_WORKER_NTHREADS" not in capsys.readouterr().out


# ------------------------------------------------------------------------------ demo data
def test_shapes_are_deterministic_and_balanced():
    images, labels = generate_shapes(60, seed=5)
    again, labels_again = generate_shapes(60, seed=5)
    other, _ = generate_shapes(60, seed=6)
    assert images.shape == (60, 32, 32, 3) and images.dtype == np.uint8
    assert np.array_equal(images, again) and np.array_equal(labels, labels_again)
    assert not np.array_equal(images, other)
    assert np.bincount(labels, minlength=len(CLASSES)).tolist() == [10] * len(CLASSES)


def test_cache_is_built_once_and_rebuilt_when_stale(tmp_path):
    cache = str(tmp_path / "cache")
    first = prepare(cache, train_size=60, test_size=12, progress=False)
    assert first.rebuilt
    files = sorted(Path(cache).iterdir())
    stamps = {f.name: f.stat().st_mtime_ns for f in files}

    second = prepare(cache, train_size=60, test_size=12, progress=False)
    assert not second.rebuilt and dict(second) == dict(first)
    assert {f.name: f.stat().st_mtime_ns for f in sorted(Path(cache).iterdir())} == stamps

    # The records hold exactly the generated pixels (PNG is lossless).
    images, labels = generate_shapes(60)
    image, label = ImageRecordDataset(first["train"])[7]
    assert np.array_equal(image.asnumpy(), images[7]) and label == labels[7]

    assert prepare(cache, train_size=30, test_size=12, progress=False).rebuilt  # other size
    os.remove(os.path.join(cache, "test.idx"))
    assert prepare(cache, train_size=30, test_size=12, progress=False).rebuilt  # a lost file


# ------------------------------------------------------------------------------ demo runs
def test_demo_runs_clean_with_the_default_cache_dir(tmp_path):
    proc = shardloader_cli("demo", "--epochs", "1", *TINY, cwd=tmp_path)
    assert_clean(proc)
    assert ACCURACY.search(proc.stdout), proc.stdout
    assert "data stall" in proc.stdout
    assert (tmp_path / ".shardloader-cache" / "demo" / "train.rec").is_file()
    assert (tmp_path / ".shardloader-cache" / "demo" / "checkpoint" / "state.json").is_file()


def test_demo_compares_with_gluon(tmp_path):
    proc = shardloader_cli("demo", "--epochs", "1", "--gluon", *TINY, cwd=tmp_path)
    assert_clean(proc)
    assert len(ACCURACY.findall(proc.stdout)) == 2
    assert re.search(r"^gluon DataLoader\s+[\d.]+ s", proc.stdout, re.MULTILINE), proc.stdout


def test_demo_resumes_mid_epoch_to_the_same_result(tmp_path):
    options = ["demo", "--epochs", "2", "--num-workers", "1", *TINY]
    full = shardloader_cli(*options, "--cache-dir", str(tmp_path / "full"), cwd=tmp_path)
    assert_clean(full)

    cache = ["--cache-dir", str(tmp_path / "crash")]
    crashed = shardloader_cli(*options, *cache, "--stop-after-batches", "2", cwd=tmp_path)
    assert_clean(crashed)
    assert "--resume" in crashed.stdout
    assert not ACCURACY.search(crashed.stdout)

    resumed = shardloader_cli(*options, *cache, "--resume", cwd=tmp_path)
    assert_clean(resumed)
    assert "continuing from" in resumed.stdout and "epoch 1, step 2" in resumed.stdout
    # Seeded order and augmentation, restored weights and optimizer: the same model.
    assert ACCURACY.search(resumed.stdout).groups() == ACCURACY.search(full.stdout).groups()


def test_resume_refuses_a_checkpoint_made_with_other_options(tmp_path, capsys):
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    config = {"seed": 99, "batch_size": 64, "train_size": 400, "test_size": 100}
    state = {"version": 1, "config": {**config, "classes": list(CLASSES)}}
    (checkpoint / "state.json").write_text(json.dumps(state))
    code = cli.main(["demo", "--resume", "--cache-dir", str(tmp_path), *TINY])
    assert code == 2
    assert "made with other options (seed: 99 -> 0)" in capsys.readouterr().err
