"""``shardloader demo``: train a small CNN on generated shapes, data parallel over 2 contexts.

The run shows the loader doing what a multi-GPU Gluon job needs: RecordIO decoding and random
augmentation in worker processes, reproducible through ``seed=`` (every sample is seeded from
``(seed, epoch, index)``), steps of 2 shards already placed on ``mx.cpu(0)`` and ``mx.cpu(1)``
(stand-ins for 2 GPUs), the data-stall share from ``loader.stats()``, and checkpoints that
resume in the middle of an epoch. ``--gluon`` repeats the training with Gluon's ``DataLoader``
and ``split_and_load`` for a side-by-side time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon.data.vision import transforms
from tqdm import tqdm

from .. import ShardedDataLoader
from .._compat import DeviceType, to_device
from ..recordio import ImageRecordDataset
from .demo_data import CLASSES, IMAGE_SIZE, prepare
from .demo_state import Checkpoint, UnsafeFolder

__all__ = ["run"]

NUM_SHARDS = 2
_MEAN, _STD = 0.4, 0.25
# Progress bars' size where the terminal reports none (a pipe, or a pty that says 0 x 0).
_FALLBACK_COLUMNS, _FALLBACK_ROWS = 100, 24
# Data stall (share of the training time spent waiting for a batch) judged good below the
# first bound, poor above the second.
_GOOD_STALL, _POOR_STALL = 0.05, 0.20


def build_net(num_classes: int, ctx: List[DeviceType], seed: int) -> gluon.nn.HybridSequential:
    """Two conv blocks and two dense layers, initialised identically on every context.

    Parameters
    ----------
    num_classes : int
        Outputs of the last layer.
    ctx : list of Context
        Contexts that hold a copy of the parameters (one per shard).
    seed : int
        Seeds MXNet's RNG, so the initial weights depend on ``seed`` only.

    Returns
    -------
    mxnet.gluon.nn.HybridSequential
        The hybridized network.
    """
    mx.random.seed(seed)
    nn = gluon.nn
    net = nn.HybridSequential()
    net.add(
        nn.Conv2D(16, 3, padding=1, activation="relu"),
        nn.MaxPool2D(2),
        nn.Conv2D(32, 3, padding=1, activation="relu"),
        nn.MaxPool2D(2),
        nn.Flatten(),
        nn.Dense(64, activation="relu"),
        nn.Dense(num_classes),
    )
    net.initialize(mx.init.Xavier(), ctx)  # positional: MXNet 2.x renamed ctx= to device=
    net.hybridize(static_alloc=True)
    return net


def _make_trainer(net: gluon.Block) -> gluon.Trainer:
    return gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 3e-3})


def make_dataset(path: str, train: bool) -> Any:
    """The demo's dataset over the RecordIO file ``path``, written as a Gluon user writes it,
    with Gluon's own transforms: the one place both loaders get their samples from.

    ShardedDataLoader recognises the chain and runs it on its fused image path (decode,
    crop, flip and brightness in the workers, then ToTensor and Normalize into the batch;
    docs/vision.md), where the ``vision`` extra is installed; Gluon's loader runs the
    transforms one by one. Their random draws come from ``random`` and ``numpy.random``
    (and MXNet's), which the loader seeds per sample when given ``seed=``.
    """
    steps = [transforms.ToTensor(), transforms.Normalize(_MEAN, _STD)]
    if train:
        steps = [
            transforms.RandomResizedCrop(IMAGE_SIZE, scale=(0.7, 1.0)),
            transforms.RandomFlipLeftRight(),
            transforms.RandomBrightness(0.25),
            *steps,
        ]
    return ImageRecordDataset(path).transform_first(transforms.Compose(steps))


def _shard_loader(
    path: str, train: bool, args: argparse.Namespace, ctx: List[DeviceType]
) -> ShardedDataLoader:
    # The held-out set ends with a step of 1 shard, which the loader's own ctx placement
    # refuses ("the step has 1 shards but 2 contexts"), so evaluate() places its shards.
    return ShardedDataLoader(
        make_dataset(path, train),
        batch_size=args.batch_size,
        shuffle=train,
        # Every training step has both shards; the held-out set keeps its last images.
        last_batch="discard" if train else "keep",
        num_workers=args.num_workers,
        seed=args.seed,
        num_shards=NUM_SHARDS,
        ctx=ctx if train else None,
    )


def _gluon_steps(loader: Iterable, ctx: List[DeviceType]) -> Iterable[List[Any]]:
    """Gluon's way to the same steps: one big batch, split across the contexts."""
    for data, label in loader:
        xs = gluon.utils.split_and_load(data, ctx, even_split=False)
        ys = gluon.utils.split_and_load(label, ctx, even_split=False)
        yield list(zip(xs, ys))


class _StallClock:
    """The data stall of a loader without ``stats()``: the time spent in ``next()`` over the
    time since the epoch began."""

    def __init__(self) -> None:
        self.waited = 0.0
        self.begin = time.perf_counter()

    def wrap(self, steps: Iterable) -> Iterator:
        self.waited, self.begin = 0.0, time.perf_counter()
        it = iter(steps)
        while True:
            asked = time.perf_counter()
            try:
                step = next(it)
            except StopIteration:
                return
            self.waited += time.perf_counter() - asked
            yield step

    def stall(self) -> float:
        return self.waited / max(time.perf_counter() - self.begin, 1e-9)


def progress_bar(total: int, desc: str, unit: str = "batch") -> tqdm:
    """A ``tqdm`` bar that follows the terminal's size, or keeps a fixed one (``COLUMNS``,
    else 100 wide) where there is no terminal or it reports no size: tqdm would then draw
    nothing (it hides bars below the terminal's last row, which is -1 there)."""
    try:
        columns, lines = os.get_terminal_size(sys.stderr.fileno())
    except (AttributeError, ValueError, OSError):  # no stderr, or not a terminal
        columns = lines = 0
    if columns > 0 and lines > 0:
        size: Dict[str, Any] = {"dynamic_ncols": True}
    else:
        given = os.environ.get("COLUMNS", "")
        width = int(given) if given.isdigit() and int(given) > 0 else _FALLBACK_COLUMNS
        size = {"ncols": width, "nrows": _FALLBACK_ROWS}
    return tqdm(total=total, desc=desc, unit=unit, leave=True, **size)


class _Epoch:
    """One pass of training over ``steps``, with a progress bar that counts batches (the unit
    of ``--stop-after-batches``: one batch of ``NUM_SHARDS`` shards a training step), and
    shows images/s, loss and the data stall; counts the samples it trained on."""

    def __init__(self, net, trainer, stall: Callable[[], float], desc: str, total: int) -> None:
        self.net, self.trainer, self.stall = net, trainer, stall
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        self.bar = progress_bar(total, desc)
        self.samples = 0

    def run(self, steps: Iterable[List[Any]], limit: Optional[int] = None, done: int = 0) -> int:
        """Train on ``steps``; stop after ``limit`` of them. Returns the steps taken."""
        try:
            return self._run(steps, limit, done)
        finally:
            self.bar.close()

    def _run(self, steps: Iterable[List[Any]], limit: Optional[int], done: int) -> int:
        self.bar.update(done)
        taken = 0
        begin = time.perf_counter()
        for step in steps:
            with autograd.record():
                losses = [self.loss_fn(self.net(x), y) for x, y in step]
            autograd.backward(losses)
            count = sum(x.shape[0] for x, _ in step)
            self.trainer.step(count)
            # Reading the loss waits for the step, as a real loop that logs it does, so the
            # data-stall figure measures the loader and not MXNet's asynchronous queue.
            loss = sum(part.sum().asnumpy().item() for part in losses) / count
            self.samples += count
            rate = self.samples / max(time.perf_counter() - begin, 1e-9)
            self.bar.set_postfix_str(
                f"{rate:.0f} img/s, loss {loss:.3f}, data stall {self.stall():.0%}",
                refresh=False,
            )
            self.bar.update(1)
            taken += 1
            if limit is not None and taken >= limit:
                break
        return taken


def evaluate(net: gluon.Block, loader: Iterable, ctx: List[DeviceType]) -> Dict[str, int]:
    """Correct predictions and total over ``loader``'s steps, shard ``i`` on ``ctx[i]``."""
    correct = total = 0
    for step in loader:
        for (x, y), device in zip(step, ctx):
            x, y = to_device(x, device), to_device(y, device)
            predicted = net(x).argmax(axis=1)
            correct += int((predicted == y).sum().asnumpy().item())
            total += int(y.shape[0])
    return {"correct": correct, "total": total}


def _format_stats(stats: Dict[str, Any]) -> List[str]:
    busy = ", ".join(f"worker {w} {s:.2f} s" for w, s in sorted(stats["worker_busy_s"].items()))
    first = stats["first_batch_s"]
    return [
        f"  batches:         {stats['batches']} ({NUM_SHARDS} shards each, one per training "
        f"step), {stats['bytes'] / 1e6:.1f} MB",
        f"  waited for data: {stats['wait_s']:.2f} s of {stats['wall_s']:.2f} s "
        f"(data stall {stats['data_stall']:.1%})",
        f"  first batch:     {'-' if first is None else f'{first * 1e3:.0f} ms'} wait",
        f"  worker busy:     {busy or 'none (num_workers=0)'}",
        f"  kept in order:   at most {stats['max_reorder_depth']} finished batches waited "
        f"for an earlier, slower one",
        f"  images:          {_image_path(stats.get('image_path', 'exact'))}",
    ]


def _image_path(path: str) -> str:
    """``stats()['image_path']`` in words."""
    if path == "fused":
        return (
            "fused: JPEG decode, crop, flip and brightness in the workers, ToTensor and "
            "Normalize as each image is written into the batch (docs/vision.md)"
        )
    return f"{path} (Gluon's transforms one by one; docs/vision.md says when images fuse)"


def stall_advice(stall: float, num_workers: int, cores: Optional[int] = None) -> str:
    """Whether a data stall (the share of training time spent waiting for the next batch) is
    good or bad for this run, and what to change.

    Examples
    --------
    >>> stall_advice(0.01, 2).split(":")[0]
    'good'
    >>> "--num-workers 4" in stall_advice(0.5, 2, cores=8)
    True
    """
    cores = cores or os.cpu_count() or 1
    share = f"the training waited for data {stall:.0%} of the time"
    if stall < _GOOD_STALL:
        return f"good: {share}; the model, not the data loading, sets the pace"
    verdict = "fair" if stall < _POOR_STALL else "poor"
    if num_workers == 0:
        change = "run --num-workers 2, so that decoding and augmenting run beside the training"
    elif num_workers + 1 < cores:  # one core stays with the training loop
        more = min(num_workers * 2, cores - 1)
        change = f"try --num-workers {more}: more images are decoded and augmented at once"
    else:
        change = (
            f"the {num_workers} workers and the training loop already use the {cores} cores: "
            f"a cheaper transform or a machine with more cores would help, more workers not"
        )
    return f"{verdict}: {share}; {change}"


def _data_stall(loader: ShardedDataLoader) -> float:
    return loader.stats()["data_stall"]


def _resume(args, ckpt: Checkpoint, net, trainer, loader, ctx) -> int:
    """Restore the last checkpoint, if any; return the steps already done in its epoch."""
    state = ckpt.load(net, trainer, loader, ctx)
    if state is None:
        print(f"--resume: no checkpoint in {ckpt.directory}, starting from scratch")
        return 0
    epoch, done = state["loader"]["epoch"], state["loader"]["consumed"]
    if epoch >= args.epochs:
        print(f"--resume: all {args.epochs} epochs are done; evaluating")
    else:
        where = f"after batch {done} of {len(loader)}" if done else "from its first batch"
        print(
            f"--resume: continuing from {ckpt.directory} at epoch {epoch + 1}, step {done} "
            f"({where})"
        )
    return done


def _train_shardloader(args, data, ctx, ckpt: Checkpoint) -> Dict[str, Any]:
    net = build_net(len(CLASSES), ctx, args.seed)
    trainer = _make_trainer(net)
    loader = _shard_loader(data["train"], True, args, ctx)
    done = _resume(args, ckpt, net, trainer, loader, ctx) if args.resume else 0
    limit, train_s, samples = args.stop_after_batches, 0.0, 0
    with loader:
        # After load_state_dict() the loader knows which epoch comes next.
        for epoch in range(loader.state_dict()["epoch"], args.epochs):
            loader.reset_stats()
            desc = f"epoch {epoch + 1}/{args.epochs}"
            run = _Epoch(net, trainer, partial(_data_stall, loader), desc, len(loader))
            start = time.perf_counter()
            taken = run.run(loader, limit, done)
            train_s += time.perf_counter() - start
            samples, done = samples + run.samples, 0
            ckpt.save(net, trainer, loader)
            if limit is not None:
                limit -= taken
                position = loader.state_dict()
                if limit <= 0 and position["epoch"] == epoch:  # stopped inside the epoch
                    return {"stopped": (position["epoch"], position["consumed"])}
        stats = loader.stats()
    with _shard_loader(data["test"], False, args, ctx) as test:
        result = evaluate(net, test, ctx)
    return {"train_s": train_s, "samples": samples, "stats": stats, **result}


def _train_gluon(args, data, ctx) -> Dict[str, Any]:
    net = build_net(len(CLASSES), ctx, args.seed)
    trainer = _make_trainer(net)
    dataset = make_dataset(data["train"], True)
    loader = gluon.data.DataLoader(
        dataset,
        batch_size=NUM_SHARDS * args.batch_size,
        shuffle=True,
        last_batch="discard",
        num_workers=args.num_workers,
    )
    clock = _StallClock()
    train_s, samples = 0.0, 0
    for epoch in range(args.epochs):
        desc = f"epoch {epoch + 1}/{args.epochs} (gluon)"
        run = _Epoch(net, trainer, clock.stall, desc, len(loader))
        start = time.perf_counter()
        run.run(clock.wrap(_gluon_steps(loader, ctx)))
        train_s += time.perf_counter() - start
        samples += run.samples
    stall = clock.stall()
    del loader  # Gluon's pool ends in __del__
    with _shard_loader(data["test"], False, args, ctx) as test:
        result = evaluate(net, test, ctx)
    return {"train_s": train_s, "samples": samples, "stall": stall, **result}


def run(args: argparse.Namespace) -> int:
    """Run the demo with parsed command-line ``args`` (see ``shardloader demo --help``).

    Returns
    -------
    int
        The process exit code: 0, or 2 when the cache folder is not safe to use.
    """
    try:
        return _run(args)
    except UnsafeFolder as exc:
        print(f"shardloader demo: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    wall = time.perf_counter()
    ctx = [mx.cpu(i) for i in range(NUM_SHARDS)]
    print(
        f"shardloader demo: {len(CLASSES)} kinds of shapes ({', '.join(CLASSES)}), "
        f"{args.train_size} training and {args.test_size} held-out {IMAGE_SIZE}x{IMAGE_SIZE} "
        f"images"
    )
    start = time.perf_counter()
    data = prepare(args.cache_dir, args.train_size, args.test_size)
    verb = "generated and packed" if data.rebuilt else "reusing"
    print(
        f"dataset: {verb} {data['train']} and {data['test']} ({time.perf_counter() - start:.1f} s)"
    )
    print(
        f"training: ShardedDataLoader(num_workers={args.num_workers}, num_shards={NUM_SHARDS}, "
        f"ctx={ctx}, seed={args.seed}),\n"
        f"          batches of {NUM_SHARDS} shards of {args.batch_size} images, decoded from "
        f"RecordIO and augmented {'in the workers' if args.num_workers else 'in the training loop'}"
    )
    ckpt = Checkpoint(os.path.join(args.cache_dir, "checkpoint"), _config(args))
    print(
        "A checkpoint is saved at the end of each epoch; after Ctrl-C, run the same command "
        "with --resume to continue from it."
    )
    try:
        result = _train_shardloader(args, data, ctx, ckpt)
    except KeyboardInterrupt:
        print(_after_interrupt(ckpt), file=sys.stderr, flush=True)
        raise
    if "stopped" in result:
        epoch, consumed = result["stopped"]
        print(
            f"Stopped after {_batches(consumed)} of epoch {epoch + 1} (--stop-after-batches, a "
            f"simulated crash). Checkpoint saved in {ckpt.directory}.\n"
            f"Run the same command with --resume instead of --stop-after-batches to continue "
            f"from batch {consumed + 1}."
        )
        return 0
    _report(result, args.num_workers)
    if args.gluon:
        print("\nThe same training with mxnet.gluon.data.DataLoader + split_and_load:")
        _compare(result, _train_gluon(args, data, ctx))
    else:
        print(
            "\nTo time the same training with mxnet.gluon.data.DataLoader + split_and_load, "
            "side by side, run again with --gluon."
        )
    print(f"\ntotal time {time.perf_counter() - wall:.1f} s")
    return 0


def _after_interrupt(ckpt: Checkpoint) -> str:
    """What a Ctrl-C leaves, and how to go on from it."""
    position = ckpt.saved_position()
    if position is None:
        return (
            "\nInterrupted before the first checkpoint (saved at the end of each epoch): "
            "--resume would start over."
        )
    epoch, done = position["epoch"] + 1, position["consumed"]
    where = f"in epoch {epoch}, after batch {done}" if done else f"at the start of epoch {epoch}"
    return (
        f"\nInterrupted. The last checkpoint, in {ckpt.directory}, is {where}: run the same "
        f"command with --resume to continue from there."
    )


def _batches(count: int) -> str:
    return f"{count} batch" if count == 1 else f"{count} batches"


def _config(args: argparse.Namespace) -> Dict[str, Any]:
    """What a checkpoint must agree on to be resumed (num_workers may change freely)."""
    return {
        "seed": args.seed,
        "batch_size": args.batch_size,
        "train_size": args.train_size,
        "test_size": args.test_size,
        "classes": list(CLASSES),
    }


def _accuracy_line(result: Dict[str, Any]) -> str:
    acc = result["correct"] / max(result["total"], 1)
    return (
        f"held-out accuracy: {acc:.1%} ({result['correct']}/{result['total']}; "
        f"chance is {1 / len(CLASSES):.1%})"
    )


def _report(result: Dict[str, Any], num_workers: int) -> None:
    print(_accuracy_line(result))
    if result["samples"]:
        print(
            f"trained {result['samples']} samples in {result['train_s']:.1f} s "
            f"({result['samples'] / result['train_s']:.0f} samples/s)"
        )
        print("loader stats, last epoch (loader.stats()):")
        print("\n".join(_format_stats(result["stats"])))
        print(f"data stall: {stall_advice(result['stats']['data_stall'], num_workers)}")


def _compare(ours: Dict[str, Any], theirs: Dict[str, Any]) -> None:
    print(_accuracy_line(theirs))
    rows = [
        ("ShardedDataLoader", ours, ours["stats"]["data_stall"]),
        ("gluon DataLoader", theirs, theirs["stall"]),
    ]
    print(f"{'':<20}{'train time':>12}{'samples/s':>12}{'last-epoch stall':>18}{'accuracy':>10}")
    for name, r, stall in rows:
        print(
            f"{name:<20}{r['train_s']:>10.1f} s{r['samples'] / r['train_s']:>12.0f}"
            f"{stall:>18.1%}{r['correct'] / max(r['total'], 1):>10.1%}"
        )
    print(f"shardloader's speed-up over Gluon: {theirs['train_s'] / ours['train_s']:.2f}x")
