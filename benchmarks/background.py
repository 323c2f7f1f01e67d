"""Fixed background work to measure loaders beside: what else a busy training machine runs.

``background(name, rec=..., folder=...)`` is a context manager: it starts the background in
its own process and process group (so its workers go with it), waits until that work is in
its steady state, yields, then stops it: ``SIGTERM`` first (it finishes its step, closes its
loader and exits), ``SIGKILL`` for the whole process group after ``stop_timeout_s``. Nothing
is left behind. The yielded dict says what ran and, once the block ends, how fast it went
(``steps``, ``seconds``, ``steps_per_s``) and whether anything had to be killed.

**Sessions.** Linux's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``)
shares the CPU between *sessions* first and between threads within a session second. A
training program's own step runs in the session of its loader's workers, so they compete
thread by thread; another job (started from another login, or by a scheduler) has its own
session, which then takes an equal share of the machine however many threads either runs.
So ``train`` runs in the caller's session, and ``train-job`` and ``loader`` in their own.

The backgrounds (fixed, so that figures measured beside them compare):

``none``
    Nothing.
``train``
    A training step's stand-in, as the training program's own step (the caller's session):
    a small CNN (conv 3->32, 32->64, 64->128, each 3x3 stride 2 with ReLU, global average
    pool, dense 128->10) trained with SGD on random float32 batches of 16x3x224x224, on the
    CPU, with MXNet's default threads (OpenMP over every core; nothing is set), looping until
    stopped. Steady state: 3 steps done.
``train-job``
    The same training step as another job: in its own session.
``loader``
    A second input pipeline of the same kind, as another job's (its own session):
    ``ShardedDataLoader`` over ``rec`` (Gluon's ``ImageRecordDataset``) or ``folder``
    (``ImageFolderDataset``) with W5's transforms (``RandomResizedCrop(224)``, a flip,
    ``ToTensor``, ``Normalize``: the fused path), batch 64, 2 process workers, shuffled,
    looping over epochs until stopped. Steady state: 8 batches done.

Run one by hand with ``python -m benchmarks.background train`` (Ctrl-C stops it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, Optional, Sequence

from .harness import group_alive

__all__ = ["BACKGROUNDS", "background"]

BACKGROUNDS = ("none", "train", "train-job", "loader")
_WORK = {"train": "train", "train-job": "train", "loader": "loader"}  # what each one runs
_OWN_SESSION = ("train-job", "loader")  # another job's; "train" is the caller's own step

TRAIN_BATCH = 16
TRAIN_SHAPE = (3, 224, 224)
LOADER_BATCH = 64
LOADER_WORKERS = 2
_READY_STEPS = {"train": 3, "loader": 8}
_READY = "ready"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def background(
    name: str,
    *,
    rec: Optional[str] = None,
    folder: Optional[str] = None,
    ready_timeout_s: float = 180.0,
    stop_timeout_s: float = 20.0,
) -> Iterator[Dict[str, Any]]:
    """Run the background ``name`` (one of ``BACKGROUNDS``) for the duration of the block.

    ``rec`` (an indexed ``.rec`` of JPEGs) or ``folder`` (JPEGs in class folders) is what
    ``loader`` reads; ``train`` and ``none`` take neither. Raises ``ValueError`` for an
    unknown name or a missing input, ``RuntimeError`` if the background exits or is not in
    its steady state within ``ready_timeout_s``.
    """
    if name not in BACKGROUNDS:
        raise ValueError(f"background name must be one of {BACKGROUNDS}, got {name!r}")
    if name == "loader" and (rec is None) == (folder is None):
        raise ValueError("background('loader') reads one of rec= or folder=; give exactly one")
    info: Dict[str, Any] = {"name": name, "what": describe(name, rec, folder)}
    if name == "none":
        yield info
        return
    command = [sys.executable, "-m", "benchmarks.background", _WORK[name]]
    command += ["--rec", rec] if rec else []
    command += ["--folder", folder] if folder else []
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            command,
            cwd=_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
            # its own process group, so its workers are killed with it; its own session
            # (scheduled as another job) or the caller's (module docstring, "Sessions")
            start_new_session=name in _OWN_SESSION,
            process_group=None if name in _OWN_SESSION else 0,
        )
        try:
            _wait_ready(proc, ready_timeout_s, errors)
            info["pid"] = proc.pid
            yield info
        finally:
            info.update(_stop(proc, stop_timeout_s))


def describe(name: str, rec: Optional[str] = None, folder: Optional[str] = None) -> str:
    """One line saying what the background ``name`` runs (for tables and JSON)."""
    if name in ("train", "train-job"):
        where = "its own session" if name in _OWN_SESSION else "the loader's session"
        return (
            f"a small CNN (3 convs + dense) training with SGD on {TRAIN_BATCH}x"
            f"{'x'.join(map(str, TRAIN_SHAPE))} float32 batches, CPU, MXNet's default threads, "
            f"in {where}"
        )
    if name == "loader":
        source = f"ImageRecordDataset({os.path.basename(rec)})" if rec else "ImageFolderDataset"
        return (
            f"ShardedDataLoader over {source} with W5's transforms (fused), batch "
            f"{LOADER_BATCH}, {LOADER_WORKERS} process workers, epochs until stopped"
        )
    return "nothing"


def _wait_ready(proc: subprocess.Popen, timeout_s: float, errors: Any) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"the background was not in its steady state after {timeout_s} s")
        readable, _, _ = select.select([proc.stdout], [], [], left)
        if not readable:
            continue
        line = proc.stdout.readline().decode().strip()
        if line == _READY:
            return
        if not line:  # end of output: it exited
            proc.wait()
            errors.seek(0)
            tail = errors.read().decode(errors="replace").strip().splitlines()[-10:]
            raise RuntimeError(
                f"the background exited (code {proc.returncode}) before its steady state:\n"
                + "\n".join(tail)
            )


def _stop(proc: subprocess.Popen, timeout_s: float) -> Dict[str, Any]:
    """SIGTERM, then the whole group killed if it has not exited within ``timeout_s``; the
    background's own report (its rate) if it gave one."""
    killed = False
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            killed = True
    # Whatever is left in its group (a worker that outlived its loader): killed too.
    if killed or group_alive(proc.pid, 2.0):
        killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    report: Dict[str, Any] = {"killed": killed, "exit_code": proc.returncode}
    assert proc.stdout is not None
    for line in proc.stdout.read().decode().splitlines():
        if line.startswith("{"):
            report.update(json.loads(line))
    proc.stdout.close()
    return report


# ------------------------------------------------------------------------ the background itself


class _Stop:
    """Set by SIGTERM (or the parent's exit): the loop ends after its current step."""

    def __init__(self) -> None:
        self.event = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: self.event.set())
        parent = os.getppid()

        def watch() -> None:  # never outlive the benchmark that started us
            while not self.event.wait(1.0):
                if os.getppid() != parent:
                    self.event.set()

        threading.Thread(target=watch, daemon=True).start()


def _steps(name: str, rec: Optional[str], folder: Optional[str]) -> Iterator[None]:
    """One ``None`` per step of the background, forever."""
    if name == "train":
        yield from _train()
    else:
        yield from _load(rec, folder)


def _train() -> Iterator[None]:
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon

    net = gluon.nn.HybridSequential()
    for channels in (32, 64, 128):
        net.add(gluon.nn.Conv2D(channels, 3, strides=2, padding=1, activation="relu"))
    net.add(gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    from .workloads import mxnet_2

    arrays = mx.np if mxnet_2() else mx.nd  # Gluon 2.x blocks take mxnet.numpy arrays
    data = arrays.array(np.random.default_rng(0).random((TRAIN_BATCH, *TRAIN_SHAPE), np.float32))
    label = arrays.array(np.arange(TRAIN_BATCH) % 10)
    while True:
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(TRAIN_BATCH)
        loss.wait_to_read()
        yield None


def _load(rec: Optional[str], folder: Optional[str]) -> Iterator[None]:
    from mxnet.gluon.data.vision import ImageFolderDataset, ImageRecordDataset

    from shardloader import ShardedDataLoader

    from .images import jpeg_transform

    base = ImageRecordDataset(rec) if rec else ImageFolderDataset(folder)
    dataset = base.transform_first(jpeg_transform())
    with ShardedDataLoader(
        dataset,
        LOADER_BATCH,
        shuffle=True,
        num_workers=LOADER_WORKERS,
        last_batch="discard",
    ) as loader:
        while True:
            for data, _ in loader:
                data.wait_to_read()
                yield None


def _main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.background", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("name", choices=sorted(set(_WORK.values())))
    parser.add_argument("--rec")
    parser.add_argument("--folder")
    args = parser.parse_args(argv)
    stop = _Stop()
    signal.signal(signal.SIGINT, lambda *_: stop.event.set())
    steps, started = 0, None
    loop = _steps(args.name, args.rec, args.folder)
    try:
        for _ in loop:
            steps += 1
            if started is None and steps == _READY_STEPS[args.name]:
                print(_READY, flush=True)
                steps, started = 0, time.perf_counter()
            if stop.event.is_set():
                break
    finally:
        loop.close()  # the loader's workers are closed and reaped here
    seconds = time.perf_counter() - started if started is not None else 0.0
    rate = steps / seconds if seconds > 0 else None
    print(json.dumps({"steps": steps, "seconds": seconds, "steps_per_s": rate}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
