"""The hosts of a several-machine launch: parsing ``--hosts``, placing the nodes, building the
remote command from the ``--remote`` template, and the checks made through it before start
(every host answers, its address is its own) and after a cluster failed to form (which host
cannot reach the scheduler)."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

# ssh in batch mode: no password prompt; a lost host is noticed within about 15 s.
DEFAULT_REMOTE = (
    "ssh -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=5 "
    "-o ServerAliveCountMax=3 {host} {command}"
)
_WRAPPER_START = "# The launcher sends the source from here on"
_WRAPPER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_wrapper.py")


@dataclass(frozen=True)
class Host:
    """One entry of ``--hosts``: the name the template is given and the address its nodes
    bind and advertise."""

    name: str
    address: str


def parse_hosts(hosts: Union[str, Sequence[str]]) -> List[Host]:
    """``'h1,h2=10.0.0.2'``, ``'@FILE'`` (one entry a line, ``#`` comments) or a list of
    entries. Refuses duplicates, and loopback among several hosts."""
    if isinstance(hosts, str):
        if hosts.startswith("@"):
            with open(hosts[1:]) as f:
                lines = [line.split("#", 1)[0].strip() for line in f]
            entries = [line for line in lines if line]
        else:
            entries = [entry.strip() for entry in hosts.split(",") if entry.strip()]
    else:
        entries = list(hosts)
    if not entries:
        raise ValueError(f"hosts must name at least one host, got {hosts!r}")
    parsed = [_parse_entry(entry) for entry in entries]
    names = [h.name for h in parsed]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"hosts names {', '.join(duplicates)} more than once")
    if len(parsed) > 1:
        loopback = [f"{h.name}={h.address}" for h in parsed if _is_loopback(h)]
        if loopback:
            raise ValueError(
                f"hosts: {', '.join(loopback)} is a loopback address, which the other hosts "
                "cannot reach (the cluster would never form); give each host the address "
                "the others reach it at, as NAME=ADDRESS"
            )
    return parsed


def _parse_entry(entry: str) -> Host:
    name, sep, address = (part.strip() for part in entry.partition("="))
    if not name or (sep and not address) or any(c.isspace() for c in name + address):
        raise ValueError(f"a hosts entry is NAME or NAME=ADDRESS, got {entry!r}")
    if not sep:
        try:
            address = socket.gethostbyname(name)
        except OSError as exc:
            raise ValueError(
                f"hosts: cannot resolve {name!r} ({exc}); give its address as {name}=ADDRESS"
            ) from None
    return Host(name, address)


def _is_loopback(host: Host) -> bool:
    if host.name == "localhost" or host.address == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.address).is_loopback
    except ValueError:
        return False


def place(hosts: Sequence[Host], num_servers: int, num_workers: int) -> List[Tuple[str, int, Host]]:
    """``(role, index, host)`` of every node: the scheduler on the first host, then the servers
    and then the workers round-robin over the hosts in order, the workers continuing where the
    servers stopped."""
    nodes = [("scheduler", 0, hosts[0])]
    order = [("server", i) for i in range(num_servers)] + [
        ("worker", i) for i in range(num_workers)
    ]
    nodes += [(role, index, hosts[k % len(hosts)]) for k, (role, index) in enumerate(order)]
    return nodes


def describe_placement(nodes: Sequence[Tuple[str, int, Host]]) -> str:
    """``'h1 (10.0.0.1): scheduler, server 0; h2 (10.0.0.2): worker 0'``."""
    by_host: Dict[Host, List[str]] = {}
    for role, index, host in nodes:
        by_host.setdefault(host, []).append(role if role == "scheduler" else f"{role} {index}")
    return "; ".join(f"{h.name} ({h.address}): {', '.join(n)}" for h, n in by_host.items())


def check_template(template: str) -> List[str]:
    """The template's words; it must contain ``{host}``. Raises ``ValueError``."""
    words = shlex.split(template)
    if not words or not any("{host}" in w for w in words):
        raise ValueError(
            f"remote must be a command template containing {{host}}, such as "
            f"'ssh {{host}} {{command}}' or 'ip netns exec {{host}}', got {template!r}"
        )
    if os.path.basename(words[0]) == "ssh" and "{command}" not in words:
        raise ValueError(
            "remote: ssh hands its command to the remote shell as one string; end the "
            f"template with {{command}}, such as 'ssh -p 2222 {{host}} {{command}}', got "
            f"{template!r}"
        )
    return words


def remote_argv(template: str, host: Host, argv: Sequence[str]) -> List[str]:
    """``argv`` run on ``host`` through the template. ``{command}`` in the template is replaced
    by ``argv`` shell-quoted as one word (for ssh); without it the words are appended."""
    words = check_template(template)
    out = [w.replace("{host}", host.name) for w in words]
    if "{command}" in words:
        command = shlex.join(argv)
        return [command if w == "{command}" else w for w in out]
    return out + list(argv)


def wrapper_argv(
    python: str, cwd: str, env: Dict[str, str], unset: Sequence[str], argv: Sequence[str],
    grace: float,
) -> List[str]:  # fmt: skip
    """The command that runs ``argv`` on a host under the wrapper (see ``_wrapper``)."""
    with open(_WRAPPER_PATH) as f:
        source = f.read()
    source = source[source.index(_WRAPPER_START) :]
    spec = dict(cwd=cwd, env=env, unset=list(unset), argv=list(argv), grace=grace)
    return [python, "-c", source, json.dumps(spec)]


# Run on every host before start: can it bind its own address, does the working directory
# exist there, and a free port at the address (for the scheduler's host).
_CHECK = """
import json, os, socket, sys
address, cwd = sys.argv[1], sys.argv[2]
report = {"cwd": os.path.isdir(cwd)}
try:
    s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    s.bind((address, 0))
    report["port"] = s.getsockname()[1]
    s.close()
except OSError as exc:
    report["bind_error"] = str(exc)
print(json.dumps(report))
"""

# Run on every host after the cluster failed to form: can it open a TCP connection to the
# scheduler?
_PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("ok")
except OSError as exc:
    print(exc)
"""


def _run_on_hosts(
    template: str, hosts: Sequence[Host], argvs: Dict[Host, List[str]], deadline_s: float
) -> Dict[Host, Tuple[Optional[int], str, str]]:
    """Run each host's argv through the template, all at once; ``(returncode or None when
    it did not finish within deadline_s, stdout, stderr)`` per host."""
    procs = {}
    for host in hosts:
        argv = remote_argv(template, host, argvs[host])
        try:
            procs[host] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            for proc in procs.values():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
            raise ValueError(f"remote: cannot run {argv[0]!r} from the template: {exc}") from None
    deadline = time.monotonic() + deadline_s
    results = {}
    for host, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            results[host] = (
                proc.returncode,
                out.decode(errors="replace"),
                err.decode(errors="replace"),
            )
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            results[host] = (None, "", "")
    return results


def check_hosts(
    template: str, hosts: Sequence[Host], python: str, cwd: str, deadline_s: float
) -> Tuple[List[str], Optional[int]]:
    """Check every host through the template within ``deadline_s``; return the problems (one
    sentence each, naming the host) and a free port at the first host's address."""
    argvs = {h: [python, "-c", _CHECK, h.address, cwd] for h in hosts}
    results = _run_on_hosts(template, hosts, argvs, deadline_s)
    problems, port = [], None
    for host in hosts:
        code, out, err = results[host]
        how = shlex.join(remote_argv(template, host, ["..."]))
        if code is None:
            problems.append(f"{host.name} did not answer through '{how}' within {deadline_s:g} s")
            continue
        try:
            report = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            tail = (err.strip().splitlines() or ["no output"])[-1]
            problems.append(
                f"{host.name} cannot be reached through '{how}' (exit code {code}: {tail})"
            )
            continue
        if "bind_error" in report:
            problems.append(
                f"{host.address} is not an address of {host.name} (binding it there failed: "
                f"{report['bind_error']}); give {host.name}=ADDRESS with an address of that host "
                "that the other hosts reach"
            )
        if not report["cwd"]:
            problems.append(
                f"the working directory {cwd} does not exist on {host.name}; every host needs "
                "the same paths (or pass --workdir)"
            )
        if host == hosts[0]:
            port = report.get("port")
    return problems, port


def probe_scheduler(
    template: str, hosts: Sequence[Host], python: str, address: str, port: int, deadline_s: float
) -> List[str]:
    """From every host, try a TCP connection to the scheduler; one sentence per host that
    cannot open one (or cannot be asked)."""
    argvs = {h: [python, "-c", _PROBE, address, str(port), str(deadline_s)] for h in hosts}
    results = _run_on_hosts(template, hosts, argvs, deadline_s + 10)
    problems = []
    for host in hosts:
        code, out, _ = results[host]
        answer = out.strip() if code == 0 else f"no answer (exit code {code})"
        if answer != "ok":
            problems.append(f"{host.name} cannot connect to {address}:{port} ({answer})")
    return problems


def default_python() -> str:
    """The Python the remote commands run: the launcher's own, at the same path."""
    return sys.executable
