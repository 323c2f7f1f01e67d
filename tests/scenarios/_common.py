"""What every scenario program shares: arguments, a hang watchdog, small datasets and nets,
comparisons, and the leak check each program runs on itself before it exits.

A scenario is a whole training program, run in its own process by tests/test_scenarios.py
(or by hand: ``python tests/scenarios/train_validate.py --workers process``). It checks its
own results and exits non-zero with a line that starts ``SCENARIO FAILED:`` when something is
wrong; on success its last line starts ``SCENARIO OK``.

The datasets live here, at the top level of an importable module, so that worker processes
started with ``spawn`` or ``forkserver`` can unpickle them.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


# The programs run under MXNet 1.9.1 and 2.0.0b1. What 2.x spells differently goes through the
# helpers below (scalar, array, device_of, to_device), not through version tests in programs.
def mxnet_2() -> bool:
    import mxnet as mx

    return int(mx.__version__.split(".")[0]) >= 2


def scalar(x) -> float:
    """The value of a one-element MXNet array (``asscalar()`` is 1.x only)."""
    return x.asnumpy().item()


def array(values, **kwargs):
    """An MXNet array of the default type (``mx.np`` under 2.x, ``mx.nd`` under 1.x): what
    Gluon blocks take."""
    import mxnet as mx

    return (mx.np if mxnet_2() else mx.nd).array(values, **kwargs)


def device_of(a):
    """Where an MXNet array lives (``.device`` in 2.x, ``.context`` in 1.x)."""
    return a.device if mxnet_2() else a.context


def to_device(a, device):
    """``a`` on ``device`` (``to_device`` in 2.x, ``as_in_context`` in 1.x)."""
    return a.to_device(device) if hasattr(a, "to_device") else a.as_in_context(device)


# Python's own multiprocessing helpers (started once per interpreter by spawn/forkserver and
# kept until it exits) are not ours to clean up.
_PYTHON_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


class ScenarioFailure(AssertionError):
    """A scenario's own check failed."""


def check(condition: Any, message: str) -> None:
    if not condition:
        raise ScenarioFailure(message)


# --------------------------------------------------------------------------- arguments
def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--workers",
        choices=["inline", "thread", "process"],
        default="process",
        help="inline: num_workers=0; thread: 2 threads; process: 2 worker processes",
    )
    p.add_argument(
        "--start-method",
        choices=["fork", "forkserver", "spawn"],
        default="fork",
        help="how shardloader's worker processes start (with --workers process)",
    )
    return p


def worker_kwargs(workers: str, start_method: str = "fork", n: int = 2) -> Dict[str, Any]:
    """shardloader keyword arguments for one worker mode."""
    if workers == "inline":
        return {"num_workers": 0}
    if workers == "thread":
        return {"num_workers": n, "thread_pool": True}
    return {"num_workers": n, "start_method": start_method}


def gluon_worker_kwargs(workers: str, n: int = 2) -> Dict[str, Any]:
    """The same worker mode for Gluon's DataLoader (which has no start method). Under 2.x,
    Gluon's Python pipeline: with workers, Gluon 2.x would otherwise switch some datasets
    to its C++ pipeline (tuples, float32 values)."""
    python = {"try_nopython": False} if mxnet_2() else {}
    if workers == "inline":
        return {"num_workers": 0}
    if workers == "thread":
        return {"num_workers": n, "thread_pool": True, **python}
    return {"num_workers": n, **python}


# --------------------------------------------------------------------------- the process
def warm_up_mxnet() -> None:
    """Open MXNet's lazily created engine threads and allocators now, so that they are part
    of the descriptor baseline instead of looking like a leak at the end."""
    import mxnet as mx

    a = mx.nd.ones((4, 4)) * 2
    a.copyto(mx.cpu(1)).wait_to_read()
    a.copyto(mx.cpu_pinned(0)).wait_to_read()
    mx.nd.from_numpy(a.asnumpy()).wait_to_read()
    mx.nd.waitall()


def open_fds() -> List[str]:
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            out.append(f"{name} -> {os.readlink(f'/proc/self/fd/{name}')}")
        except OSError:
            pass  # the directory's own descriptor, closed by now
    return sorted(out)


def our_children() -> list:
    """Live descendants of this process, leaving out Python's multiprocessing helpers."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if any(helper in cmdline for helper in _PYTHON_HELPERS):
            continue
        out.append(p)
    return out


class Scenario:
    """Runs one scenario program: watchdog, baseline, timing, leak check, exit status.

    ``with Scenario("name") as sc: ...`` -- the body does the work and calls ``check``;
    ``sc.phase("...")`` prints where it is, so a hang's output says where it hung.
    """

    def __init__(self, name: str, start_method: str = "fork", fd_slack: int = 0) -> None:
        self.name = name
        self.fd_slack = fd_slack
        # A program that must end with work in flight sets this; the driver still checks
        # that none of its processes outlives it.
        self.skip_leak_check = False
        self.t0 = time.monotonic()
        watchdog = float(os.environ.get("SCENARIO_WATCHDOG_S", "0") or 0)
        if watchdog > 0:
            # A hang prints every thread's stack and exits, instead of stalling forever.
            faulthandler.dump_traceback_later(watchdog, exit=True)
        warm_up_mxnet()
        if start_method in ("spawn", "forkserver"):
            # Python starts these helpers once and keeps them (and a pipe to each) until
            # the interpreter exits: part of the baseline, not a leak.
            from multiprocessing import forkserver, resource_tracker

            resource_tracker.ensure_running()
            if start_method == "forkserver":
                forkserver.ensure_running()
        gc.collect()
        self.fds_before = open_fds()
        self.children_before = {p.pid for p in our_children()}

    def phase(self, text: str) -> None:
        if os.environ.get("SCENARIO_DEBUG_FDS"):
            gc.collect()
            text += f" (fds {len(open_fds())}, children {len(our_children())})"
        print(f"[{time.monotonic() - self.t0:6.2f}s] {text}", flush=True)

    def __enter__(self) -> Scenario:
        self.phase(f"scenario {self.name}: start (pid {os.getpid()})")
        return self

    def leak_problems(self) -> List[str]:
        gc.collect()
        problems = []
        extra = [p for p in our_children() if p.pid not in self.children_before]
        if extra:
            described = []
            for p in extra:
                try:
                    described.append(f"{p.pid} {' '.join(p.cmdline())[:120]!r}")
                except Exception:
                    described.append(str(p.pid))
            problems.append(f"child processes left: {described}")
        fds = open_fds()
        if len(fds) > len(self.fds_before) + self.fd_slack:
            new = sorted(set(fds) - set(self.fds_before))
            problems.append(
                f"open descriptors grew from {len(self.fds_before)} to {len(fds)}: {new[:10]}"
            )
        return problems

    def settle(self, timeout: float = 10.0) -> List[str]:
        deadline = time.monotonic() + timeout
        problems = self.leak_problems()
        while problems and time.monotonic() < deadline:
            time.sleep(0.1)
            problems = self.leak_problems()
        return problems

    def __exit__(self, exc_type, exc, tb) -> bool:
        wall = time.monotonic() - self.t0
        if exc is not None:
            if isinstance(exc, ScenarioFailure):
                traceback.print_exception(exc_type, exc, tb)
                print(f"SCENARIO FAILED: {self.name}: {exc}", flush=True)
            else:
                traceback.print_exception(exc_type, exc, tb)
                print(
                    f"SCENARIO FAILED: {self.name}: {exc_type.__name__}: {exc}",
                    flush=True,
                )
            faulthandler.cancel_dump_traceback_later()
            sys.stdout.flush()
            sys.stderr.flush()
            # Skip interpreter clean-up: a broken loader must not turn a failure into a hang.
            os._exit(1)
        if self.skip_leak_check:
            faulthandler.cancel_dump_traceback_later()
            print(f"SCENARIO OK {self.name} in {wall:.2f} s (exiting now)", flush=True)
            return False
        self.phase("work done; checking for leaks")
        problems = self.settle()
        faulthandler.cancel_dump_traceback_later()
        if problems:
            print(f"SCENARIO FAILED: {self.name}: leaked: {'; '.join(problems)}", flush=True)
            sys.stdout.flush()
            os._exit(1)
        print(f"SCENARIO OK {self.name} in {wall:.2f} s", flush=True)
        return False


# --------------------------------------------------------------------------- data
class Blobs:
    """Image-like samples for a small classifier: sample i is a (1, 8, 8) float32 image
    whose pattern depends on its class, plus noise, and the class as a float32 label.
    Everything is drawn up front, so every process sees the same data."""

    def __init__(self, n: int, classes: int = 4, seed: int = 0, shape=(1, 8, 8)) -> None:
        # The class patterns are the same for every seed: a train set and a val set drawn
        # with different seeds hold the same classes.
        protos = np.random.default_rng(1234).normal(size=(classes,) + tuple(shape))
        protos = protos.astype("float32")
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, classes, size=n).astype("float32")
        noise = rng.normal(scale=0.5, size=(n,) + tuple(shape)).astype("float32")
        self.images = protos[self.labels.astype(int)] + noise

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


class IndexedVectors:
    """Sample i is (a float32 vector of ``width`` values drawn for i, float32 target, i).

    The index as the last field lets a program tell exactly which samples it trained on."""

    def __init__(self, n: int, width: int = 6, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.normal(size=(n, width)).astype("float32")
        w = rng.normal(size=(width,)).astype("float32")
        self.y = (self.x @ w + 0.1 * rng.normal(size=n)).astype("float32")

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i], np.int64(i)


def small_convnet(classes: int = 4, ctx=None, seed: int = 0):
    """A tiny Conv2D classifier with deterministic initial weights (drawn with numpy, so
    nothing depends on MXNet's RNG state)."""
    import mxnet as mx
    from mxnet import gluon

    net = gluon.nn.Sequential()
    net.add(
        gluon.nn.Conv2D(4, kernel_size=3, in_channels=1, activation="relu"),
        gluon.nn.MaxPool2D(pool_size=2),
        gluon.nn.Flatten(),
        gluon.nn.Dense(classes, in_units=4 * 3 * 3),
    )
    _complete_conv_shapes(net)
    net.initialize(mx.init.Zero(), ctx or mx.cpu())  # positional: 2.x calls it device
    set_params_from_seed(net, seed)
    return net


IMAGE_SHAPE = (3, 32, 32)  # CIFAR-sized: enough work per step that MXNet runs behind


def conv_classifier(classes: int = 4, seed: int = 0):
    """A small CNN for ``Blobs(..., shape=IMAGE_SHAPE)`` with deterministic initial weights:
    a few milliseconds of work per batch, so that a loop that does not wait for every
    step leaves MXNet computing on its last batches when it moves on."""
    import mxnet as mx
    from mxnet import gluon

    net = gluon.nn.Sequential()
    net.add(
        gluon.nn.Conv2D(16, 3, padding=1, in_channels=3, activation="relu"),
        gluon.nn.MaxPool2D(2),
        gluon.nn.Conv2D(16, 3, padding=1, in_channels=16, activation="relu"),
        gluon.nn.MaxPool2D(4),
        gluon.nn.Flatten(),
        gluon.nn.Dense(classes, in_units=16 * 4 * 4),
    )
    _complete_conv_shapes(net)
    net.initialize(mx.init.Zero())
    set_params_from_seed(net, seed, scale=0.1)
    return net


def _complete_conv_shapes(net) -> None:
    """MXNet 2.0 leaves a convolution's weight shape ``(out, -1, k, k)`` until the first
    forward pass, even with ``in_channels`` given; fill it in from ``in_channels``, so that
    ``set_params_from_seed`` can draw the weights. (A forward pass first would leave the
    weights in oneDNN's layout, which ``set_data`` refuses in 2.0.0b1.)"""
    from mxnet import gluon

    for block in net:
        weight = getattr(block, "weight", None)
        if isinstance(block, gluon.nn.Conv2D) and weight is not None and -1 in weight.shape:
            shape = list(weight.shape)
            shape[1] = block._in_channels
            weight.shape = tuple(shape)


def set_params_from_seed(net, seed: int, scale: float = 0.3) -> None:
    rng = np.random.default_rng(seed)
    for name in sorted(net.collect_params().keys()):
        param = net.collect_params()[name]
        param.set_data(rng.normal(scale=scale, size=param.shape).astype("float32"))


def params_numpy(net, ctx=None) -> Dict[str, np.ndarray]:
    out = {}
    for name, param in net.collect_params().items():
        data = param.data(ctx) if ctx is not None else param.data()
        out[name] = data.asnumpy()
    return out


def compare_params(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray], what: str, tol=1e-5):
    """Parameters in creation order (names differ between two nets' prefixes)."""
    check(len(a) == len(b), f"{what}: {len(a)} parameters against {len(b)}")
    for (na, va), (nb, vb) in zip(a.items(), b.items()):
        check(va.shape == vb.shape, f"{what}: {na} has shape {va.shape}, {nb} {vb.shape}")
        err = float(np.max(np.abs(va - vb))) if va.size else 0.0
        check(err <= tol, f"{what}: {na} and {nb} differ by up to {err:.3g} (tolerance {tol})")


def leaves(batch) -> List[np.ndarray]:
    """Every array of a batch (nested lists/tuples/dicts), as numpy, in order."""
    if isinstance(batch, dict):
        return [leaf for key in sorted(batch) for leaf in leaves(batch[key])]
    if isinstance(batch, (list, tuple)):
        return [leaf for item in batch for leaf in leaves(item)]
    if hasattr(batch, "asnumpy"):
        return [batch.asnumpy()]
    return [np.asarray(batch)]


def same_batches(ours: Sequence, theirs: Sequence, what: str, exact: bool = True) -> None:
    check(len(ours) == len(theirs), f"{what}: {len(ours)} batches against {len(theirs)}")
    for b, (x, y) in enumerate(zip(ours, theirs)):
        lx, ly = leaves(x), leaves(y)
        check(len(lx) == len(ly), f"{what}: batch {b} has {len(lx)} arrays against {len(ly)}")
        for k, (u, v) in enumerate(zip(lx, ly)):
            check(
                u.shape == v.shape,
                f"{what}: batch {b} array {k}: shape {u.shape} against {v.shape}",
            )
            check(
                u.dtype == v.dtype,
                f"{what}: batch {b} array {k}: dtype {u.dtype} against {v.dtype}",
            )
            ok = np.array_equal(u, v) if exact else np.allclose(u, v, rtol=1e-5, atol=1e-6)
            check(ok, f"{what}: batch {b} array {k} differs: {u.ravel()[:8]} vs {v.ravel()[:8]}")


def close_trajectories(ours: Sequence[float], theirs: Sequence[float], what: str, tol=1e-4):
    check(len(ours) == len(theirs), f"{what}: {len(ours)} losses against {len(theirs)}")
    a, b = np.asarray(ours, dtype="float64"), np.asarray(theirs, dtype="float64")
    err = np.abs(a - b) / np.maximum(1.0, np.abs(b))
    worst = int(np.argmax(err)) if len(err) else 0
    check(
        not len(err) or err[worst] <= tol,
        f"{what}: loss trajectories differ at step {worst}: {a[worst]!r} against {b[worst]!r}",
    )


def timed(fn: Callable, *args, **kwargs):
    t = time.monotonic()
    out = fn(*args, **kwargs)
    return out, time.monotonic() - t
