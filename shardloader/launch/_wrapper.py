"""The remote side of ``launch_hosts``: runs one node's command on its host and stops it.

The launcher runs this file's source as ``python -c SOURCE SPEC`` through the ``--remote``
template (it imports nothing from shardloader or MXNet, so it starts in milliseconds and
needs only the same Python on the host). ``SPEC`` is a JSON object: ``cwd``, ``env`` (set),
``unset`` (removed), ``argv``, ``grace`` (seconds between ``SIGTERM`` and ``SIGKILL``).

1. It changes to ``cwd`` and forks the command into a new session, so that the command's
   process group holds it and everything it forks; the command's stdin is ``/dev/null``.
2. Before the command runs, it writes ``MARKER + pid`` as the first line of its stdout, which
   the launcher reads (the command inherits the same stdout after it).
3. It stops the group (``SIGTERM``, ``grace``, ``SIGKILL``) when its own stdin reaches EOF
   (the launcher closed the pipe, died, or the ssh connection ended) or when it gets
   ``SIGTERM``, ``SIGINT`` or ``SIGHUP``. When the command exits on its own, members it left
   in its group are stopped the same way.
4. It exits as the command did: with its code, or killed by the same signal.
"""

# The launcher sends the source from here on (without the docstring above).
import json
import os
import signal
import sys
import threading
import time

MARKER = "@@shardloader.launch pid="
_POLL_S = 0.05


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_group(pgid, grace, reap):
    """SIGTERM the group, wait ``grace``, SIGKILL what is left, wait until it is empty."""
    for signum, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            reap()
            if not _group_alive(pgid):
                return
            time.sleep(_POLL_S)


def _child(spec, env, ready_fd):
    """In the forked child: a new session, die with the wrapper, wait for the marker, exec."""
    try:
        os.setsid()
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG (Linux)
        except (OSError, AttributeError):
            pass
        os.read(ready_fd, 1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.execvpe(spec["argv"][0], spec["argv"], env)
    except OSError as exc:
        os.write(2, f"shardloader.launch: cannot start {spec['argv'][0]}: {exc}\n".encode())
    os._exit(127)


def main():
    spec = json.loads(sys.argv[1])
    env = dict(os.environ)
    for name in spec["unset"]:
        env.pop(name, None)
    env.update(spec["env"])
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        sys.exit(f"shardloader.launch: cannot enter the working directory {spec['cwd']}: {exc}")

    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)

    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_w)
        _child(spec, env, ready_r)
    os.close(ready_r)
    sys.stdout.write(f"{MARKER}{pid}\n")
    sys.stdout.flush()
    os.close(ready_w)

    def watch_stdin():
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()

    status = []

    def reap():
        if not status:
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status.append(code)

    while not status and not stop.is_set():
        reap()
        time.sleep(_POLL_S)
    _stop_group(pid, float(spec["grace"]), reap)
    while not status:
        status.append(os.waitpid(pid, 0)[1])
    if os.WIFSIGNALED(status[0]):
        signum = os.WTERMSIG(status[0])
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        sys.exit(128 + signum)
    sys.exit(os.WEXITSTATUS(status[0]))


if __name__ == "__main__":
    main()
