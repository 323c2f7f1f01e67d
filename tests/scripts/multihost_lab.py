"""Scenarios of ``python -m shardloader.launch --hosts`` on a lab of three hosts (tests/netlab.py).

Run inside the sandbox: ``unshare --net --mount --propagation private python multihost_lab.py
OUT_DIR GROUP...`` (a group: scenarios joined with ``+``, run at the same time). Builds one lab
(h1, h2, h3), runs each group in turn and writes
``OUT_DIR/<scenario>.json``: the launcher's exit code, wall time, output, the processes left
in each host and each host's ``/dev/shm`` afterwards, and what the scenario adds. The test
(tests/test_multihost.py) asserts on those files; this script only observes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import multihost_s3  # noqa: E402  (beside this script)
import netlab  # noqa: E402

WORKER = str(REPO / "tests" / "dist_worker.py")
FOREVER = str(REPO / "tests" / "scripts" / "multihost_forever.py")
RESUME = str(REPO / "tests" / "scripts" / "resume_parts.py")
_RUN_TIMEOUT_S = 90
_READY_TIMEOUT_S = 60


class Scenarios:
    def __init__(self, lab: netlab.Lab, out_dir: Path) -> None:
        self.lab, self.out_dir = lab, out_dir

    def launcher(
        self, hosts: str, *args: str, template: str = "", workers: int = 2
    ) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        argv = [
            sys.executable, "-m", "shardloader.launch", "-n", str(workers), "-s", "1",
            "--hosts", hosts, "--remote", template or self.lab.template, "--grace-period", "2",
            "--env", f"PYTHONPATH={REPO}", "--env", "OMP_NUM_THREADS=1", *args,
        ]  # fmt: skip
        return subprocess.Popen(
            argv, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def finish(self, proc: subprocess.Popen, started: float, **extra) -> dict:
        try:
            out, err = proc.communicate(timeout=_RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        report = {
            "returncode": proc.returncode,
            "elapsed_s": time.monotonic() - started,
            "stdout": out.decode(errors="replace"),
            "stderr": err.decode(errors="replace"),
        }
        report.update(extra)
        return report

    def leftovers(self) -> dict:
        """Processes left in each host (with their command lines) and each /dev/shm."""
        pids = {h: [self.lab.cmdline(p) for p in self.lab.pids(h)] for h in self.lab.hosts}
        shm = {h: self.lab.shm_entries(h) for h in self.lab.hosts}
        return {"left": pids, "shm": shm}

    def wait_ready(self, run_dir: Path, count: int, proc: subprocess.Popen) -> bool:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if len(list(run_dir.glob("ready-*"))) >= count:
                return True
            time.sleep(0.05)
        return False

    def run_dir(self, name: str) -> Path:
        path = self.out_dir / name
        path.mkdir()
        return path

    # ------------------------------------------------------------------ the scenarios

    def train(self) -> dict:
        """dist_sync training, workers on h2 and h3, two loader processes each."""
        run_dir = self.run_dir("train")
        started = time.monotonic()
        proc = self.launcher(
            self.lab.hosts_arg(),
            "--timeout",
            "80",
            sys.executable,
            WORKER,
            str(run_dir),
            "--loader-workers",
            "2",
        )
        report = self.finish(proc, started)
        report["ranks"] = [json.loads(p.read_text()) for p in sorted(run_dir.glob("rank*.json"))]
        return report

    def worker_fails(self) -> dict:
        """The worker on h3 exits 7; the one on h2 would sleep. Through ``ip netns exec``."""
        code = (
            "import os, sys, time; "
            f"sys.exit(7) if os.environ['DMLC_NODE_HOST'] == {self.lab.host('h3').address!r} "
            "else time.sleep(120)"
        )
        started = time.monotonic()
        proc = self.launcher(
            self.lab.hosts_arg(), "--timeout", "80", sys.executable, "-c", code,
            template="ip netns exec {host}",
        )  # fmt: skip
        return self.finish(proc, started)

    def host_lost(self) -> dict:
        """Every process in h3 killed mid-epoch."""
        run_dir = self.run_dir("host_lost")
        started = time.monotonic()
        proc = self.launcher(
            self.lab.hosts_arg(), "--timeout", "80", sys.executable, FOREVER, str(run_dir)
        )
        ready = self.wait_ready(run_dir, 2, proc)
        killed_at = time.monotonic()
        killed = [self.lab.cmdline(p) for p in self.lab.pids("h3")]
        self.lab.kill_all("h3")
        report = self.finish(proc, started, ready=ready, killed=killed)
        report["after_kill_s"] = time.monotonic() - killed_at
        return report

    def sigterm(self) -> dict:
        """SIGTERM to the launcher while both workers train, on h1 and h2 only (it runs
        alongside host_lost)."""
        run_dir = self.run_dir("sigterm")
        started = time.monotonic()
        proc = self.launcher(
            self.lab.hosts_arg(["h1", "h2"]), "--timeout", "80", sys.executable, FOREVER,
            str(run_dir),
        )  # fmt: skip
        ready = self.wait_ready(run_dir, 2, proc)
        during = {
            h: len([p for p in self.lab.pids(h) if str(run_dir) in self.lab.cmdline(p)])
            for h in self.lab.hosts
        }
        signalled_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        report = self.finish(proc, started, ready=ready, during=during)
        report["after_signal_s"] = time.monotonic() - signalled_at
        return report

    def resume(self) -> dict:
        """A dist_sync job of 2 machines (h1, h2) stopped mid-epoch, resumed on 3 (h1, h2,
        h3) and stopped again, then finished on 1 (h2), which runs the next epoch too. Each
        machine's part is its ``kv.rank`` of ``kv.num_workers``; the states go to a directory
        every host reads (the hosts share all files but /dev/shm: a shared checkpoint store)."""
        run_dir = self.run_dir("resume")
        stages = [
            # (name, hosts, batches each rank takes before the stop, or None: finish)
            ("two", ["h1", "h2"], ["3", "5"]),
            ("three", ["h1", "h2", "h3"], ["2", "0", "4"]),
            ("one", ["h2"], None),
        ]
        report: dict = {"stages": []}
        states: list = []
        for name, hosts, stop_after in stages:
            log = str(run_dir / f"{name}-{{rank}}.log")
            tail = ["--finish"]
            if stop_after is not None:
                save = str(run_dir / f"{name}-{{rank}}.json")
                tail = ["--stop-after", *stop_after, "--save", save]
            command = [RESUME, "--kvstore", "--log", log, "--epoch", "1", *tail]
            if states:
                command += ["--state", *states]
            started = time.monotonic()
            proc = self.launcher(
                self.lab.hosts_arg(hosts), "--timeout", "60", sys.executable, *command,
                workers=len(hosts),
            )  # fmt: skip
            stage = self.finish(proc, started, name=name)
            stage["logs"] = [
                [
                    json.loads(line)
                    for line in (run_dir / f"{name}-{r}.log").read_text().splitlines()
                ]
                if (run_dir / f"{name}-{r}.log").exists()
                else None
                for r in range(len(hosts))
            ]
            stage["shm_after"] = {h: self.lab.shm_entries(h) for h in self.lab.hosts}
            report["stages"].append(stage)
            if stage["returncode"] != 0:
                break
            states = [str(run_dir / f"{name}-{r}.json") for r in range(len(hosts))]
        report["elapsed_s"] = sum(s["elapsed_s"] for s in report["stages"])
        report["stderr"] = "\n".join(s["stderr"] for s in report["stages"])
        return report

    def loopback(self) -> dict:
        h2 = self.lab.host("h2").address
        started = time.monotonic()
        proc = self.launcher(f"h1=127.0.0.1,h2={h2}", WORKER, str(self.out_dir))
        return self.finish(proc, started)

    def wrong_address(self) -> dict:
        """h2 given h3's address."""
        hosts = self.lab.hosts_arg().replace(
            f"h2={self.lab.host('h2').address}", f"h2={self.lab.host('h3').address}"
        )
        started = time.monotonic()
        proc = self.launcher(hosts, WORKER, str(self.out_dir))
        return self.finish(proc, started, hosts=hosts)

    def unknown_host(self) -> dict:
        """A host that the template cannot reach (no such namespace)."""
        started = time.monotonic()
        proc = self.launcher(self.lab.hosts_arg() + ",h9=10.29.0.9", WORKER, str(self.out_dir))
        return self.finish(proc, started)

    def unreachable(self) -> dict:
        """h3 cannot reach h1 (a blackhole route): the cluster never forms."""
        h1 = self.lab.host("h1").address
        route = ["ip", "route", "add", "blackhole", f"{h1}/32"]
        self.lab.run("h3", route, check=True)
        try:
            started = time.monotonic()
            proc = self.launcher(
                self.lab.hosts_arg(), "--connect-timeout", "6", "--timeout", "80",
                sys.executable, WORKER, str(self.out_dir),
            )  # fmt: skip
            return self.finish(proc, started)
        finally:
            self.lab.run("h3", ["ip", "route", "del", "blackhole", f"{h1}/32"], check=True)

    def s3(self) -> dict:
        """Machines on h2 and h3 read their parts of s3:// RecordIO from a server on h1."""
        return multihost_s3.scenario(self, self.run_dir("s3"))


def _run(scenarios: Scenarios, name: str, reports: dict) -> None:
    try:
        reports[name] = getattr(scenarios, name)()
    except Exception as exc:  # reported, so that the other scenarios still run
        reports[name] = {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    """``OUT_DIR GROUP...``: each GROUP is scenario names joined with ``+``, run at the same
    time (each on hosts or in phases the others leave alone); the processes and /dev/shm
    left are read once the whole group is over."""
    out_dir = Path(sys.argv[1])
    started = time.monotonic()
    with netlab.build(["h1", "h2", "h3"]) as lab:
        lab.check_connectivity()
        built_s = time.monotonic() - started
        scenarios = Scenarios(lab, out_dir)
        for group in sys.argv[2:]:
            reports: dict = {}
            threads = [
                threading.Thread(target=_run, args=(scenarios, name, reports))
                for name in group.split("+")
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            left = scenarios.leftovers()
            for name, report in reports.items():
                report.update(left, lab_built_s=built_s, group=group)
                (out_dir / f"{name}.json").write_text(json.dumps(report))
    (out_dir / "done.json").write_text(json.dumps({"total_s": time.monotonic() - started}))


if __name__ == "__main__":
    main()
