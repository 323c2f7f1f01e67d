"""Several "hosts" on one machine, made of Linux namespaces, for whole-program tests.

Each host is a network namespace (its own ``eth0`` with a 10.x address on a bridge, its own
``lo``, routing and ports) plus a mount namespace with its own tmpfs on ``/dev/shm`` (held by
one ``sh`` that the lab keeps outside the host's network namespace, reached through the
symlink ``<state_dir>/<host>/mnt``). A command runs on a host through ``Host.argv``
(``nsenter --net=... --mount=... --``); ``Lab.template`` is the same prefix as a ``--remote``
template for ``python -m shardloader.launch`` (``{host}`` stands for the host's name), and
``Lab.hosts_arg()`` the matching ``--hosts``.

``ip netns exec {host}`` also works as a template, but gives every command a fresh mount
view of the machine's own ``/dev/shm``: use it where a host's own ``/dev/shm`` does not
matter.

**Only inside the outer sandbox.** Build a lab only in a process started under
``SANDBOX`` (``unshare --net --mount --propagation private``): the sandbox's network has only
``lo``, so no test packet can leave the machine even if a command forgets to enter a host,
and its mounts are private, so nothing it mounts shows outside. ``build`` refuses to run where
the network namespace has another interface than ``lo``. The namespaces outlive the sandbox's
processes only while processes run in them: always ``teardown`` (``Lab`` is a context manager),
which kills every process in every host.

Typical use, from a driver script run as ``unshare --net --mount --propagation private python
driver.py``::

    import netlab
    with netlab.build(["h1", "h2", "h3"]) as lab:
        lab.check_connectivity()
        lab.run("h2", ["python", "-c", "print('hello from h2')"])
        lab.pids("h3")            # the processes in h3's network namespace
        lab.shm_entries("h1")     # what is left in h1's /dev/shm

``unavailable()`` says why a lab cannot be built here (not root, no ``ip``, ``unshare``
refused), for a test to skip with that reason. tests/scripts/multihost_lab.py is a driver
built on it (scenarios of the launcher, each reporting JSON), and tests/test_multihost.py
runs it with a deadline: follow them to add scenarios.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

# The outer sandbox every lab runs in.
SANDBOX = ["unshare", "--net", "--mount", "--propagation", "private"]
_TOOLS = ("ip", "unshare", "nsenter", "mount")
_BRIDGE = "nlbr0"
_SHM_SIZE = "512m"
_CONNECT_TIMEOUT_S = 10.0


def unavailable() -> Optional[str]:
    """Why a lab cannot be built on this machine, or None when it can."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root (the lab runs inside unshare --net --mount)"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing tools: {', '.join(missing)} (iproute2, util-linux)"
    probe = subprocess.run(
        [*SANDBOX, "ip", "link", "add", "nlprobe", "type", "bridge"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"cannot create namespaces here: {probe.stderr.decode(errors='replace').strip()}"
    return None


def _sh(*argv: str) -> None:
    """Run a set-up command; raise with its output if it fails."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stdout.decode(errors='replace')}")


class Host:
    """One host: a network namespace, a mount namespace, and an address."""

    def __init__(self, name: str, address: str, state_dir: str) -> None:
        self.name = name
        self.address = address
        self.netns = f"/run/netns/{name}"
        self.mntns = os.path.join(state_dir, name, "mnt")

    def argv(self, argv: Sequence[str]) -> List[str]:
        """``argv`` run on this host."""
        return ["nsenter", f"--net={self.netns}", f"--mount={self.mntns}", "--", *argv]

    def netns_inode(self) -> int:
        return os.stat(self.netns).st_ino

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address!r})"


class Lab:
    """The hosts of one lab; ``build`` makes one. Use as a context manager, or call
    ``teardown``."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.hosts: Dict[str, Host] = {}
        self.holders: List[subprocess.Popen] = []  # one process per host's mount namespace
        self.template = f"nsenter --net=/run/netns/{{host}} --mount={state_dir}/{{host}}/mnt --"

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def host(self, name: str) -> Host:
        return self.hosts[name]

    def hosts_arg(self, names: Optional[Sequence[str]] = None) -> str:
        """``--hosts`` for the launcher: ``h1=10.29.0.1,h2=...``."""
        names = list(self.hosts) if names is None else names
        return ",".join(f"{n}={self.hosts[n].address}" for n in names)

    def run(self, host: str, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``host`` (``subprocess.run``'s keywords; a 60 s timeout by
        default)."""
        kwargs.setdefault("timeout", 60)
        return subprocess.run(self.hosts[host].argv(argv), **kwargs)

    def popen(self, host: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (``subprocess.Popen``'s keywords)."""
        return subprocess.Popen(self.hosts[host].argv(argv), **kwargs)

    def pids(self, host: str) -> List[int]:
        """The processes (not zombies) in ``host``'s network namespace."""
        inode = self.hosts[host].netns_inode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino != inode:
                    continue
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue  # exited meanwhile
            if stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X"):
                found.append(int(entry))
        return found

    def cmdline(self, pid: int) -> str:
        """A process's command line, or '' once it has exited."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return ""

    def kill_all(self, host: str, signum: int = signal.SIGKILL, wait_s: float = 5.0) -> List[int]:
        """Send ``signum`` to every process in ``host`` (a host lost, when SIGKILL) until none
        is left or ``wait_s`` passes; return the pids signalled."""
        signalled: List[int] = []
        deadline = time.monotonic() + wait_s
        while True:
            pids = self.pids(host)
            if not pids or time.monotonic() >= deadline:
                return signalled
            for pid in pids:
                try:
                    os.kill(pid, signum)
                    signalled.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def shm_entries(self, host: str) -> List[str]:
        """The names in ``host``'s ``/dev/shm``."""
        done = self.run(host, ["ls", "-A", "/dev/shm"], stdout=subprocess.PIPE, check=True)
        return done.stdout.decode().split()

    def check_connectivity(self, timeout: float = _CONNECT_TIMEOUT_S) -> None:
        """Check with TCP (the image has no ``ping``) that every host reaches every other host
        at its address; raise ``RuntimeError`` naming the pairs that do not."""
        listeners = {}
        try:
            for name, host in self.hosts.items():
                proc = self.popen(
                    name,
                    [sys.executable, "-c", _LISTENER, host.address],
                    stdout=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                )
                listeners[name] = proc
            ports = {}
            for name, proc in listeners.items():
                line = proc.stdout.readline().decode().strip()
                if not line.isdigit():
                    raise RuntimeError(f"the connectivity listener on {name} did not start")
                ports[name] = line
            failures = []
            for name in self.hosts:
                peers = [f"{h.address}:{ports[n]}" for n, h in self.hosts.items() if n != name]
                done = self.run(
                    name,
                    [sys.executable, "-c", _CONNECTOR, str(timeout), *peers],
                    stdout=subprocess.PIPE,
                    timeout=timeout + 30,
                )
                failures += [f"{name} -> {p}" for p in done.stdout.decode().split()]
            if failures:
                raise RuntimeError("hosts cannot reach each other: " + ", ".join(failures))
        finally:
            for proc in listeners.values():
                proc.kill()
                proc.communicate()

    def teardown(self) -> None:
        """Kill every process in every host, then remove the namespaces, the bridge and the
        mounts. Idempotent; errors are collected and raised at the end."""
        errors = []
        for name in list(self.hosts):
            self.kill_all(name)
            if self.pids(name):
                errors.append(f"processes survive SIGKILL in {name}: {self.pids(name)}")
        for name in list(self.hosts):
            argv = ["ip", "netns", "del", name]
            done = subprocess.run(argv, stderr=subprocess.PIPE, timeout=30)
            if done.returncode != 0:
                errors.append(f"{' '.join(argv)}: {done.stderr.decode().strip()}")
            del self.hosts[name]
        for holder in self.holders:  # their mount namespaces and tmpfs go with them
            holder.stdin.close()
            holder.wait(timeout=30)
        self.holders.clear()
        subprocess.run(["ip", "link", "del", _BRIDGE], stderr=subprocess.DEVNULL, timeout=30)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if errors:
            raise RuntimeError("lab teardown: " + "; ".join(errors))


def build(names: Sequence[str] = ("h1", "h2", "h3"), subnet: str = "10.29.0") -> Lab:
    """Build one host per name, ``names[i]`` at ``{subnet}.{i + 1}/24``, each reaching the
    others through a bridge, with ``lo`` up and its own tmpfs ``/dev/shm``. Must run inside
    ``SANDBOX``; raises ``RuntimeError`` outside it. Tears down what it built on failure."""
    extra = [name for _, name in socket.if_nameindex() if name != "lo"]
    if extra:
        raise RuntimeError(
            f"refusing to build a lab outside the sandbox (interfaces {extra}); run the "
            f"driver under {' '.join(SANDBOX)}"
        )
    # `ip netns add` names a namespace by a file under /run/netns, which the sandbox would
    # share with the machine: a private tmpfs there keeps two labs (or one killed before its
    # teardown) from colliding on h1..h3, and the names go with the sandbox.
    os.makedirs("/run/netns", exist_ok=True)
    _sh("mount", "-t", "tmpfs", "-o", "size=1m,mode=755", "netlab", "/run/netns")
    state_dir = tempfile.mkdtemp(prefix="netlab-")
    lab = Lab(state_dir)
    try:
        _sh("ip", "link", "set", "lo", "up")
        _sh("ip", "link", "add", _BRIDGE, "type", "bridge")
        _sh("ip", "link", "set", _BRIDGE, "up")
        for i, name in enumerate(names):
            host = Host(name, f"{subnet}.{i + 1}", state_dir)
            _sh("ip", "netns", "add", name)
            lab.hosts[name] = host
            _sh("ip", "link", "add", f"nl-{name}", "type", "veth", "peer", "eth0", "netns", name)
            _sh("ip", "link", "set", f"nl-{name}", "master", _BRIDGE, "up")
            _sh("ip", "-n", name, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _sh("ip", "-n", name, "link", "set", "eth0", "up")
            _sh("ip", "-n", name, "link", "set", "lo", "up")
            os.mkdir(os.path.dirname(host.mntns))
            lab.holders.append(_mount_ns_holder(host.mntns))
    except BaseException:
        with contextlib.suppress(RuntimeError):  # the first error is the one to see
            lab.teardown()
        raise
    return lab


def _mount_ns_holder(link: str) -> subprocess.Popen:
    """A process in a new mount namespace with its own tmpfs on /dev/shm; ``link`` becomes a
    symlink to that namespace, for ``nsenter --mount``. The namespace lasts as long as the
    process, which waits for EOF on its stdin.

    (A holder rather than a bind mount of the namespace: binding one fails now and then with
    EINVAL on recent kernels, whose namespace ids are not ordered by creation.)"""
    script = f"mount -t tmpfs -o size={_SHM_SIZE},mode=1777 tmpfs /dev/shm && echo ready && read _"
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    if holder.stdout.readline().strip() != b"ready":
        holder.stdin.close()
        holder.wait(timeout=30)
        raise RuntimeError("cannot mount a tmpfs on /dev/shm in a new mount namespace")
    os.symlink(f"/proc/{holder.pid}/ns/mnt", link)
    return holder


# Listens on an address, prints its port, accepts until killed.
_LISTENER = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    s.accept()[0].close()
"""

# Connects to each ADDRESS:PORT, retrying until the timeout; prints the ones it cannot reach.
_CONNECTOR = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[1])
for peer in sys.argv[2:]:
    address, port = peer.rsplit(":", 1)
    while True:
        try:
            socket.create_connection((address, int(port)), timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                print(peer)
                break
            time.sleep(0.1)
"""
