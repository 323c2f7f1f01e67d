"""The ``shardloader`` command line: ``shardloader demo`` and ``shardloader bench``.

Only ``argparse`` is imported here; each subcommand imports its module when it runs, and
the ``shardloader`` package imports its modules on first use, so ``--help`` and usage errors
never load MXNet and answer at once.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict, List, Optional

from .._validate import check_int, check_number

__all__ = ["main", "build_parser"]

DEFAULT_CACHE_DIR = ".shardloader-cache/demo"


# ------------------------------------------------------------------------------ values
def _checked(parse: Callable[[str], Any], check: Callable[..., Any], minimum: Any) -> Any:
    """An argparse ``type``: the text parsed by ``parse``, then range-checked by ``check``
    (one of :mod:`shardloader._validate`), whose error argparse shows after the option."""

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            value = text  # not a number: the check says what it should have been
        try:
            return check("value", value, minimum)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


_positive_int = _checked(int, check_int, 1)
_non_negative_int = _checked(int, check_int, 0)
_non_negative_float = _checked(float, check_number, 0.0)


def _worker_list(text: str) -> List[int]:
    """``'0,1,2,4'``: the distinct counts, sorted."""
    try:
        values = [_non_negative_int(part) for part in text.split(",") if part.strip()]
    except argparse.ArgumentTypeError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated non-negative integers such as 0,1,2,4, got {text!r}"
        )
    return sorted(set(values))


# ------------------------------------------------------------------------------ options
_DEMO = dict(
    help="train a small CNN on generated shapes with ShardedDataLoader",
    description=(
        "Generate a small image dataset of shapes (no download), pack it into RecordIO, "
        "and train a small Gluon CNN data parallel on mx.cpu(0) and mx.cpu(1), stand-ins "
        "for two GPUs. Worker processes decode and augment the images; every sample's "
        "augmentation is seeded, so runs are reproducible for any --num-workers."
    ),
)
_BENCH = dict(
    help="benchmark your dataset against gluon.data.DataLoader",
    description=(
        "Measure ShardedDataLoader and mxnet.gluon.data.DataLoader side by side on your\n"
        "dataset for each worker count: samples/s, data stall, first-batch latency and\n"
        "peak RSS. Every run is a fresh process that reads some warm-up batches before the\n"
        "timed ones; --rounds rounds alternate the two loaders, and the table gives the\n"
        "median and the range of the rounds, and the machine's load meanwhile. Then it\n"
        "recommends num_workers and prefetch, or says the rounds were too noisy to decide."
    ),
    epilog=(
        "examples:\n"
        "  shardloader bench --dataset mypkg.data:make_dataset --batch-size 64\n"
        "  shardloader bench --dataset ./data.py:build --workers 0,2,4 --plot bench.png\n"
        "  shardloader bench --recordio train.rec --batch-size 64 --workers 0,1,2,4\n"
        "  shardloader bench --recordio train.rec --no-transform --epochs 1\n"
        "  shardloader bench --dataset ./data.py:build --step-ms 50 --rounds 5\n"
        "\n"
        "docs/cli.md explains how to read the table.\n"
        "\n"
        "With --recordio, every sample goes through the image pipeline most Gluon users\n"
        "train with: mx.gluon.data.vision.ImageRecordDataset(FILE.rec).transform_first(\n"
        "Compose([RandomResizedCrop(SIZE), RandomFlipLeftRight(), ToTensor(),\n"
        "Normalize(ImageNet mean, std)])), shuffled. The index FILE.idx must sit next to\n"
        "FILE.rec, where Gluon looks for it. mx.io.ImageRecordIter and shardloader's\n"
        "ImageRecordLoader run in the same rounds, with the same augmentation."
    ),
    formatter_class=argparse.RawDescriptionHelpFormatter,
)


def _subcommand(subparsers: Any, name: str, handler: Callable, settings: Dict[str, Any]) -> Any:
    """A subcommand's parser, which runs ``handler(args, parser)``."""
    command = subparsers.add_parser(name, **settings)
    command.set_defaults(handler=handler, subparser=command)
    return command


def _add_demo(subparsers: Any) -> None:
    demo = _subcommand(subparsers, "demo", _run_demo, _DEMO)
    demo.add_argument("--epochs", type=_positive_int, default=3, help="epochs (default 3)")
    demo.add_argument(
        "--num-workers", type=_non_negative_int, default=2, help="worker processes (default 2)"
    )
    demo.add_argument(
        "--batch-size", type=_positive_int, default=64, help="samples per shard (default 64)"
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of weights, order, augmentation")
    demo.add_argument(
        "--cache-dir",
        default=DEFAULT_CACHE_DIR,
        help=f"where the dataset and checkpoints go (default {DEFAULT_CACHE_DIR})",
    )
    demo.add_argument(
        "--gluon",
        action="store_true",
        help="also train with mxnet.gluon.data.DataLoader and compare the times",
    )
    demo.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last checkpoint in the cache directory, mid-epoch if need be",
    )
    demo.add_argument(
        "--stop-after-batches",
        type=_positive_int,
        metavar="N",
        help="simulate a crash: save a checkpoint after N batches (one per training step) and exit",
    )
    # Small sizes for the tests; not part of the advertised interface.
    demo.add_argument("--train-size", type=_positive_int, default=4000, help=argparse.SUPPRESS)
    demo.add_argument("--test-size", type=_positive_int, default=800, help=argparse.SUPPRESS)


def _add_bench(subparsers: Any) -> None:
    """``bench``: where the dataset comes from here, how it is run in :func:`_add_runs`."""
    bench = _subcommand(subparsers, "bench", _run_bench, _BENCH)
    source = bench.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--dataset",
        metavar="MODULE:FACTORY",
        help="a callable returning a dataset: 'package.module:factory' or 'path/file.py:factory'",
    )
    source.add_argument(
        "--recordio",
        metavar="FILE.rec",
        help="an indexed RecordIO image file (with FILE.idx next to it): decoded and "
        "augmented by Gluon's vision transforms (see below)",
    )
    recordio = bench.add_mutually_exclusive_group()
    recordio.add_argument(
        "--raw",
        action="store_true",
        help="with --recordio: read raw records (RecordDataset) instead of decoding images",
    )
    recordio.add_argument(
        "--no-transform",
        action="store_true",
        help="with --recordio: decode the images but apply no transform (they must all "
        "have one size to batch)",
    )
    bench.add_argument(
        "--crop-size",
        type=_positive_int,
        metavar="PX",
        help="with --recordio: the RandomResizedCrop size (default 224)",
    )
    _add_runs(bench)


def _add_runs(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--batch-size", type=_positive_int, default=32, help="samples per batch (default 32)"
    )
    bench.add_argument(
        "--workers",
        type=_worker_list,
        default=None,
        metavar="LIST",
        help="comma-separated num_workers values (default: 0, 1, and the powers of two up "
        "to the core count, and the core count: 0,1,2 on 2 cores)",
    )
    length = bench.add_mutually_exclusive_group()
    length.add_argument(
        "--batches",
        type=_positive_int,
        metavar="N",
        help="batches timed per run, after the warm-up batches (default 100)",
    )
    length.add_argument(
        "--epochs",
        type=_positive_int,
        metavar="N",
        help="epochs per run, timed after the warm-up batches",
    )
    bench.add_argument("--thread-pool", action="store_true", help="use threads, not processes")
    bench.add_argument("--shuffle", action="store_true", help="shuffle the samples")
    bench.add_argument(
        "--step-ms",
        type=_non_negative_float,
        default=0.0,
        metavar="MS",
        help="sleep this long per batch, as a GPU training step would, and recommend the "
        "fewest workers that keep the data stall at or under 5%% (default 0: the fastest)",
    )
    bench.add_argument(
        "--rounds",
        "--repeat",
        dest="rounds",
        type=_positive_int,
        default=5,
        metavar="R",
        help="rounds: every configuration is measured up to R times, the loaders "
        "alternating, and the table gives the median and the range (default 5)",
    )
    bench.add_argument(
        "--budget-s",
        type=_non_negative_float,
        default=120.0,
        metavar="S",
        help="start no round that would end past S seconds (judged by the round before; the "
        "first always runs): fewer rounds, less confidence (default 120; 0: all --rounds)",
    )
    bench.add_argument("--plot", metavar="OUT.png", help="save a plot (needs matplotlib)")
    progress = bench.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress",
        dest="progress",
        action="store_const",
        const=True,
        help="always show a progress bar (default: on a terminal, for runs over a second)",
    )
    progress.add_argument(
        "--no-progress", dest="progress", action="store_const", const=False, help="never show one"
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``shardloader`` argument parser, with its ``demo`` and ``bench`` subcommands."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="shardloader",
        description="A Gluon-compatible, multi-worker, sharded DataLoader for Apache MXNet.",
    )
    parser.add_argument("--version", action="version", version=f"shardloader {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    _add_demo(subparsers)
    _add_bench(subparsers)
    return parser


# ------------------------------------------------------------------------------ running
def _fail(parser: argparse.ArgumentParser, exc: Exception) -> int:
    """Report a problem with the user's input in one line, as argparse does, without usage."""
    print(f"{parser.prog}: error: {exc}", file=sys.stderr)
    return 2


def _run_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.gluon and (args.resume or args.stop_after_batches):
        parser.error(
            "--gluon times whole runs; it cannot be combined with --resume or --stop-after-batches"
        )
    from . import demo
    from .demo_state import CheckpointMismatch

    try:
        return demo.run(args)
    except CheckpointMismatch as exc:
        return _fail(parser, exc)


def _run_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.raw and not args.recordio:
        parser.error("--raw goes with --recordio")
    if args.no_transform and not args.recordio:
        parser.error("--no-transform goes with --recordio")
    if args.crop_size is not None and (not args.recordio or args.raw or args.no_transform):
        parser.error("--crop-size goes with --recordio, without --raw or --no-transform")
    from . import bench

    try:
        return bench.run(args)
    except bench.BenchError as exc:
        return _fail(parser, exc)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit code: 0 on success, 2 for a usage error, 130 when interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.handler(args, args.subparser)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
