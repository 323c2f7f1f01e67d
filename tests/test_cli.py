"""The command line: ``shardloader demo`` and ``shardloader bench``, run as a user would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import shardloader
from shardloader.recordio import ImageRecordDataset
from shardloader.tools import bench, bench_conditions, bench_data, bench_report, cli
from shardloader.tools.demo_data import CLASSES, generate_shapes, image_format, prepare

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("no_leaks")]

TESTS = Path(__file__).resolve().parent
FACTORY = str(TESTS / "bench_factory.py")
# Small enough for a few seconds per run; the options are hidden from --help.
TINY = ["--train-size", "400", "--test-size", "100"]
ACCURACY = re.compile(r"held-out accuracy: [\d.]+% \((\d+)/(\d+);")


def shardloader_cli(*args: str, cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess:
    """Run ``python -m shardloader ARGS`` and return it, stdout and stderr as text."""
    return finish(start_cli(*args, cwd=cwd), timeout)


def start_cli(*args: str, cwd: Path) -> subprocess.Popen:
    """Start ``python -m shardloader ARGS`` (``finish`` waits for it): runs that do not depend
    on each other start together, each spending its first seconds importing MXNet."""
    return subprocess.Popen(
        [sys.executable, "-m", "shardloader", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 150) -> subprocess.CompletedProcess:
    """Wait for a run ``start_cli`` started and return it, stdout and stderr as text."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:  # timed out (or interrupted): no run outlives its test
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_clean(proc: subprocess.CompletedProcess) -> str:
    """The run succeeded without a traceback or a warning; return stdout + stderr."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Traceback" not in output, output
    assert "warning" not in output.lower(), output
    return output


# ------------------------------------------------------------------------------ parser
HELP = [
    ([], ["demo", "bench", "--version"]),
    (["demo"], ["--epochs", "--num-workers", "--batch-size", "--gluon", "--resume",
                "--stop-after-batches", "--cache-dir"]),
    (["bench"], ["--dataset", "--recordio", "--raw", "--no-transform", "--crop-size",
                 "--batch-size", "--workers", "--batches", "--epochs", "--thread-pool",
                 "--step-ms", "--rounds", "--budget-s", "--plot", "--progress",
                 "--no-progress"]),
]  # fmt: skip


def test_help_lists_every_option_and_version_prints_it(tmp_path):
    # The three --help runs (the command's and each subcommand's) and --version start
    # together.
    version = start_cli("--version", cwd=tmp_path)
    procs = [start_cli(*command, "--help", cwd=tmp_path) for command, _ in HELP]
    for (command, expected), proc in zip(HELP, procs):
        proc = finish(proc)
        assert proc.returncode == 0, (command, proc.stderr)
        assert proc.stdout.startswith("usage: shardloader"), (command, proc.stdout)
        for option in expected:
            assert option in proc.stdout, (command, option)
        assert "--train-size" not in proc.stdout, command  # test-only options stay hidden
    proc = finish(version)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"shardloader {shardloader.__version__}"


def test_help_and_usage_errors_import_neither_mxnet_nor_the_subcommands(tmp_path):
    """``shardloader --help`` answers at once (it took 13-16 s on a loaded machine when the
    package imported MXNet): neither --help nor a usage error loads MXNet."""
    code = (
        "import sys\n"
        "from shardloader.tools.cli import main\n"
        "for argv in (['--help'], ['demo', '--help'], ['bench', '--help'],\n"
        "             ['bench', '--dataset', 'm:f', '--workers', '1,x'],\n"
        "             ['bench', '--dataset', 'm:f', '--raw'],\n"
        "             ['bench', '--recordio', 'no_such_file.rec']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ['mxnet', 'shardloader.loader', 'shardloader.tools.demo',\n"
        "         'tqdm', 'matplotlib', 'psutil']\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    started = time.monotonic()
    proc = finish(start_cli("--help", cwd=tmp_path), timeout=30)
    took = time.monotonic() - started
    assert proc.returncode == 0 and proc.stdout.startswith("usage: shardloader"), proc.stderr
    assert took < 4.0, f"shardloader --help took {took:.1f} s"  # ~0.15 s on a quiet machine


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--dataset", "no_such_module_xyz:make"], "cannot import module"),
        (["bench", "--dataset", "no-colon-here"], "must look like"),
        (["bench", "--dataset", f"{FACTORY}:missing"], "has no attribute 'missing'"),
        (["bench", "--dataset", f"{FACTORY}:mak"], "did you mean 'make'? its callables: make"),
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
# A row of the table: workers, loader, median samples/s, then its range over the rounds.
ROW = re.compile(
    r"^\s+(\d+)\s+(shardloader|gluon|ImageRecordIter|ImageRecordLoader)\s+"
    r"([\d,]+)\s+([\d,]+)-([\d,]+)\s",
    re.MULTILINE,
)
VERDICT = re.compile(
    r"^(Recommendation: num_workers=[01]|Too noisy to decide|No setting meets)", re.MULTILINE
)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _prose(text: str) -> str:
    """The report's text with its wrapping undone (prose is wrapped at 100 columns)."""
    return " ".join(text.split())


@pytest.mark.slow
def test_bench_prints_medians_spreads_conditions_and_a_verdict(tmp_path):
    plot = tmp_path / "bench.png"
    proc = shardloader_cli(
        "bench", "--dataset", f"{FACTORY}:make", "--workers", "0,1", "--batches", "5",
        "--batch-size", "16", "--rounds", "2", "--plot", str(plot), cwd=tmp_path,
    )  # fmt: skip
    output = assert_clean(proc)
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("workers"))
    for column in ("loader", "samples/s", "(min-max)", "data stall", "first batch", "peak RSS",
                   "vs gluon (min-max)"):  # fmt: skip
        assert column in header
    rows = ROW.findall(proc.stdout)
    assert sorted((row[0], row[1]) for row in rows) == [
        ("0", "gluon"), ("0", "shardloader"), ("1", "gluon"), ("1", "shardloader"),
    ]  # fmt: skip
    for _, _, median, low, high in rows:
        assert _number(low) <= _number(median) <= _number(high)
    assert "2 rounds at most, within --budget-s 120, each run in a fresh process" in _prose(
        proc.stdout
    )
    assert re.search(
        r" Conditions: \d+ cores?, load average [\d.]+ at the start and [\d.]+ at the end; "
        r"other processes used [\d.]+ s of CPU",
        _prose(proc.stdout),
    ), proc.stdout
    assert VERDICT.search(proc.stdout), proc.stdout
    assert "peak RSS by psutil" in output
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


@pytest.mark.slow
def test_bench_recordio_runs_the_gluon_image_pipeline(tmp_path, small_rec):
    """--recordio measures ImageRecordIter and ImageRecordLoader beside the two loaders, with
    a bar on a terminal (--progress), and a line per measurement when piped; --budget-s
    stops the rounds."""
    budget = start_cli(
        "bench", "--recordio", str(small_rec), "--workers", "0", "--batches", "2",
        "--batch-size", "8", "--crop-size", "32", "--rounds", "3", "--budget-s", "0.01",
        cwd=tmp_path,
    )  # fmt: skip
    proc = shardloader_cli(
        "bench", "--recordio", str(small_rec), "--workers", "0,1", "--batches", "3",
        "--batch-size", "8", "--crop-size", "32", "--rounds", "1", "--progress", cwd=tmp_path,
    )  # fmt: skip
    assert_clean(proc)
    text = _prose(proc.stdout)
    assert "RandomResizedCrop(32), RandomFlipLeftRight, ToTensor, Normalize" in text
    assert "images: fused (stats()['image_path']" in text  # the path the images took
    assert "shuffled" in text
    assert "also measured: ImageRecordIter, ImageRecordLoader, with the same crop" in text
    loaders = ["ImageRecordIter", "ImageRecordLoader", "gluon", "shardloader"]
    assert sorted((r[0], r[1]) for r in ROW.findall(proc.stdout)) == [
        (w, name) for w in "01" for name in loaders
    ]
    assert "Against mx.io.ImageRecordIter (preprocess_threads=num_workers, 1 for 0)" in text
    assert re.search(r"num_workers=1: shardloader [\d.]+x \([\d.]+-[\d.]+\), ImageRecord", text)
    assert "One round: the spread is unknown" in text
    assert VERDICT.search(proc.stdout), proc.stdout
    # (5 warm-up + 3 timed batches) x 2 worker counts x 4 loaders x 1 round
    assert "bench:" in proc.stderr and "/64 " in proc.stderr
    assert "round 1/1" not in proc.stdout  # the bar shows progress, not lines
    # Piped, without --progress: a line per measurement; the budget ends the rounds.
    proc = finish(budget)
    assert_clean(proc)
    lines = re.findall(r"^round 1/3: num_workers=0 (\S+): [\d,]+ samples/s$", proc.stdout, re.M)
    assert sorted(lines) == loaders, proc.stdout
    assert "round 2/3" not in proc.stdout
    assert "stopped after 1 of 3 rounds: another would end past --budget-s 0.01" in proc.stdout
    assert "3 rounds at most, within --budget-s 0.01" in _prose(proc.stdout)
    assert "One round: the spread is unknown" in _prose(proc.stdout)


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


def test_a_misspelled_factory_lists_the_callables_of_the_module(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    with pytest.raises(bench_data.BenchError) as info:
        bench_data.resolve_factory("bench_factory:mkae")
    message = str(info.value)
    # Its own callables, not the ArrayDataset it imports.
    assert message.endswith("has no attribute 'mkae'; did you mean 'make'? its callables: make")


# ------------------------------------------------------------------------------ bench runs
def test_each_run_is_a_process_of_its_own():
    from shardloader.tools.bench_timing import run_isolated

    def report_pid(progress):
        for _ in range(7):
            progress(1)
        return {"pid": os.getpid()}

    seen = []
    assert run_isolated(report_pid, seen.append)["pid"] != os.getpid()
    assert sum(seen) == 7  # the run's progress reaches this process's bar

    def fail(progress):
        raise KeyError("boom")

    assert run_isolated(fail) == {"error": "KeyError: 'boom'"}

    def refuse(progress):
        raise bench_data.BenchError("nothing left to time")

    with pytest.raises(bench_data.BenchError, match="nothing left to time"):
        run_isolated(refuse)
    assert run_isolated(lambda progress: os._exit(3)) == {
        "error": "the measuring process died (exit code 3)"
    }


def test_warm_up_batches_are_read_but_not_timed():
    from shardloader.tools.bench_timing import measure

    reads = []

    class Loader:
        """Two epochs of 4 batches of 2 samples."""

        def __iter__(self):
            for k in range(4):
                reads.append(k)
                yield np.zeros((2, 3), np.float32)

    result = measure(Loader, batches=5, epochs=None, warmup=3)
    assert len(reads) == 8  # 3 warm-up + 5 timed batches, across two epochs
    assert result["batches"] == 5 and result["samples"] == 10
    reads.clear()
    result = measure(Loader, batches=None, epochs=2, warmup=3)
    assert len(reads) == 8 and result["batches"] == 5
    with pytest.raises(bench_data.BenchError, match="nothing left to time after the 9"):
        measure(Loader, batches=None, epochs=2, warmup=9)


@pytest.mark.parametrize(
    "cores, expected",
    [
        (1, [0, 1]),
        (2, [0, 1, 2]),
        (4, [0, 1, 2, 4]),
        (6, [0, 1, 2, 4, 6]),
        (16, [0, 1, 2, 4, 8, 16]),
    ],
)
def test_the_default_worker_counts_fit_the_machine(cores, expected):
    assert bench_conditions.default_workers(cores) == expected


def test_worker_counts_beyond_the_cores_are_run_as_asked_with_a_note(capsys):
    import argparse

    cores = bench_conditions.usable_cores()
    args = argparse.Namespace(workers=None)
    bench._workers(args)
    assert args.workers == bench_conditions.default_workers(cores)
    assert max(args.workers) == cores
    assert capsys.readouterr().out == ""
    args = argparse.Namespace(workers=[0, cores + 2])
    bench._workers(args)
    assert args.workers == [0, cores + 2]
    assert f"note: num_workers={cores + 2} on {cores} core" in _prose(capsys.readouterr().out)


def test_conditions_count_the_cpu_time_of_other_processes():
    """A process that this command did not reap is another program: its CPU time counts as
    the machine's load, not as the runs' own."""
    import subprocess as sp

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
    with bench_conditions.Conditions() as conditions:
        proc = sp.Popen([sys.executable, "-c", burn])
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # finished, not reaped
    proc.wait()
    assert conditions.other_cpu_s >= 0.4
    assert conditions.cores == bench_conditions.usable_cores()
    line = conditions.describe()
    assert line.startswith(f"Conditions: {conditions.cores} core")
    assert f"other processes used {conditions.other_cpu_s:.1f} s of CPU" in line


# ------------------------------------------------------------------------------ bench report
def _run(rate, stall=1.0, batch_bytes=1 << 20):
    return {"samples_per_s": float(rate), "stall": stall, "first_batch_s": 0.1,
            "peak_rss_mb": 10.0, "batch_bytes": float(batch_bytes)}  # fmt: skip


def test_rows_give_medians_ranges_and_paired_ratios():
    runs = {
        (2, "gluon"): [_run(50), _run(100), _run(70)],
        (2, "shardloader"): [_run(100), _run(110), _run(105)],
    }
    (ours, theirs) = bench_report.summarize(runs)
    assert ours["loader"] == "shardloader" and theirs["loader"] == "gluon"
    assert (ours["samples_per_s"], ours["rate_min"], ours["rate_max"]) == (105, 100, 110)
    # Round by round: 100/50, 110/100, 105/70; not the ratio of the medians (105/70).
    assert (ours["ratio"], ours["ratio_min"], ours["ratio_max"]) == (1.5, 1.1, 2.0)
    assert "ratio" not in theirs
    table = bench_report.format_table([ours, theirs])
    assert table[2].split() == ["2", "shardloader", "105", "100-110", "100.0%", "100.0",
                                "ms", "10", "MB", "1.50x", "(1.10-2.00)"]  # fmt: skip


def test_failed_rows_are_reported_not_recommended():
    runs = {
        (0, "shardloader"): [_run(100)],
        (0, "gluon"): [_run(90)],
        (2, "shardloader"): [{"error": "MXNetError: Decoding failed"}],
        (2, "gluon"): [_run(90), {"error": "MXNetError: Decoding failed"}],
    }
    rows = bench_report.summarize(runs)
    assert rows[3] == {"loader": "gluon", "workers": 2,
                       "error": "MXNetError: Decoding failed (1 of 2 runs)"}  # fmt: skip
    table = bench_report.format_table(rows)
    assert any(line.split()[:3] == ["2", "gluon", "failed:"] for line in table)
    assert any("1.11x" in line for line in table)
    assert bench_report.recommend(rows, step_ms=0).workers == 0


def test_recommendation_rule():
    def rows(rates, batch_bytes=64 << 20):
        runs = {(w, "shardloader"): [_run(r, batch_bytes=batch_bytes)] * 3 for w, r in rates}
        runs[(4, "gluon")] = [_run(1000)] * 3  # only shardloader's rows count
        return bench_report.summarize(runs)

    advice = bench_report.recommend(rows([(0, 100), (2, 390), (4, 400)]), step_ms=0)
    assert advice.workers == 2  # within 5% of the best (4 workers)
    assert advice.prefetch == 4  # 2 x workers; 4 batches of 64 MiB fit the 256 MiB budget
    assert advice.met_target and len(advice.why) == 2
    capped = bench_report.recommend(rows([(0, 100), (2, 390)], 100 << 20), step_ms=0)
    assert capped.prefetch == 2  # capped by the memory budget


def test_too_noisy_to_decide():
    runs = {
        (0, "shardloader"): [_run(100), _run(101), _run(99)],
        (2, "shardloader"): [_run(90), _run(400), _run(390)],  # its worst round: below 0's
    }
    advice = bench_report.recommend(bench_report.summarize(runs), step_ms=0)
    assert advice.workers is None
    assert advice.why[0].startswith("The rounds of num_workers=2 ranged from 90 to 400")
    # One round has no spread to judge by.
    one = {key: results[1:2] for key, results in runs.items()}
    assert bench_report.recommend(bench_report.summarize(one), step_ms=0).workers == 2


def test_noise_that_cannot_change_the_choice_does_not_block_it():
    # Inline varies by 29% but even its best round is far below 2 workers' worst one.
    runs = {
        (0, "shardloader"): [_run(850), _run(899), _run(1110)],
        (2, "shardloader"): [_run(1347), _run(1525), _run(1581)],
    }
    advice = bench_report.recommend(bench_report.summarize(runs), step_ms=0)
    assert advice.workers == 2
    # The one setting that can be the pick varying by 37% does not stop it either.
    runs[(2, "shardloader")] = [_run(1434), _run(1636), _run(2040)]
    assert bench_report.recommend(bench_report.summarize(runs), step_ms=0).workers == 2
    # Where the noisy setting could still be the pick, there is no recommendation.
    runs[(0, "shardloader")] = [_run(850), _run(899), _run(1500)]
    assert bench_report.recommend(bench_report.summarize(runs), step_ms=0).workers is None


def test_the_step_target_met_or_missed():
    def runs(stalls):
        return bench_report.summarize(
            {(w, "shardloader"): [_run(100 * (w + 1), stall=s)] * 2 for w, s in stalls}
        )

    met = bench_report.recommend(runs([(0, 0.9), (1, 0.04), (2, 0.01)]), step_ms=20)
    assert met.workers == 1 and met.met_target
    assert "the fewest workers that keep the data stall at or under 5%" in met.why[0]
    missed = bench_report.recommend(runs([(0, 0.9), (1, 0.5), (2, 0.3)]), step_ms=20)
    assert missed.workers == 2 and not missed.met_target
    assert missed.why[0].startswith(
        "Target missed: no num_workers tried keeps the data stall at or under 5% with a 20 ms "
        "step; the lowest was 30%, with num_workers=2."
    )


def _report(rows, mxnet_ops=False, thread_pool=False, step_ms=0.0, busy=False):
    import argparse

    conditions = bench_conditions.Conditions()
    conditions.cores, conditions.wall_s = 2, 10.0
    conditions.other_cpu_s = 15.0 if busy else 0.5
    args = argparse.Namespace(step_ms=step_ms, thread_pool=thread_pool, rounds=3)
    bench._report(rows, conditions, args, mxnet_ops)


def test_the_report_says_plainly_when_no_setting_meets_the_target(capsys):
    rows = bench_report.summarize({(w, "shardloader"): [_run(100, stall=0.4)] * 3 for w in (0, 2)})
    _report(rows, step_ms=20, busy=True)
    out = capsys.readouterr().out
    assert "\nNo setting meets the target. Closest: num_workers=0\n" in out
    assert "Recommendation" not in out
    out = _prose(out)
    assert "other processes used 15.0 s of CPU during the 10 s run (1.50 of 2 cores)" in out
    assert "Other programs kept the machine busy" in out


def test_engine_thread_hint_only_for_mxnet_samples(monkeypatch, capsys):
    """MXNet operators in thread workers (or inline) share MXNET_CPU_WORKER_NTHREADS engine
    threads, one by default: the report says so when the samples are MXNet arrays and the
    variable is not set; a numpy dataset gets no such hint."""
    rows = bench_report.summarize({(2, "shardloader"): [_run(100)] * 3})
    hint = "MXNET_CPU_WORKER_NTHREADS=2"
    monkeypatch.delenv("MXNET_CPU_WORKER_NTHREADS", raising=False)
    for mxnet_ops, thread_pool, shown in [
        (True, True, True), (True, False, False), (False, True, False),
    ]:  # fmt: skip
        _report(rows, mxnet_ops=mxnet_ops, thread_pool=thread_pool)
        assert (hint in capsys.readouterr().out) is shown
    monkeypatch.setenv("MXNET_CPU_WORKER_NTHREADS", "2")
    _report(rows, mxnet_ops=True, thread_pool=True)
    assert "MXNET_CPU_WORKER_NTHREADS" not in capsys.readouterr().out


def test_mxnet_samples_are_told_from_numpy_ones():
    import argparse

    import mxnet as mx
    from mxnet.gluon.data import ArrayDataset

    args = argparse.Namespace(recordio=None, raw=False)
    features = np.zeros((4, 3), np.float32)
    assert not bench_data.uses_mxnet(ArrayDataset(features, np.arange(4)), args)
    assert bench_data.uses_mxnet(ArrayDataset(mx.nd.array(features), np.arange(4)), args)
    pipeline = argparse.Namespace(recordio="x.rec", raw=False)
    assert bench_data.uses_mxnet(None, pipeline)


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

    # The records hold the generated pixels: JPEG (quality 95) for the fused image path, or
    # PNG, losslessly, where the vision extra is missing.
    images, labels = generate_shapes(60)
    image, label = ImageRecordDataset(first["train"])[7]
    error = np.abs(image.asnumpy().astype(int) - images[7].astype(int))
    assert label == labels[7]
    if image_format() == ".jpg":
        assert error.mean() < 16, error.mean()  # the added pixel noise is what JPEG loses
    else:
        assert not error.any()

    assert prepare(cache, train_size=30, test_size=12, progress=False).rebuilt  # other size
    os.remove(os.path.join(cache, "test.idx"))
    assert prepare(cache, train_size=30, test_size=12, progress=False).rebuilt  # a lost file


# ------------------------------------------------------------------------------ demo runs
@pytest.mark.slow
def test_demo_runs_clean_in_the_default_cache_dir_and_compares_with_gluon(tmp_path):
    # --gluon runs the plain demo's training, then Gluon's: one run checks both.
    proc = shardloader_cli("demo", "--epochs", "1", "--gluon", *TINY, cwd=tmp_path)
    assert_clean(proc)
    assert len(ACCURACY.findall(proc.stdout)) == 2
    assert re.search(r"^gluon DataLoader\s+[\d.]+ s", proc.stdout, re.MULTILINE), proc.stdout
    assert "data stall" in proc.stdout
    assert (tmp_path / ".shardloader-cache" / "demo" / "train.rec").is_file()
    assert (tmp_path / ".shardloader-cache" / "demo" / "checkpoint" / "state.json").is_file()


@pytest.mark.slow
def test_demo_resumes_mid_epoch_to_the_same_result(tmp_path):
    options = ["demo", "--epochs", "2", "--num-workers", "1", *TINY]
    # The uninterrupted run (a cache of its own) goes on beside the interrupted one.
    started = start_cli(*options, "--cache-dir", str(tmp_path / "full"), cwd=tmp_path)
    try:
        cache = ["--cache-dir", str(tmp_path / "crash")]
        crashed = shardloader_cli(*options, *cache, "--stop-after-batches", "2", cwd=tmp_path)
        resumed = shardloader_cli(*options, *cache, "--resume", cwd=tmp_path)
    finally:
        full = finish(started)
    assert_clean(full)
    assert_clean(crashed)
    assert "--resume" in crashed.stdout
    assert not ACCURACY.search(crashed.stdout)
    # 400 images in batches of 2 shards of 64: 3 batches an epoch; the bar counts them.
    assert "2/3 [" in crashed.stderr and "batch/s" in crashed.stderr, crashed.stderr
    assert "Stopped after 2 batches of epoch 1" in crashed.stdout, crashed.stdout
    assert "with --resume" in crashed.stdout

    assert_clean(resumed)
    assert "continuing from" in resumed.stdout and "epoch 1, step 2" in resumed.stdout
    out = resumed.stdout
    assert "at epoch 1, step 2 (after batch 2 of 3)" in out, out
    assert re.search(r"^data stall: (good|fair|poor): ", out, re.MULTILINE), out
    assert "after Ctrl-C, run the same command with --resume" in out
    assert "run again with --gluon" in out
    assert "reorder" not in (out + resumed.stderr).lower()  # "kept in order", in words
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
