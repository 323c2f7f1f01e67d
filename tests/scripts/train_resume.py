"""Train a small Gluon model from a shardloader, for test_resume's crash-and-resume test.

    python train_resume.py full   DIR   # EPOCHS epochs in one go -> DIR/full.params
    python train_resume.py crash  DIR   # epoch 0 and half of epoch 1, a checkpoint in DIR,
                                        # then the process dies (exit code 3, no clean-up)
    python train_resume.py resume DIR   # load the checkpoint, finish -> DIR/resumed.params

Everything is seeded and runs on the CPU, so the two ways must end with identical weights.
"""

from __future__ import annotations

import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from _datasets import NoisyClassification  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

from shardloader import ShardedDataLoader  # noqa: E402

EPOCHS = 3
CRASH_EPOCH, CRASH_AFTER = 1, 6  # of 13 batches per epoch
CRASH_EXIT_CODE = 3


def build():
    mx.random.seed(1234)
    np.random.seed(1234)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=6), gluon.nn.Dense(2, in_units=8))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    loader = ShardedDataLoader(
        NoisyClassification(100), batch_size=8, shuffle=True, seed=7, num_workers=2
    )
    return net, trainer, loader


def train(net, trainer, loader, epochs, stop=None):
    """Run ``epochs`` iterations of ``loader``; call ``stop(epoch, step)`` after each step and
    return early if it says so."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader, start=1):
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(x.shape[0])
            if stop is not None and stop(epoch, step):
                return


def main(mode: str, directory: str) -> None:
    net, trainer, loader = build()
    path = os.path.join(directory, "{}").format
    if mode == "full":
        train(net, trainer, loader, EPOCHS)
        net.save_parameters(path("full.params"))
    elif mode == "crash":

        def checkpoint_and_die(epoch, step):
            if (epoch, step) != (CRASH_EPOCH, CRASH_AFTER):
                return False
            net.save_parameters(path("ckpt.params"))
            trainer.save_states(path("ckpt.states"))
            with open(path("ckpt.loader.json"), "w") as f:
                json.dump(loader.state_dict(), f)
            os._exit(CRASH_EXIT_CODE)  # a crash: no close(), no atexit, workers orphaned

        train(net, trainer, loader, EPOCHS, stop=checkpoint_and_die)
        raise SystemExit("never reached the crash point")
    elif mode == "resume":
        net.load_parameters(path("ckpt.params"), ctx=mx.cpu())
        trainer.load_states(path("ckpt.states"))
        with open(path("ckpt.loader.json")) as f:
            state = json.load(f)
        loader.load_state_dict(state)
        # The first iteration finishes the interrupted epoch; then the rest.
        train(net, trainer, loader, EPOCHS - state["epoch"])
        net.save_parameters(path("resumed.params"))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    loader.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
