"""Where ``shardloader bench`` gets its dataset: a user's factory (``--dataset``) or an
indexed RecordIO file of images (``--recordio``), checked so that a wrong input fails in one
line, as a :class:`BenchError`, and not inside a worker.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable, Dict, Optional, Tuple

__all__ = [
    "BenchError",
    "one_line",
    "resolve_factory",
    "image_pipeline",
    "load_dataset",
    "shuffled",
    "uses_mxnet",
]


class BenchError(Exception):
    """A problem with the command's input: printed as a usage error, without a traceback."""


def one_line(exc: BaseException) -> str:
    """``Type: last line of the message`` (MXNet's errors carry a C++ trace; the last line
    says what failed, and often starts with the type's name already)."""
    name = type(exc).__name__
    last = (str(exc).strip().splitlines() or [""])[-1].strip()
    while last.startswith(name + ":"):
        last = last[len(name) + 1 :].strip()
    return f"{name}: {last}" if last else name


def resolve_factory(spec: str) -> Any:
    """The object that ``'package.module:name'`` or ``'path/to/file.py:name'`` names.

    Parameters
    ----------
    spec : str
        A module path importable from the current directory, or a Python file, then a colon
        and an attribute name (dots allowed, as in ``'module:Class.create'``).

    Returns
    -------
    object
        The attribute: a dataset factory, or a dataset.

    Raises
    ------
    BenchError
        If the module, the file or the attribute cannot be found.
    """
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise BenchError(
            f"--dataset must look like 'package.module:factory' or 'path/to/file.py:factory', "
            f"got {spec!r}"
        )
    if target.endswith(".py") or os.sep in target:
        module = _load_file(target)
    else:
        # As `python -m` does, so a module next to the user's working directory imports.
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise BenchError(f"--dataset: cannot import module {target!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            choices = _choices(obj, part)
            raise BenchError(f"--dataset: {target!r} has no attribute {attr!r}{choices}")
        obj = getattr(obj, part)
    return obj


def _choices(obj: Any, wrong: str) -> str:
    """``; did you mean 'make'? Its callables: make, make_big`` for a module or class that
    has no attribute ``wrong``: those it defines itself, else every public one."""
    public = {
        name: value
        for name, value in vars(obj).items()
        if not name.startswith("_") and callable(value)
    }
    home = getattr(obj, "__name__", None)
    own = [n for n, v in public.items() if getattr(v, "__module__", home) == home]
    names = sorted(own or public)
    if not names:
        return f"; {_kind(obj)} has no public callables"
    close = difflib.get_close_matches(wrong, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
    return f"{hint}{';' if not hint else ''} its callables: {shown}"


def _kind(obj: Any) -> str:
    return "the module" if inspect.ismodule(obj) else f"{type(obj).__name__} {obj!r}"


def _load_file(path: str) -> Any:
    if not os.path.isfile(path):
        raise BenchError(f"--dataset: no such file {path!r}")
    name = os.path.splitext(os.path.basename(path))[0]
    if name in sys.modules:
        name = f"_shardloader_bench_{name}"
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
    if spec is None or spec.loader is None:
        raise BenchError(f"--dataset: cannot load {path!r} as Python")
    module = importlib.util.module_from_spec(spec)
    # Registered, and its folder importable, so its classes pickle for spawn workers.
    sys.modules[name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    return module


# The image pipeline of ``--recordio``: ImageNet's channel statistics, as most users write.
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)
_DEFAULT_CROP = 224
# Gluon's RandomResizedCrop defaults (area 8-100% of the image, aspect ratio 3/4 to 4/3) and
# ImageNet's statistics in pixel units, as ImageRecordIter and ImageRecordLoader spell them:
# the same augmentation as the Gluon pipeline, so the loaders do the same work.
_RECORD_ITER_ARGS: Dict[str, Any] = dict(
    random_resized_crop=True,
    min_random_area=0.08,
    max_random_area=1.0,
    min_aspect_ratio=3.0 / 4.0,
    max_aspect_ratio=4.0 / 3.0,
    rand_mirror=True,
    shuffle=True,
    **{f"mean_{c}": 255.0 * m for c, m in zip("rgb", _MEAN)},
    **{f"std_{c}": 255.0 * s for c, s in zip("rgb", _STD)},
)


def crop_size(args: argparse.Namespace) -> int:
    """The ``--recordio`` pipeline's crop: ``--crop-size``, or 224."""
    return getattr(args, "crop_size", None) or _DEFAULT_CROP


def image_pipeline_loaders(args: argparse.Namespace) -> bool:
    """Whether ``args`` run the ``--recordio`` image pipeline, which ``mx.io.ImageRecordIter``
    and ``ImageRecordLoader`` can run too (not ``--raw`` or ``--no-transform``)."""
    return bool(args.recordio) and not args.raw and not getattr(args, "no_transform", False)


class RecordIterLoader:
    """``mx.io.ImageRecordIter`` over ``--recordio`` with the pipeline's augmentation (in
    C++), ``preprocess_threads=max(1, workers)``; iterable once per epoch like a DataLoader,
    yielding ``[data, label]``."""

    def __init__(self, args: argparse.Namespace, workers: int) -> None:
        import mxnet as mx

        crop = crop_size(args)
        self._iter = mx.io.ImageRecordIter(
            path_imgrec=args.recordio,
            path_imgidx=index_path(args.recordio),
            data_shape=(3, crop, crop),
            batch_size=args.batch_size,
            preprocess_threads=max(1, workers),
            **_RECORD_ITER_ARGS,
        )
        self._started = False

    def __iter__(self):
        if self._started:
            self._iter.reset()
        self._started = True
        for batch in self._iter:
            yield [batch.data[0], batch.label[0]]


def record_loader(args: argparse.Namespace, workers: int) -> Any:
    """``shardloader.vision.ImageRecordLoader`` over ``--recordio`` with ImageRecordIter's
    arguments as :class:`RecordIterLoader` passes them, ``preprocess_threads=workers``."""
    from ..vision import ImageRecordLoader

    crop = crop_size(args)
    return ImageRecordLoader(
        args.recordio,
        index_path(args.recordio),
        data_shape=(3, crop, crop),
        batch_size=args.batch_size,
        preprocess_threads=workers,
        thread_pool=args.thread_pool,
        **_RECORD_ITER_ARGS,
    )


def image_pipeline(rec_path: str, crop: int = _DEFAULT_CROP) -> Any:
    """Gluon's ``ImageRecordDataset`` over ``rec_path`` with the training augmentation most
    Gluon image models use: ``RandomResizedCrop(crop)``, ``RandomFlipLeftRight()``,
    ``ToTensor()``, ``Normalize(mean, std)`` (ImageNet's), applied with ``transform_first``.
    Samples are ``(float32 3 x crop x crop NDArray, label)``. MXNet's pip wheels cannot read
    ``s3://`` paths, so those are read through shardloader's ``ImageRecordDataset``, which
    samples alike."""
    from mxnet.gluon.data.vision import ImageRecordDataset
    from mxnet.gluon.data.vision import transforms as T

    if rec_path.startswith("s3://"):
        from ..recordio import ImageRecordDataset

    augment = T.Compose(
        [
            T.RandomResizedCrop(crop),
            T.RandomFlipLeftRight(),
            T.ToTensor(),
            T.Normalize(_MEAN, _STD),
        ]
    )
    return ImageRecordDataset(rec_path).transform_first(augment)


def index_path(rec_path: str) -> str:
    """Where the index of ``rec_path`` is (next to it, where Gluon looks): every loader of
    ``--recordio`` gets its paths from here and :func:`_check_record_files`."""
    return os.path.splitext(rec_path)[0] + ".idx"


def _check_record_files(rec_path: str) -> str:
    """The index path of ``rec_path``, or a BenchError saying what is missing. An
    ``s3://`` object is checked by the dataset that opens it, whose errors name its URL."""
    if rec_path.startswith("s3://"):
        return os.path.splitext(rec_path)[0] + ".idx"
    if os.path.isdir(rec_path):
        raise BenchError(f"--recordio: {rec_path!r} is a directory, not a .rec file")
    if not os.path.isfile(rec_path):
        raise BenchError(f"--recordio: no such file {rec_path!r}")
    idx_path = index_path(rec_path)
    if not os.path.isfile(idx_path):
        raise BenchError(
            f"--recordio: no index {idx_path!r} next to {rec_path!r}. The benchmark reads "
            "images at random positions, which needs the index; write the records with one "
            "(mx.recordio.MXIndexedRecordIO, im2rec, or shardloader.recordio.pack_images)"
        )
    if os.path.getsize(idx_path) == 0:
        raise BenchError(f"--recordio: the index {idx_path!r} is empty")
    return idx_path


def _first_sample(dataset: Any, rec_path: str, what: str) -> None:
    """Load sample 0 once, so that a file that is not what it should be fails here, in one
    line, and not inside a worker."""
    try:
        sample = dataset[0]
        first = sample[0] if isinstance(sample, (tuple, list)) else sample
        wait = getattr(first, "wait_to_read", None)
        if wait is not None:
            wait()
    except Exception as exc:  # noqa: BLE001 - any failure here is the file's
        raise BenchError(
            f"--recordio: cannot read record 0 of {rec_path!r} as {what}: {one_line(exc)}"
        ) from None


def load_dataset(args: argparse.Namespace) -> Tuple[Any, str, Optional[Callable]]:
    """The dataset, a description of it, and the batchify function both loaders get."""
    if args.recordio:
        _check_record_files(args.recordio)  # before MXNet is imported: a typo fails at once
        from ..recordio import ImageRecordDataset, RecordDataset

        if args.raw:
            from ..batchify import List as ListBatchify

            return RecordDataset(args.recordio), f"raw records of {args.recordio}", ListBatchify()
        if getattr(args, "no_transform", False):
            dataset = ImageRecordDataset(args.recordio)
            _first_sample(dataset, args.recordio, "an image")
            return dataset, f"decoded images of {args.recordio}", None
        crop = crop_size(args)
        dataset = image_pipeline(args.recordio, crop)
        _first_sample(dataset, args.recordio, "an image")
        reader = "shardloader's" if args.recordio.startswith("s3://") else "Gluon's"
        described = (
            f"{args.recordio} through {reader} ImageRecordDataset + RandomResizedCrop({crop}), "
            f"RandomFlipLeftRight, ToTensor, Normalize"
        )
        return dataset, described, None
    made = resolve_factory(args.dataset)
    if callable(made):
        _check_no_arguments(made, args.dataset)
        made = made()
    dataset = made
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise BenchError(
            f"--dataset {args.dataset} returned {type(dataset).__name__}, which is not a "
            f"dataset (it needs __len__ and __getitem__)"
        )
    return dataset, f"{type(dataset).__name__} from {args.dataset}", None


def _check_no_arguments(factory: Callable, spec: str) -> None:
    try:
        inspect.signature(factory).bind()
    except TypeError as exc:
        raise BenchError(
            f"--dataset {spec}: the factory is called without arguments, but {exc}; wrap it "
            f"in a function that takes none"
        ) from None
    except ValueError:  # no signature (some builtins): just try the call
        pass


def uses_mxnet(dataset: Any, args: argparse.Namespace) -> bool:
    """Whether the samples are MXNet arrays (made by MXNet operators, which share MXNet's
    engine threads): the ``--recordio`` image pipeline, or a dataset whose sample 0 holds
    an NDArray. A dataset that uses MXNet inside but returns numpy is not seen."""
    if args.recordio:
        return not args.raw
    from .._engine.nest import leaves

    try:
        sample = dataset[0]
    except Exception:  # noqa: BLE001 - the runs report the dataset's own errors
        return False
    return any(type(leaf).__module__.startswith("mxnet") for leaf in leaves(sample))


def shuffled(args: argparse.Namespace) -> bool:
    """``--shuffle``, or the ``--recordio`` image pipeline, which trains shuffled."""
    return bool(args.shuffle) or image_pipeline_loaders(args)
