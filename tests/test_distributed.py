"""A real ``dist_sync`` run on 127.0.0.1, the launcher's failure handling, and the kvstore helper.

The cluster tests start ``python -m shardloader.launch`` as a subprocess. Every process of a
run inherits a unique ``SHARDLOADER_TEST_TAG``, so a leftover process is found in /proc even
after it was re-parented. If the kvstore cannot start, the run test fails with the launcher's
output; nothing here is skipped.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import List, Sequence

import pytest

from shardloader import launch
from shardloader.distributed import fail_fast, parts_from_kvstore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parent.parent
WORKER = str(REPO / "tests" / "dist_worker.py")
sys.path.insert(0, str(REPO / "tests"))
import dist_worker  # noqa: E402

# A healthy two-worker run takes about 2 s here; these bound broken ones.
_RUN_TIMEOUT_S = 60
_LAUNCHER_TIMEOUT_S = 45
_PROMPT_S = 20.0
_SETTLE_S = 3.0
# A worker command that forks a grandchild and then sleeps: both must be stopped.
_SLEEPER = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "time.sleep(60)"
)


class Run:
    """A launcher subprocess, started with a unique tag."""

    def __init__(self, args: Sequence[str]) -> None:
        self.tag = uuid.uuid4().hex
        env = dict(os.environ, SHARDLOADER_TEST_TAG=self.tag, OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shardloader.launch", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout = self.stderr = ""
        self.elapsed = 0.0

    def wait(self, timeout: float = _RUN_TIMEOUT_S) -> int:
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()  # SIGTERM: the launcher tears its cluster down
            self.stdout, self.stderr = self.proc.communicate(timeout=_PROMPT_S)
            pytest.fail(f"the launcher ran past {timeout} s\n{self.output()}")
        self.elapsed = time.monotonic() - self.started
        return self.proc.returncode

    def output(self) -> str:
        return f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}"

    def tagged_pids(self) -> List[int]:
        """Live processes carrying this run's tag, wherever they were re-parented."""
        needle = f"SHARDLOADER_TEST_TAG={self.tag}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        if needle in f.read().split(b"\0"):
                            pids.append(int(entry))
                except OSError:
                    pass  # gone, or not ours
        return pids

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + _SETTLE_S
        while self.tagged_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = self.tagged_pids()
        assert not left, f"processes left behind: {left}\n{self.output()}"


def _launch_args(*worker_args: str, workers: int = 2, servers: int = 1) -> List[str]:
    return [
        "-n",
        str(workers),
        "-s",
        str(servers),
        "--timeout",
        str(_LAUNCHER_TIMEOUT_S),
        "--grace-period",
        "2",
        sys.executable,
        *worker_args,
    ]


def _load_reports(out_dir: Path, run: Run, num_workers: int) -> List[dict]:
    paths = [out_dir / f"rank{rank}.json" for rank in range(num_workers)]
    missing = [p.name for p in paths if not p.exists()]
    assert not missing, f"no report from {missing}\n{run.output()}"
    return [json.loads(p.read_text()) for p in paths]


# ---------------------------------------------------------------------- a real dist_sync run
def test_two_workers_train_on_disjoint_parts(tmp_path):
    # One rank reads inline, the other with two worker processes (forked after the kvstore
    # started): both loader modes in one cluster, and they must agree on the parts.
    run = Run(_launch_args(WORKER, str(tmp_path), "--loader-workers", "0,2"))
    code = run.wait()
    if code != 0:
        pytest.fail(f"the dist_sync run failed with exit code {code}\n{run.output()}")
    run.assert_nothing_left()
    reports = _load_reports(tmp_path, run, 2)

    n, per_part = dist_worker.NUM_SAMPLES, dist_worker.NUM_SAMPLES // 2
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert sorted(r["loader_workers"] for r in reports) == [0, 2]
    assert all((r["num_parts"], r["part_index"]) == (2, r["rank"]) for r in reports)
    for epoch in range(dist_worker.EPOCHS):
        parts = [r["epochs"][epoch]["ids"] for r in reports]
        assert [len(p) for p in parts] == [per_part, per_part]
        assert all(len(set(p)) == len(p) for p in parts), "a sample repeated within a part"
        assert not set(parts[0]) & set(parts[1]), f"parts overlap in epoch {epoch}"
        assert sorted(parts[0] + parts[1]) == list(range(n))
        steps = [r["epochs"][epoch]["steps"] for r in reports]
        assert steps == [per_part // dist_worker.BATCH_SIZE] * 2
    for r in reports:
        assert set(r["epochs"][0]["ids"]) != set(r["epochs"][1]["ids"]), "not reshuffled"

    # Synchronous updates through the servers leave both ranks with the same weights.
    assert reports[0]["weight"] == pytest.approx(reports[1]["weight"])
    assert reports[0]["bias"] == pytest.approx(reports[1]["bias"])
    losses = [[x for r in reports for x in r["epochs"][e]["losses"]] for e in range(2)]
    assert sum(losses[1]) / len(losses[1]) < sum(losses[0]) / len(losses[0])


# ---------------------------------------------------------------------- failures and teardown
def test_failing_worker_stops_the_cluster(tmp_path):
    # Rank 1 exits with 3 before its first step; rank 0 is then blocked inside trainer.step.
    run = Run(_launch_args(WORKER, str(tmp_path), "--fail-rank", "1", "--exit-code", "3"))
    code = run.wait()
    assert code == 3, run.output()
    assert run.elapsed < _PROMPT_S, run.output()
    assert "exited with code 3" in run.stderr, run.output()
    assert "worker" in run.stderr.split("exited with code 3")[0], run.output()
    assert "stopped" in run.stderr, run.output()
    run.assert_nothing_left()


def test_failing_command_is_reported_with_its_code():
    run = Run(_launch_args("-c", "import sys; sys.exit(5)"))
    assert run.wait() == 5, run.output()
    assert "worker 0 (pid" in run.stderr or "worker 1 (pid" in run.stderr, run.output()
    run.assert_nothing_left()


def test_timeout_stops_workers_and_their_children():
    run = Run(["-n", "2", "--timeout", "1", "--grace-period", "2", sys.executable, "-c", _SLEEPER])
    assert run.wait() == launch.EXIT_TIMEOUT, run.output()
    assert run.elapsed < _PROMPT_S
    assert "timed out after 1 s" in run.stderr, run.output()
    run.assert_nothing_left()


def test_signal_tears_everything_down():
    # Two clusters, started together: one gets SIGTERM, the other SIGINT.
    runs = {signum: Run(["-n", "2", "-s", "1", sys.executable, "-c", _SLEEPER])
            for signum in (signal.SIGTERM, signal.SIGINT)}  # fmt: skip
    try:
        for signum, run in runs.items():
            # scheduler + server + 2 workers + 2 grandchildren, besides the launcher itself
            deadline = time.monotonic() + _PROMPT_S
            while len(run.tagged_pids()) < 7 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len([pid for pid in run.tagged_pids() if pid != run.proc.pid]) == 6, signum
        for signum, run in runs.items():
            run.proc.send_signal(signum)
        for signum, run in runs.items():
            assert run.wait(timeout=_PROMPT_S) == 128 + signum, run.output()
            assert f"interrupted by {signal.Signals(signum).name}" in run.stderr
            run.assert_nothing_left()
    finally:
        for run in runs.values():
            if run.proc.poll() is None:
                run.proc.kill()  # its children follow (they get SIGTERM when it dies)
                run.proc.communicate()


def test_missing_command_exits_127():
    run = Run(["-n", "1", "shardloader-no-such-command"])
    assert run.wait() == launch.EXIT_CANNOT_START, run.output()
    assert "cannot start" in run.stderr
    run.assert_nothing_left()


# ---------------------------------------------------------------------- the Python API
def test_launch_local_sets_the_ps_lite_environment(tmp_path, monkeypatch):
    names = [
        "DMLC_ROLE",
        "DMLC_PS_ROOT_URI",
        "DMLC_PS_ROOT_PORT",
        "DMLC_NUM_WORKER",
        "DMLC_NUM_SERVER",
        "DMLC_NODE_HOST",
        "DMLC_RANK",
        "EXTRA",
    ]
    script = (
        "import json, os, sys; "
        f"json.dump({{k: os.environ.get(k) for k in {names!r}}}, "
        f"open(os.path.join({str(tmp_path)!r}, str(os.getpid())), 'w'))"
    )
    # The workers exit without joining the kvstore, so the scheduler and the server wait for
    # them until the grace period ends; the run still succeeds.
    monkeypatch.setenv("DMLC_RANK", "7")  # a stale rank must not reach the nodes
    result = launch.launch_local(
        [sys.executable, "-c", script],
        num_workers=2,
        num_servers=1,
        env={"EXTRA": "1"},
        timeout=30,
        grace_period=0.2,
    )
    assert result.ok and result.returncode == 0 and result.failure is None
    assert result.worker_returncodes == [0, 0]
    assert [p.name for p in result.processes] == ["scheduler", "server 0", "worker 0", "worker 1"]
    assert all(p.stopped for p in result.processes[:2])
    envs = [json.loads(p.read_text()) for p in tmp_path.iterdir()]
    assert (
        envs
        == [
            {
                "DMLC_ROLE": "worker",
                "DMLC_PS_ROOT_URI": "127.0.0.1",
                "DMLC_PS_ROOT_PORT": str(result.port),
                "DMLC_NUM_WORKER": "2",
                "DMLC_NUM_SERVER": "1",
                "DMLC_NODE_HOST": "127.0.0.1",
                "DMLC_RANK": None,
                "EXTRA": "1",
            }
        ]
        * 2
    )


def test_launch_local_reports_a_killed_worker():
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    result = launch.launch_local([sys.executable, "-c", script], 1, timeout=30, grace_period=1)
    assert result.returncode == 128 + signal.SIGKILL
    assert result.worker_returncodes == [-signal.SIGKILL]
    assert "worker 0" in result.failure and "killed by SIGKILL" in result.failure


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_workers": 0}, "num_workers must be a positive int, got 0"),
        ({"num_servers": 0}, "num_servers must be a positive int, got 0"),
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"port": 70000}, "port must be an int in 1..65535"),
        ({"cmd": []}, "cmd must be a non-empty command"),
    ],
)
def test_launch_local_validates_arguments(kwargs, message):
    args = {"cmd": ["true"], "num_workers": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        launch.launch_local(**args)


# ---------------------------------------------------------------------- parts_from_kvstore
class _FakeStore:
    def __init__(self, num_workers, rank, type="dist_sync"):
        self.num_workers, self.rank, self.type = num_workers, rank, type


def test_parts_from_kvstore_reads_workers_and_rank():
    assert parts_from_kvstore(_FakeStore(4, 3)) == (4, 3)
    assert parts_from_kvstore(None) == (1, 0)
    assert parts_from_kvstore("local") == (1, 0)
    assert parts_from_kvstore("local") == (1, 0)  # the created store is reused


def test_parts_from_kvstore_rejects_bad_input(monkeypatch):
    with pytest.raises(TypeError, match="kv must be an mxnet KVStore"):
        parts_from_kvstore(3)
    with pytest.raises(ValueError, match="rank 2 of 2 workers"):
        parts_from_kvstore(_FakeStore(2, 2))
    monkeypatch.delenv("DMLC_PS_ROOT_URI", raising=False)
    with pytest.raises(RuntimeError, match="shardloader.launch"):
        parts_from_kvstore("dist_sync")


def test_fail_fast_re_raises_and_ignores_non_dist_stores():
    for kv, exc in itertools.product(
        [None, _FakeStore(1, 0, "local")], [ValueError("boom"), SystemExit(3)]
    ):
        with pytest.raises(type(exc)), fail_fast(kv):
            raise exc
    with fail_fast(None):
        pass
