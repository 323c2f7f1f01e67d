"""``python -m shardloader.launch --hosts``: on hosts made of network namespaces, and its parts.

The lab tests run tests/scripts/multihost_lab.py once, inside ``unshare --net --mount
--propagation private``, with every scenario against one lab of three hosts (tests/netlab.py);
each test asserts on its scenario's report. They need root, ``ip`` and ``unshare`` and are
skipped, with the reason, without them (CI runs as root and runs them). The other tests run
the launcher's remote path on this machine alone, through a template that stays local.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from shardloader import launch
from shardloader.launch import _hosts
from shardloader.sampler import RandomSampler

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
import dist_worker  # noqa: E402
import netlab  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "scripts"))
import multihost_s3  # noqa: E402
import resume_parts  # noqa: E402

sys.path.pop(0)

DRIVER = REPO / "tests" / "scripts" / "multihost_lab.py"
# Scenarios joined with "+" run at the same time, on hosts or in phases that the others leave
# alone (resume's three jobs run beside train's, each cluster on its own ports; s3's job beside
# worker_fails's short one; sigterm runs on h1 and h2 while host_lost loses h3; the errors
# before start while unreachable waits out its connect timeout).
GROUPS = [
    "train+resume",
    "worker_fails+s3",
    "host_lost+sigterm",
    "unreachable+loopback+wrong_address+unknown_host",
]
SCENARIOS = [name for group in GROUPS for name in group.split("+")]
# The whole driver takes about 30-60 s here (2 cores shared, s3 beside train adds about 10 s);
# this bounds a hang.
_DRIVER_TIMEOUT_S = 400
# A failure must end the job this soon after it happens (grace period 2 s, polling, startup).
_PROMPT_S = 20.0
# As ssh does: the command reaches a shell as one string, which splits it again.
_SHELL_TEMPLATE = "env SHARDLOADER_TEST_HOST={host} sh -c {command}"


# ---------------------------------------------------------------------- the lab


@pytest.fixture(scope="module")
def lab_reports(tmp_path_factory):
    reason = netlab.unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":  # CI runs as root: a lab it cannot build is a failure
            pytest.fail(f"CI must run the multi-host tests, but no lab can be built: {reason}")
        pytest.skip(f"no network-namespace lab: {reason}")
    out_dir = tmp_path_factory.mktemp("multihost")
    started = time.monotonic()
    multihost_s3.prepare(out_dir)
    try:
        done = subprocess.run(
            [*netlab.SANDBOX, sys.executable, str(DRIVER), str(out_dir), *GROUPS],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=_DRIVER_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the lab driver ran past {_DRIVER_TIMEOUT_S} s: {exc.output!r}")
    if done.returncode != 0:
        pytest.fail(f"the lab driver failed ({done.returncode}): {done.stdout.decode()}")
    reports = {name: json.loads((out_dir / f"{name}.json").read_text()) for name in SCENARIOS}
    reports["_wall_s"] = time.monotonic() - started
    return reports


def _report(reports, name):
    report = reports[name]
    assert "error" not in report, report["error"]
    return report


def _assert_clean(report, hosts=("h1", "h2", "h3")):
    """No process left in any host, and every host's /dev/shm empty."""
    assert {h: report["left"][h] for h in hosts} == {h: [] for h in hosts}, report["stderr"]
    assert {h: report["shm"][h] for h in hosts} == {h: [] for h in hosts}, report["stderr"]


@pytest.mark.timeout(_DRIVER_TIMEOUT_S + 60)
def test_dist_sync_training_across_hosts(lab_reports):
    report = _report(lab_reports, "train")
    assert report["returncode"] == 0, report["stderr"]
    assert (
        "placement: h1 (10.29.0.1): scheduler, server 0; h2 (10.29.0.2): worker 0; "
        in (report["stderr"])
    )
    ranks = report["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert all(r["num_workers"] == 2 and r["loader_workers"] == 2 for r in ranks)
    for epoch in range(dist_worker.EPOCHS):
        parts = [set(r["epochs"][epoch]["ids"]) for r in ranks]
        assert not parts[0] & parts[1], epoch
        assert parts[0] | parts[1] == set(range(dist_worker.NUM_SAMPLES)), epoch
    assert ranks[0]["weight"] == ranks[1]["weight"] and ranks[0]["bias"] == ranks[1]["bias"]
    _assert_clean(report)


@pytest.mark.timeout(_DRIVER_TIMEOUT_S + 60)
def test_a_job_on_two_hosts_resumes_on_three_then_on_one(lab_reports):
    """dist_sync jobs through the launcher, each machine's part from kv.rank: 2 machines (h1,
    h2) stop in epoch 1 after 3 and 5 batches; 3 (h1, h2, h3) merge their states, resume and
    stop after 2, 0 and 4 batches of their shares; 1 (h2) finishes the epoch and runs the next."""
    report = _report(lab_reports, "resume")
    stages = report["stages"]
    assert [s["name"] for s in stages] == ["two", "three", "one"], report["stderr"]
    for stage in stages:
        assert stage["returncode"] == 0, stage["stderr"]
    assert (
        "placement: h1 (10.29.0.1): scheduler, server 0, worker 1; h2 (10.29.0.2): worker 0"
        in (stages[0]["stderr"])
    )
    assert "h3 (10.29.0.3): worker 1" in stages[1]["stderr"]
    two, three, one = ([row for log in s["logs"] for row in log] for s in stages)
    assert [len(log) for log in stages[0]["logs"]] == [3, 5]  # by kv.rank
    assert [len(log) for log in stages[1]["logs"]] == [2, 0, 4]
    epoch, n = 1, resume_parts.N
    served = [
        s for rows in (two, three, one) for r in rows if r["epoch"] == epoch for s in r["samples"]
    ]
    assert len(served) == n and sorted(served) == list(range(n)), "each sample exactly once"
    # The epoch after it is the one machine's own: the whole permutation of epoch 2.
    order = RandomSampler(n, seed=resume_parts.SEED)
    order.set_epoch(epoch + 1)
    expected, size = list(order), resume_parts.BATCH_SIZE
    batches = [r["samples"] for r in one if r["epoch"] == epoch + 1]
    assert batches == [expected[i : i + size] for i in range(0, n, size)]
    for stage in stages:  # every host's /dev/shm empty after each job
        assert stage["shm_after"] == {"h1": [], "h2": [], "h3": []}, stage["stderr"]
    _assert_clean(report)


@pytest.mark.timeout(_DRIVER_TIMEOUT_S + 60)
def test_a_worker_failing_on_h3_ends_the_job_with_its_code(lab_reports):
    report = _report(lab_reports, "worker_fails")
    assert report["returncode"] == 7, report["stderr"]
    assert "error: worker 1 on h3 (pid " in report["stderr"]
    assert (
        "exited with code 7; stopped scheduler on h1, server 0 on h1, worker 0 on h2"
        in (report["stderr"])
    )
    assert report["elapsed_s"] < _PROMPT_S + 30  # the cluster's start included
    _assert_clean(report)


@pytest.mark.timeout(_DRIVER_TIMEOUT_S + 60)
def test_a_host_lost_mid_epoch_ends_the_job_naming_it(lab_reports):
    report = _report(lab_reports, "host_lost")
    assert report["ready"], report["stderr"]  # both workers had trained a step
    assert any("multihost_forever.py" in cmd for cmd in report["killed"])
    assert report["returncode"] == 128 + 9, report["stderr"]
    assert "worker 1 on h3 (pid " in report["stderr"]
    assert "was killed by SIGKILL" in report["stderr"]
    assert report["after_kill_s"] < _PROMPT_S
    # h3's /dev/shm may keep what its killed loader held; h1 and h2 are clean.
    _assert_clean(report, hosts=("h1", "h2"))
    assert report["left"]["h3"] == []


@pytest.mark.timeout(_DRIVER_TIMEOUT_S + 60)
def test_sigterm_stops_every_process_on_every_host(lab_reports):
    report = _report(lab_reports, "sigterm")
    assert report["ready"], report["stderr"]
    # the wrapper, the worker and its 2 loader processes on each of h1 and h2
    assert report["during"] == {"h1": 4, "h2": 4, "h3": 0}
    assert report["returncode"] == 128 + 15, report["stderr"]
    assert "interrupted by SIGTERM; stopped all processes" in report["stderr"]
    assert report["after_signal_s"] < _PROMPT_S
    _assert_clean(report)


@pytest.mark.timeout(_DRIVER_TIMEOUT_S + 60)
@pytest.mark.parametrize(
    "scenario, code, messages",
    [
        # refused at once, by the argument check
        ("loopback", 2, ["h1=127.0.0.1 is a loopback address", "give each host the address"]),
        # h2 given h3's address: found by the check through the template, before start
        ("wrong_address", 1, ["hosts not ready: 10.29.0.3 is not an address of h2"]),
        ("unknown_host", 1, ["h9 cannot be reached through 'nsenter --net=/run/netns/h9"]),
    ],
)
def test_errors_before_start_name_the_host(lab_reports, scenario, code, messages):
    report = _report(lab_reports, scenario)
    assert report["returncode"] == code, report["stderr"]
    for message in messages:
        assert message in report["stderr"]
    assert "scheduler at" not in report["stderr"]  # nothing started
    _assert_clean(report)


@pytest.mark.timeout(_DRIVER_TIMEOUT_S + 60)
def test_a_cluster_that_does_not_form_ends_naming_the_host(lab_reports):
    report = _report(lab_reports, "unreachable")
    assert report["returncode"] == 1, report["stderr"]
    stderr = report["stderr"]
    assert "the cluster did not form within 6 s" in stderr, stderr
    assert "the scheduler on h1 at 10.29.0.1:" in stderr, stderr
    assert "h3 cannot connect to 10.29.0.1:" in stderr, stderr
    assert "h2 cannot connect" not in stderr, stderr
    assert report["elapsed_s"] < 6 + _PROMPT_S + 30, stderr  # the cluster's start included
    _assert_clean(report)


# ---------------------------------------------------------------------- the parts, no lab


@pytest.mark.timeout(10)
def test_parse_hosts(tmp_path):
    assert _hosts.parse_hosts("a=10.0.0.1, b=10.0.0.2") == [
        _hosts.Host("a", "10.0.0.1"),
        _hosts.Host("b", "10.0.0.2"),
    ]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\na=10.0.0.1\n\nb=10.0.0.2  # second\n")
    assert _hosts.parse_hosts(f"@{hostfile}") == _hosts.parse_hosts("a=10.0.0.1,b=10.0.0.2")
    assert _hosts.parse_hosts("localhost") == [_hosts.Host("localhost", "127.0.0.1")]
    for bad, message in [
        ("a=10.0.0.1,localhost", "localhost=127.0.0.1 is a loopback address"),
        ("a=10.0.0.1,b=127.0.0.2", "b=127.0.0.2 is a loopback address"),
        ("a=10.0.0.1,a=10.0.0.2", "names a more than once"),
        ("a=", "NAME or NAME=ADDRESS"),
        ("", "at least one host"),
        ("shardloader-no-such-host.invalid", "give its address as"),
    ]:
        with pytest.raises(ValueError, match=message):
            _hosts.parse_hosts(bad)


@pytest.mark.timeout(10)
def test_placement():
    hosts = [_hosts.Host(n, n) for n in ("h1", "h2", "h3")]
    nodes = _hosts.place(hosts, num_servers=1, num_workers=2)
    assert [(r, i, h.name) for r, i, h in nodes] == [
        ("scheduler", 0, "h1"),
        ("server", 0, "h1"),
        ("worker", 0, "h2"),
        ("worker", 1, "h3"),
    ]
    two = _hosts.place(hosts[:2], num_servers=2, num_workers=2)
    assert [h.name for _, _, h in two] == ["h1", "h1", "h2", "h1", "h2"]
    assert _hosts.describe_placement(nodes) == (
        "h1 (h1): scheduler, server 0; h2 (h2): worker 0; h3 (h3): worker 1"
    )


@pytest.mark.timeout(10)
def test_remote_command_is_quoted_once_for_ssh():
    host = _hosts.Host("h2", "10.0.0.2")
    argv = ["python", "-c", "print('a b'); import os", "it's", "$HOME", ""]
    ssh = _hosts.remote_argv(_hosts.DEFAULT_REMOTE, host, argv)
    assert ssh[0] == "ssh" and "h2" in ssh and "BatchMode=yes" in ssh
    assert _shell_words(ssh[-1]) == argv  # what the remote shell makes of it
    netns = _hosts.remote_argv("ip netns exec {host}", host, argv)
    assert netns == ["ip", "netns", "exec", "h2", *argv]
    with pytest.raises(ValueError, match="end the template with {command}"):
        _hosts.remote_argv("ssh -p 2222 {host}", host, argv)
    with pytest.raises(ValueError, match="containing {host}"):
        _hosts.remote_argv("ssh", host, argv)
    with pytest.raises(ValueError, match="cannot run 'shardloader-no-such-ssh' from the template"):
        _hosts.check_hosts("shardloader-no-such-ssh {host}", [host], sys.executable, "/", 5)


def _shell_words(command: str):
    """The words a POSIX shell makes of ``command``."""
    script = 'for a in "$@"; do printf "%s\\0" "$a"; done'
    out = subprocess.run(["sh", "-c", f"set -- {command}; {script}"], stdout=subprocess.PIPE)
    return out.stdout.decode().split("\0")[:-1]


@pytest.mark.timeout(30)
def test_a_host_that_does_not_answer_is_named_within_the_deadline():
    hosts = [_hosts.Host("h1", "127.0.0.1"), _hosts.Host("slow", "127.0.0.1")]
    template = "sh -c 'test {host} = slow && sleep 30; exec \"$@\"' {host}"
    started = time.monotonic()
    problems, port = _hosts.check_hosts(template, hosts, sys.executable, str(REPO), 2.0)
    assert time.monotonic() - started < 10
    assert len(problems) == 1 and problems[0].startswith("slow did not answer through 'sh -c")
    assert "within 2 s" in problems[0]
    assert isinstance(port, int)


@pytest.mark.timeout(10)
def test_env_may_not_set_the_launchers_variables():
    with pytest.raises(ValueError, match="env sets DMLC_NODE_HOST, which the launcher sets"):
        launch.launch_local(["true"], 1, env={"DMLC_NODE_HOST": "10.0.0.1"})
    with pytest.raises(ValueError, match="DMLC_PS_ROOT_URI"):
        launch.launch_hosts(["true"], "a=10.0.0.1", 1, env={"DMLC_PS_ROOT_URI": "x"})


def _cli(*args: str, timeout: float = 60):
    tag = uuid.uuid4().hex
    env = dict(os.environ, SHARDLOADER_TEST_TAG=tag, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "shardloader.launch", *args],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        timeout=timeout,
    )
    return done, time.monotonic() - started, tag


def _tagged(tag):
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"SHARDLOADER_TEST_TAG={tag}".encode() in f.read():
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


@pytest.mark.timeout(60)
def test_remote_path_on_one_host_reports_the_failing_worker(no_leaks):
    code = (
        "import os, sys, time; "
        "assert os.environ['SHARDLOADER_TEST_HOST'] == 'solo'; "  # went through the template
        "assert os.environ['DMLC_NODE_HOST'] == '127.0.0.1'; "
        "assert os.getcwd() == " + repr(str(REPO / "tests")) + "; "
        "sys.exit(5) if os.environ['X'] == 'y' else time.sleep(60)"
    )
    done, elapsed, tag = _cli(
        "-n", "1", "-s", "1", "--hosts", "solo=127.0.0.1", "--remote", _SHELL_TEMPLATE,
        "--workdir", str(REPO / "tests"), "--env", "X=y", "--grace-period", "1",
        sys.executable, "-c", code,
    )  # fmt: skip
    stderr = done.stderr.decode()
    assert done.returncode == 5, stderr
    assert "placement: solo (127.0.0.1): scheduler, server 0, worker 0" in stderr
    assert "error: worker 0 on solo (pid " in stderr and "exited with code 5" in stderr
    assert elapsed < _PROMPT_S
    assert _tagged(tag) == []


@pytest.mark.timeout(10)
def test_remote_options_need_hosts(capsys):
    with pytest.raises(SystemExit) as exc:
        launch.main(["-n", "1", "--remote", "ip netns exec {host}", "--workdir", "/", "true"])
    assert exc.value.code == 2
    assert "--remote, --workdir only apply with --hosts" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_a_remote_command_that_does_not_exit_when_asked_is_named(no_leaks):
    # The template's shell outlives the wrapper (not the check before start, which has no
    # "grace" in its arguments): the launcher cannot confirm the stop, says so, and kills its
    # local side.
    template = 'sh -c \'"$@"; case "$*" in *grace*) sleep 30;; esac\' {host}'
    done, elapsed, tag = _cli(
        "-n", "1", "-s", "1", "--hosts", "solo=127.0.0.1", "--remote", template, "--timeout",
        "1", "--grace-period", "0", sys.executable, "-c", "import time; time.sleep(60)",
    )  # fmt: skip
    stderr = done.stderr.decode()
    assert done.returncode == launch.EXIT_TIMEOUT, stderr
    assert "timed out after 1 s with worker 0 on solo still running" in stderr
    assert "could not confirm that worker 0 on solo stopped: its remote command did not exit" in (
        stderr
    )
    assert "processes may be left on solo" in stderr
    assert elapsed < 1 + 7 + _PROMPT_S
    assert _tagged(tag) == []


@pytest.mark.timeout(_DRIVER_TIMEOUT_S + 60)
def test_machines_read_their_parts_of_s3_from_a_server_on_h1(lab_reports):
    """Through the launcher, a dist_sync job's machines on h2 and h3 read s3:// RecordIO from
    SeaweedFS on h1, each with its own cache; the second epoch comes from each host's cache
    with the server stopped."""
    report = _report(lab_reports, "s3")
    assert report["returncode"] == 0, report["stderr"]
    assert report["read_first"] and report["server_code"] == 0, report["stderr"]
    ranks = report["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1] and {r["num_parts"] for r in ranks} == {2}
    assert sorted(r["host"] for r in ranks) == ["10.29.0.2", "10.29.0.3"]
    assert ranks[0]["cache"] != ranks[1]["cache"]
    expected = report["expected"]
    for epoch in (0, 1):
        parts = [dict(r["epochs"][epoch]) for r in ranks]
        assert not parts[0].keys() & parts[1].keys(), epoch
        assert sorted(parts[0].keys() | parts[1].keys()) == list(range(multihost_s3.NUM_RECORDS))
        for part in parts:  # the bytes are the local file's records
            assert all(expected[index] == sha for index, sha in part.items()), epoch
    size, chunk, offsets = report["size"], report["chunk_bytes"], report["offsets"]
    slack = chunk + multihost_s3.MAX_RECORD_BYTES + 16  # a chunk's size, at most
    for r in ranks:
        assert r["epochs"][1] == r["epochs"][0]
        fetched = r["fetched"]  # one cache entry per ranged GET
        assert len(fetched) > 1
        assert all(a[1] == b[0] for a, b in zip(fetched, fetched[1:]))  # each byte once
        # Only its part: every GET holds a record of the part, and the bytes are the part's
        # span and at most a chunk on either side.
        mine = [offsets[index] for index, _ in r["epochs"][0]]
        assert all(any(a <= offset < b for offset in mine) for a, b in fetched), fetched
        span = max(mine) - min(mine) + multihost_s3.MAX_RECORD_BYTES + 16
        assert sum(b - a for a, b in fetched) <= span + 2 * slack, fetched
        assert r["fetched_after"] == fetched  # the second epoch made no request
    starts = sorted(r["fetched"][0][0] for r in ranks)
    stops = sorted(r["fetched"][-1][1] for r in ranks)
    assert starts[0] == 0 and stops[-1] == size
    _assert_clean(report)
