"""Scenario 10: resume training in a new process from a mid-epoch checkpoint.

This program runs two processes and then trains once itself:

- ``--phase first``: half of the first epoch, then ``loader.state_dict()``, the net's
  parameters and the trainer's states saved to disk, and a normal exit;
- ``--phase second``: a new process that loads all three and finishes the run;
- then an uninterrupted run of the two epochs, in this program's own process.

The second process starts beside the first (importing MXNet takes seconds) but waits, before
it makes its net, trainer or loader, for a line on stdin that this program writes only once
the first has exited.

The batches of ``first`` followed by those of ``second`` must be exactly the batches of
the uninterrupted run, and the final weights the same.

    python tests/scenarios/resume.py [--workers process|thread|inline] [--dir DIR]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from _common import IndexedVectors, Scenario, check  # noqa: E402

N, BATCH, EPOCHS = 100, 8, 2  # 13 batches per epoch, the last of 4
STOP_AFTER = 6  # batches of epoch 0 trained in the first process
CHILD_TIMEOUT_S = 40


def build(args):
    import mxnet as mx
    from mxnet import gluon

    from shardloader import DataLoader

    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=6), gluon.nn.Dense(1, in_units=8))
    net.initialize(mx.init.Zero())
    _common.set_params_from_seed(net, 5)
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    loader = DataLoader(
        IndexedVectors(N),
        batch_size=BATCH,
        shuffle=True,
        seed=7,
        **_common.worker_kwargs(args.workers, args.start_method),
    )
    return net, trainer, loader


def train(net, trainer, loader, epochs, record, stop_after=None):
    from mxnet import autograd, gluon

    loss_fn = gluon.loss.L2Loss()
    for _ in range(epochs):
        for x, y, idx in loader:
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(x.shape[0])
            record.append((idx.asnumpy().astype(int), x.asnumpy()))
            if stop_after is not None and len(record) == stop_after:
                return


def save_record(path, record):
    np.savez(
        path,
        **{f"i{k:03d}": idx for k, (idx, _) in enumerate(record)},
        **{f"x{k:03d}": x for k, (_, x) in enumerate(record)},
    )


def load_record(path):
    with np.load(path) as f:
        n = len([k for k in f.files if k.startswith("i")])
        return [(f[f"i{k:03d}"], f[f"x{k:03d}"]) for k in range(n)]


def child(args):
    d = args.dir
    with Scenario(f"resume:{args.phase}[{args.workers}]", args.start_method) as sc:
        if args.phase == "second":
            sc.phase("second: waiting for the first process to exit")
            go = sys.stdin.readline().strip()
            check(go == "go", f"the first process did not end well ({go!r})")
        net, trainer, loader = build(args)
        record = []
        if args.phase == "first":
            train(net, trainer, loader, 1, record, stop_after=STOP_AFTER)
            state = loader.state_dict()
            sc.phase(f"checkpoint after {len(record)} batches: {state}")
            with open(os.path.join(d, "loader.json"), "w") as f:
                json.dump(state, f)
            net.save_parameters(os.path.join(d, "ckpt.params"))
            trainer.save_states(os.path.join(d, "ckpt.states"))
        else:
            net.load_parameters(os.path.join(d, "ckpt.params"))
            trainer.load_states(os.path.join(d, "ckpt.states"))
            with open(os.path.join(d, "loader.json")) as f:
                state = json.load(f)
            loader.load_state_dict(state)
            # The first iteration finishes the interrupted epoch, then the rest follow.
            train(net, trainer, loader, EPOCHS - state["epoch"], record)
        loader.close()
        save_record(os.path.join(d, f"{args.phase}.npz"), record)
        net.save_parameters(os.path.join(d, f"{args.phase}.params"))
        sc.phase(f"{args.phase}: {len(record)} batches")


def start_child(args, phase):
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--phase",
        phase,
        "--dir",
        args.dir,
        "--workers",
        args.workers,
        "--start-method",
        args.start_method,
    ]
    # Both children get the whole deadline: the second waits for the first.
    env = dict(os.environ, SCENARIO_WATCHDOG_S=str(2 * CHILD_TIMEOUT_S - 5))
    return subprocess.Popen(
        cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def finish_child(proc, phase, sc, stdin=""):
    try:
        out, _ = proc.communicate(stdin, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise _common.ScenarioFailure(f"phase {phase} hung; its output:\n{out}") from None
    for line in out.splitlines():
        print(f"    {phase}| {line}")
    check(proc.returncode == 0, f"phase {phase} exited with {proc.returncode}")
    sc.phase(f"phase {phase} done")


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--phase", choices=["first", "second"])
    p.add_argument("--dir")
    args = p.parse_args()
    if args.phase:
        child(args)
        return
    with Scenario(
        f"resume[{args.workers}]", args.start_method
    ) as sc, tempfile.TemporaryDirectory() as tmp:
        args.dir = args.dir or tmp
        first, second = start_child(args, "first"), start_child(args, "second")
        try:
            finish_child(first, "first", sc)
        except BaseException:
            second.kill()
            second.communicate()
            raise
        finish_child(second, "second", sc, stdin="go\n")  # the first has exited
        # The uninterrupted run, here.
        net, trainer, loader = build(args)
        full = []
        train(net, trainer, loader, EPOCHS, full)
        loader.close()
        sc.phase(f"uninterrupted run: {len(full)} batches")
        import mxnet as mx

        net.save_parameters(os.path.join(args.dir, "full.params"))
        first = load_record(os.path.join(args.dir, "first.npz"))
        second = load_record(os.path.join(args.dir, "second.npz"))
        check(len(first) == STOP_AFTER, f"the first process trained {len(first)} batches")
        joined = first + second
        check(
            len(joined) == len(full),
            f"{len(first)} + {len(second)} batches across the resume, {len(full)} in one go",
        )
        for k, ((ia, xa), (ib, xb)) in enumerate(zip(joined, full)):
            check(
                np.array_equal(ia, ib),
                f"batch {k}: samples {ia.tolist()} after the resume, {ib.tolist()} in one go",
            )
            check(np.array_equal(xa, xb), f"batch {k}: different values across the resume")
        a = mx.nd.load(os.path.join(args.dir, "second.params"))
        b = mx.nd.load(os.path.join(args.dir, "full.params"))
        _common.compare_params(
            {k: v.asnumpy() for k, v in sorted(a.items())},
            {k: v.asnumpy() for k, v in sorted(b.items())},
            "final weights (resumed vs uninterrupted)",
            tol=1e-6,
        )


if __name__ == "__main__":
    main()
