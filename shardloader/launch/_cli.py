"""``python -m shardloader.launch``: the command line over ``launch_local``."""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._hosts import DEFAULT_REMOTE
from ._local import _DEFAULT_GRACE_PERIOD_S, _HOST, launch_local
from ._nodes import EXIT_CANNOT_START, LaunchResult
from ._remote import _DEFAULT_CONNECT_TIMEOUT_S, launch_hosts


class _Interrupted(BaseException):
    """Raised by the command line's signal handler, so that teardown runs in ``finally``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _options() -> List[Tuple[Tuple[str, ...], Dict[str, Any]]]:
    """Each argument of the command line: its flags (or name) and ``add_argument``'s keywords."""
    return [
        (
            ("-n", "--num-workers"),
            dict(type=int, required=True, help="number of workers, each running COMMAND"),
        ),
        (
            ("-s", "--num-servers"),
            dict(type=int, default=None, help="number of servers (default: NUM_WORKERS)"),
        ),
        (
            ("--port",),
            dict(
                type=int,
                default=None,
                help="scheduler port, DMLC_PS_ROOT_PORT (default: a free port)",
            ),
        ),
        (
            ("--timeout",),
            dict(
                type=float,
                default=None,
                metavar="SECONDS",
                help="stop everything and exit 124 after this many seconds",
            ),
        ),
        (
            ("--grace-period",),
            dict(
                type=float,
                default=_DEFAULT_GRACE_PERIOD_S,
                metavar="SECONDS",
                help="wait between SIGTERM and SIGKILL when stopping (default: %(default)s)",
            ),
        ),
        (
            ("--env",),
            dict(
                action="append",
                default=[],
                metavar="NAME=VALUE",
                help="set an environment variable in every process (repeatable)",
            ),
        ),
        (
            ("--hosts",),
            dict(
                default=None,
                metavar="HOSTS",
                help=(
                    "run on several hosts: NAME[=ADDRESS],... or @FILE with one a line. "
                    "The scheduler runs on the first host; the servers, then the workers, "
                    "round-robin over the hosts. ADDRESS (default: NAME resolved) is where "
                    "that host's processes bind and are reached"
                ),
            ),
        ),
        (
            ("--remote",),
            dict(
                default=None,
                metavar="TEMPLATE",
                help=(
                    "with --hosts: the command that runs a command on {host}; {command} is "
                    "the command as one shell-quoted word, else its words are appended "
                    f"(default: {DEFAULT_REMOTE!r})"
                ),
            ),
        ),
        (
            ("--connect-timeout",),
            dict(
                type=float,
                default=None,
                metavar="SECONDS",
                help=(
                    "with --hosts: how long every host may take to answer before start, and "
                    "the cluster to form once the scheduler listens: every worker must "
                    "create its kvstore by then (default: "
                    f"{_DEFAULT_CONNECT_TIMEOUT_S:g})"
                ),
            ),
        ),
        (
            ("--workdir",),
            dict(
                default=None,
                metavar="DIR",
                help="with --hosts: the working directory on every host (default: the current one)",
            ),
        ),
        (
            ("-v", "--verbose"),
            dict(
                action="store_true",
                help="set PS_VERBOSE=1 so that ps-lite logs its connections",
            ),
        ),
        (
            ("command",),
            dict(
                nargs=argparse.REMAINDER,
                metavar="COMMAND",
                help="the worker command and its arguments; a '--' before it is optional",
            ),
        ),
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m shardloader.launch",
        usage="%(prog)s [-h] -n NUM_WORKERS [-s NUM_SERVERS] [options] COMMAND [ARG ...]",
        description=(
            "Run COMMAND as the workers of a local ps-lite cluster for MXNet's dist_sync "
            "kvstore: one scheduler, NUM_SERVERS servers and NUM_WORKERS workers on "
            f"{_HOST}. Each worker's mx.kv.create('dist_sync') joins the cluster; kv.rank "
            "and kv.num_workers give its part of the data. If a worker fails or the timeout "
            "passes, every process is stopped, and the launcher exits with that worker's code "
            "(124 on timeout). With --hosts, the same across several hosts, each process "
            "started through --remote (ssh by default)."
        ),
        epilog=(
            "example: python -m shardloader.launch -n 2 -s 1 --timeout 600 "
            "python train.py --epochs 2"
        ),
    )
    for flags, kwargs in _options():
        parser.add_argument(*flags, **kwargs)
    return parser


def _parse_env(pairs: Sequence[str], parser: argparse.ArgumentParser) -> Dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            parser.error(f"--env expects NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def _log_to_stderr() -> None:
    """The launcher's messages on stderr, whatever the root logger is (MXNet 2.x configures
    it on import, which makes ``logging.basicConfig`` do nothing)."""
    log = logging.getLogger("shardloader.launch")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("shardloader.launch: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted(signum)


def _interrupt_on_stop_signals() -> None:
    """Turn ``SIGTERM``, ``SIGINT`` and (where it exists) ``SIGHUP`` into ``_Interrupted``."""
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, _raise_interrupted)


def _launch(args: argparse.Namespace, command: List[str], env: Dict[str, str]) -> LaunchResult:
    """``launch_local``, or ``launch_hosts`` with ``--hosts``."""
    common: Dict[str, Any] = dict(
        env=env,
        timeout=args.timeout,
        port=args.port,
        grace_period=args.grace_period,
        verbose=args.verbose,
    )
    if args.hosts is None:
        return launch_local(command, args.num_workers, args.num_servers, **common)
    return launch_hosts(
        command,
        args.hosts,
        args.num_workers,
        args.num_servers,
        remote=DEFAULT_REMOTE if args.remote is None else args.remote,
        connect_timeout=(
            _DEFAULT_CONNECT_TIMEOUT_S if args.connect_timeout is None else args.connect_timeout
        ),
        workdir=args.workdir,
        **common,
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the worker COMMAND is missing")
    env = _parse_env(args.env, parser)
    given = [f for f in ("remote", "connect_timeout", "workdir") if getattr(args, f) is not None]
    if args.hosts is None and given:
        flags = ", ".join("--" + f.replace("_", "-") for f in given)
        parser.error(f"{flags} only apply with --hosts")
    _log_to_stderr()
    prog = parser.prog
    _interrupt_on_stop_signals()
    try:
        result = _launch(args, command, env)
    except ValueError as exc:
        parser.error(str(exc))
    except OSError as exc:
        print(f"{prog}: error: cannot start {shlex.join(command)}: {exc}", file=sys.stderr)
        return EXIT_CANNOT_START
    except _Interrupted as exc:
        name = signal.Signals(exc.signum).name
        print(f"{prog}: interrupted by {name}; stopped all processes", file=sys.stderr)
        return 128 + exc.signum
    if result.failure is not None:
        print(f"{prog}: error: {result.failure}", file=sys.stderr)
    return result.returncode
