"""Whole programs, as users write them, each run in its own process with a deadline.

Unit tests check the loader on its own; these run complete training programs from
tests/scenarios/ (train -> validate -> train, data-parallel Trainer, numpy mode, Module.fit,
Estimator, gluoncv and gluon-nlp batches, a worker killed mid-training, forks after
training, resume in a new process), most of them next to Gluon's own DataLoader in the same
program, under MXNet 1.9.1 and 2.0.0b1 alike (but for the three that need 1.x). A hang
fails the case at its deadline with the program's output and the stacks of its threads (the
program arms ``faulthandler.dump_traceback_later`` a little before the deadline); a crash at
interpreter exit fails it too. After each program the case checks
that nothing it started is still running.

Each case's wall time is recorded as the ``wall_s`` property (``--junitxml``) and printed in
a table after the run, with pytest's summary (not with ``-q``; conftest.py prints it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import _scenario_times
import conftest
import psutil
import pytest
from conftest import SCENARIO_TIMES, requires_mx1

# The programs run under MXNet 1.9.1 and 2.0.0b1 (tests/scenarios/_common.py has the few
# helpers for what 2.x spells differently), except three that need what only 1.x has:
MODULE = requires_mx1("mx.mod.Module, which 2.x removed")
GLUONCV = requires_mx1("gluoncv, which does not import under 2.x")
GLUONNLP = requires_mx1("gluon-nlp, which does not import under 2.x")

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = os.path.join(HERE, "scenarios")
ROOT = os.path.dirname(HERE)

# The program's faulthandler watchdog fires this long before the deadline, so that a hang
# reports its stacks while the driver still waits for it.
_WATCHDOG_MARGIN_S = 8
# How long processes of the program's session may take to go away after it exits.
_SETTLE_S = 5.0


def case(script, *args, deadline=60, id=None, marks=()):
    name = id or "-".join([script.replace(".py", "")] + [a.lstrip("-") for a in args])
    # pytest-timeout is the last resort; the deadline fires first.
    return pytest.param(
        script,
        list(args),
        deadline,
        id=name,
        marks=[pytest.mark.timeout(deadline + 30), *marks],
    )


CASES = [
    # 1. train -> validate -> train with loaders made up front
    case("train_validate.py", "--workers", "inline"),
    case("train_validate.py", "--workers", "thread"),
    case("train_validate.py", "--workers", "process", "--start-method", "fork"),
    # (one spawned worker a loader: each spends seconds importing MXNet, and two workers'
    # batches are put in order the same way whatever started them, as the fork case checks)
    case(
        "train_validate.py",
        "--workers",
        "process",
        "--start-method",
        "spawn",
        "--num-workers",
        "1",
        deadline=90,
    ),
    # 2. data-parallel Trainer on two CPU contexts, ragged tail
    case("data_parallel.py", "--last-batch", "keep"),
    case("data_parallel.py", "--last-batch", "discard"),
    # 3. numpy mode (mx.npx.set_np), plain / pin_memory / ctx in each worker mode
    case("numpy_mode.py", "--workers", "inline"),
    case("numpy_mode.py", "--workers", "thread"),
    case("numpy_mode.py", "--workers", "process"),
    # 4. Module.fit with eval_data
    case("module_fit.py", "--iter", "loader", marks=[MODULE]),
    case("module_fit.py", "--iter", "prefetching", marks=[MODULE]),
    # 5. Estimator.fit / evaluate
    case("estimator.py"),
    # 6. gluoncv detection batches
    case("detection.py", marks=[GLUONCV]),
    # 7. gluon-nlp bucketing
    case("bucketing.py", marks=[GLUONNLP]),
    # 8. a worker SIGKILLed mid-training, on_worker_death='restart'
    case("restart.py", "--start-method", "fork"),
    # 9. forks (Gluon DataLoader workers, multiprocessing.Pool) after training
    # (in CI's MXNet 2.0 smoke run: the fork-after-training deadlock concerns 2.x too)
    case("fork_after.py", "--workers", "process", marks=[pytest.mark.mx2_smoke]),
    case("fork_after.py", "--workers", "inline"),
    # 10. resume in a new process
    case("resume.py", deadline=90),
    # 11. a training script that ends while MXNet still computes on its last batch
    case("exit_pending.py", "--workers", "process"),
    # 12. a small CNN trained from a .rec through the fused image path, validated on the exact
    # path (shardloader.vision)
    case("vision_train.py", "--workers", "process", deadline=90),
    case("vision_train.py", "--workers", "thread", deadline=90),
]


def _session_processes(sid):
    """Live processes of session ``sid`` (the program and everything it started)."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or os.getsid(p.pid) != sid:
                continue
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
        out.append(p)
    return out


def _kill_session(sid):
    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in _session_processes(sid):
        try:
            p.kill()
        except psutil.Error:
            pass


def _describe(procs):
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:100]!r}")
        except psutil.Error:
            out.append(str(p.pid))
    return out


@pytest.mark.parametrize("script, args, deadline", CASES)
def test_scenario(script, args, deadline, request, record_property):
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["SCENARIO_WATCHDOG_S"] = str(deadline - _WATCHDOG_MARGIN_S)
    cmd = [sys.executable, os.path.join(SCENARIOS, script), *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: a hang is killed whole
        text=True,
        errors="replace",
    )
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_session(proc.pid)
        output, _ = proc.communicate()
    wall = time.monotonic() - t0

    # Whatever the program started must be gone once it has exited.
    deadline_settle = time.monotonic() + _SETTLE_S
    left = _session_processes(proc.pid)
    while left and time.monotonic() < deadline_settle:
        time.sleep(0.1)
        left = _session_processes(proc.pid)
    left_desc = _describe(left)
    _kill_session(proc.pid)

    outcome = "timeout" if timed_out else ("ok" if proc.returncode == 0 else "failed")
    if outcome == "ok" and left_desc:
        outcome = "leaked"
    name = request.node.callspec.id
    request.config.stash.setdefault(SCENARIO_TIMES, []).append((name, wall, outcome))
    record_property("wall_s", round(wall, 2))
    print(f"scenario {name}: {wall:.1f} s, {outcome}")

    tail = "\n".join(output.splitlines()[-150:])
    if timed_out:
        pytest.fail(
            f"{script} {' '.join(args)} did not finish within {deadline} s (a hang); "
            f"its output:\n{tail}",
            pytrace=False,
        )
    if proc.returncode != 0:
        how = (
            f"killed by signal {-proc.returncode}"
            if proc.returncode < 0
            else f"exit status {proc.returncode}"
        )
        where = (
            " after it reported success (a crash at interpreter exit)"
            if "SCENARIO OK" in output
            else ""
        )
        pytest.fail(f"{script} {' '.join(args)}: {how}{where}; its output:\n{tail}", pytrace=False)
    assert "SCENARIO OK" in output, f"no success line from {script}; its output:\n{tail}"
    assert not left_desc, f"processes left behind by {script}: {left_desc}\n{tail}"


# The test runs' conftest loads the suite's table hook from tests/_scenario_times.py, which
# imports no MXNet: each run starts in about a second (it took 6-15 s with the suite's conftest).
_TABLE_CONFTEST = """
import importlib.util

spec = importlib.util.spec_from_file_location("scenario_times", {module!r})
times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(times)
pytest_terminal_summary = times.pytest_terminal_summary
SCENARIO_TIMES = times.SCENARIO_TIMES
"""
_TABLE_TESTS = """
from conftest import SCENARIO_TIMES


def test_one(request):
    request.config.stash.setdefault(SCENARIO_TIMES, []).append(("one-case", 1.25, "ok"))


def test_two():
    pass
"""


@pytest.mark.timeout(120)
def test_wall_times_are_printed_after_the_run_and_not_with_q(tmp_path):
    """The table comes after the last test's dot, with the summary, so the run does not look
    finished while it goes on; -q leaves it out."""
    # The suite's conftest prints the table with this hook.
    assert conftest.pytest_terminal_summary is _scenario_times.pytest_terminal_summary
    module = os.path.join(HERE, "_scenario_times.py")
    (tmp_path / "conftest.py").write_text(_TABLE_CONFTEST.format(module=module))
    (tmp_path / "test_table.py").write_text(_TABLE_TESTS)

    # Without hypothesis's plugin, which these tests do not use: it takes seconds to import on
    # a busy machine.
    plugins = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest"]

    def start_pytest(*options):
        return subprocess.Popen(
            [sys.executable, "-m", "pytest", *plugins, *options, "test_table.py"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def output(proc):
        try:
            out, err = proc.communicate(timeout=100)
        finally:
            proc.kill()  # a no-op once it has exited
        assert proc.returncode == 0, out + err
        return out

    # The two runs are independent programs: they start together.
    plain, quiet = start_pytest(), start_pytest("-q")
    out, quiet_out = output(plain), output(quiet)
    assert "scenario wall times" in out, out
    assert out.index("scenario wall times") > out.index("test_table.py .."), out
    assert "one-case" in out and "1.2 s  ok" in out, out
    assert "2 passed" in quiet_out, quiet_out
    assert "scenario wall times" not in quiet_out
