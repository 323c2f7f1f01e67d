"""``fuse``: recognise a Gluon image chain and run it on the fused path.

``dataset.transform_first(Compose([...]))`` (or one bare transform) over an image dataset
shardloader can read encoded, built from the transforms in ``_RECOGNISED``, with the loader's
default batchify function, becomes a ``FusedDataset`` and a ``FusedBatchify``. Anything
else keeps the exact path, unchanged, with a sentence saying why (``Fusion.reason``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from mxnet.gluon.data.vision import transforms as T

from .. import batchify as _batchify
from .._compat import MX2
from . import _codecs, _color, _native, _ops, _sources
from ._fused import FusedBatchify, FusedDataset
from ._step import Step
from .pipeline import ImagePipeline

__all__ = ["Fusion", "fuse", "fuse_for_loader"]


class Fusion:
    """What ``fuse`` decided for a dataset and batchify function.

    Attributes
    ----------
    dataset : Dataset
        The dataset the loader should read: a fused dataset, or the one given.
    batchify_fn : callable or None
        The batchify function to use: the fused one, or the one given.
    path : {'fused', 'exact'}
        Which path the images take.
    reason : str or None
        For the exact path, the sentence naming the transform or source that caused it.
    pipeline : ImagePipeline or None
        The recognised pipeline, on the fused path.
    on_device : callable or None
        What the loader runs on each placed batch (the pipeline's ``on_device``: the
        normalise-on-device stage of ``output='device'``), or ``None``.
    """

    def __init__(self, dataset, batchify_fn, path, reason=None, pipeline=None) -> None:
        self.dataset, self.batchify_fn = dataset, batchify_fn
        self.path, self.reason, self.pipeline = path, reason, pipeline
        self.on_device = getattr(pipeline, "on_device", None)

    def __repr__(self) -> str:
        why = f", reason={self.reason!r}" if self.reason else ""
        return f"Fusion(path={self.path!r}{why})"


def _unwrap(dataset: Any) -> Tuple[Optional[Any], List[Any], str]:
    """The innermost dataset under ``transform_first`` layers and their transforms in the
    order they run, or ``(None, [], why)`` when the dataset is not of that shape."""
    from mxnet.gluon.data import dataset as gluon_dataset

    lazy = getattr(gluon_dataset, "_LazyTransformDataset", None)
    first = getattr(gluon_dataset, "_TransformFirstClosure", None)
    transforms: List[Any] = []
    while lazy is not None and type(dataset) is lazy:
        fn = dataset._fn
        if type(fn) is not first:
            return None, [], "dataset.transform(fn) is not fused (transform_first(fn) is)"
        transforms.insert(0, fn._fn)
        dataset = dataset._data
    return dataset, transforms, ""


# Block state the fused step does not reproduce: hooks MXNet runs around forward, and a
# forward or __call__ replaced on the instance. A transform (or Compose) holding any keeps the
# exact path, so the user's code always runs.
_HOOKS = (("_forward_pre_hooks", "forward pre-hooks"), ("_forward_hooks", "forward hooks"))
_INSTANCE_METHODS = ("forward", "hybrid_forward", "__call__")


def _check_state(transform: Any) -> None:
    """``_Unfused`` naming the Block state of ``transform`` the fused step would skip."""
    name = type(transform).__name__
    for attr, what in _HOOKS:
        if getattr(transform, attr, None):
            raise _Unfused(f"transform {name} has {what}, which the fused path would not run")
    own = [m for m in _INSTANCE_METHODS if m in getattr(transform, "__dict__", {})]
    if own:
        raise _Unfused(f"transform {name} has its own {own[0]} set on the instance")


def _flatten(transform: Any, out: List[Any]) -> None:
    """Compose, HybridCompose and the (Hybrid)Sequential blocks Compose builds, flattened;
    ``_Unfused`` for Block state the fused step would skip (``_check_state``)."""
    from mxnet.gluon import nn
    from mxnet.gluon.data.vision import transforms as T

    _check_state(transform)
    # Exact types: a subclass may override forward, and then its children say nothing.
    kinds = (nn.Sequential, nn.HybridSequential, T.Compose, getattr(T, "HybridCompose", T.Compose))
    if type(transform) in kinds:
        for i in range(len(transform)):
            _flatten(transform[i], out)
    else:
        out.append(transform)


def _resize(t: Any, flag: int) -> _ops.Resize:
    if t._keep and not isinstance(t._size, int):
        raise _Unfused("Resize with keep_ratio=True and a (width, height) size")
    return _ops.Resize(t._size, t._keep, t._interpolation)


def _center_crop(t: Any, flag: int) -> _ops.CenterCrop:
    args = t._args  # 1.x: (size, interp); 2.x: (width, height, interp)
    size = args[0] if len(args) == 2 else (args[0], args[1])
    return _ops.CenterCrop(size, args[-1])


def _random_resized_crop(t: Any, flag: int) -> _ops.RandomResizedCrop:
    if MX2:
        kw = t._kwargs
        return _ops.RandomResizedCrop(
            (kw["width"], kw["height"]), kw["area"], kw["ratio"], kw["interp"]
        )
    size, scale, ratio, interp = t._args
    return _ops.RandomResizedCrop(size, scale, ratio, interp)


def _crop_resize(t: Any, flag: int) -> _ops.FixedCrop:
    if t._size is not None and t._interpolation is None:
        raise _Unfused("CropResize with a size and interpolation=None (Gluon refuses it)")
    return _ops.FixedCrop((t._x, t._y, t._width, t._height), t._size, t._interpolation or 1)


def _flip(axis: int) -> Callable[[Any, int], _ops.Flip]:
    return lambda t, flag: _ops.Flip(axis, getattr(t, "p", 0.5))


def _colour(build: Callable[[Any], Step]) -> Callable[[Any, int], Step]:
    """A colour jitter's builder: RGB images only."""

    def built(t: Any, flag: int) -> Step:
        if flag == 0:
            raise _Unfused(f"transform {type(t).__name__} on grey images (flag=0) is not fused")
        return build(t)

    return built


def _color_jitter(t: Any) -> _color.ColorJitter:
    brightness, contrast, saturation, hue = t._args
    if hue:
        raise _Unfused("transform RandomColorJitter with hue > 0 is not fused")
    return _color.ColorJitter(brightness, contrast, saturation)


def _jitter(kind: str) -> Callable[[Any], _color.Jitter]:
    def build(t: Any) -> _color.Jitter:
        low, high = t._args
        return _color.Jitter(kind, low, high)

    return build


# Gluon's transform class -> the function building its fused step from the transform and the
# images' flag. Exact classes: a subclass may override forward. ToTensor, Normalize and Cast
# are the output stage (``_pipeline``).
_RECOGNISED: Dict[type, Callable[[Any, int], Step]] = {
    kind: build
    for kind, build in (
        (T.Resize, _resize),
        (T.CenterCrop, _center_crop),
        (T.RandomResizedCrop, _random_resized_crop),
        (getattr(T, "CropResize", None), _crop_resize),
        (T.RandomFlipLeftRight, _flip(1)),
        (T.RandomFlipTopBottom, _flip(0)),
        (getattr(T, "RandomBrightness", None), _colour(_jitter("brightness"))),
        (getattr(T, "RandomContrast", None), _colour(_jitter("contrast"))),
        (getattr(T, "RandomSaturation", None), _colour(_jitter("saturation"))),
        (getattr(T, "RandomLighting", None), _colour(lambda t: _color.Lighting(t._alpha))),
        (getattr(T, "RandomColorJitter", None), _colour(_color_jitter)),
    )
    if kind is not None
}
_STEP_NAMES = frozenset(kind.__name__ for kind in _RECOGNISED)


class _Unfused(Exception):
    """A chain the fused path does not run; the message is the reason."""


def _pipeline(transforms: List[Any], flag: int, scaled_decode: bool) -> ImagePipeline:
    """The pipeline for a flattened chain, or ``_Unfused`` naming the transform."""
    steps, output, mean, std, dtype = [], "hwc", 0.0, 1.0, "float32"
    normalized = cast = False
    for t in transforms:
        name = type(t).__name__
        if cast:
            raise _Unfused(f"transform {name} after Cast is not fused")
        if output == "hwc":
            build = _RECOGNISED.get(type(t))
            if build is not None:
                try:
                    steps.append(build(t, flag))
                except ValueError as exc:
                    raise _Unfused(f"transform {name} is not fused: {exc}") from None
                continue
            if type(t) is T.ToTensor:
                output = "float32"
                continue
        elif type(t) is T.Normalize and not normalized:
            mean, std, normalized = t._mean, t._std, True
            continue
        if type(t) is T.Cast and output == "float32":
            dtype, cast = t._dtype, True
            continue
        where = "before ToTensor" if output == "hwc" else "after ToTensor"
        if _geometric_name(name) or name in ("Normalize", "Cast"):
            raise _Unfused(f"transform {name} {where} is not fused")
        raise _Unfused(f"transform {name} is not fused")
    try:
        return ImagePipeline.from_steps(
            steps,
            output=output,
            mean=mean,
            std=std,
            flag=flag,
            scaled_decode=scaled_decode,
            dtype=dtype,
        )
    except (ValueError, TypeError) as exc:
        raise _Unfused(f"the chain's parameters are not fused: {exc}") from None


def _geometric_name(name: str) -> bool:
    return name in _STEP_NAMES or name.startswith("RandomFlip")


def fuse(
    dataset: Any,
    batchify_fn: Optional[Callable] = None,
    *,
    pipeline: Optional[ImagePipeline] = None,
    scaled_decode: bool = True,
) -> Fusion:
    """Run ``dataset``'s Gluon image transforms on the fused path if they allow it.

    Parameters
    ----------
    dataset : Dataset
        Typically ``ImageRecordDataset(...).transform_first(Compose([...]))``.
    batchify_fn : callable, optional
        The loader's ``batchify_fn``. ``None`` or a default batchify function (Gluon's or
        shardloader's) allows fusing; any other keeps the exact path, since a custom
        batchify function expects the transformed samples.
    pipeline : ImagePipeline, optional
        Run this pipeline instead of recognising transforms: ``dataset`` is then an image
        dataset without transforms (shardloader's or Gluon's) or a dataset of encoded
        images (each sample the bytes, or a tuple whose first item is the bytes).
    scaled_decode : bool, default True
        Let a random crop decode at a reduced scale (``ImagePipeline``).

    Returns
    -------
    Fusion
        ``path='fused'`` with the fused dataset and batchify function, or ``path='exact'``
        with the arguments unchanged and the reason.
    """

    def exact(reason: str) -> Fusion:
        return Fusion(dataset, batchify_fn, "exact", reason)

    if isinstance(dataset, FusedDataset):  # ImageRecordLoader's, already fused
        if isinstance(batchify_fn, FusedBatchify):
            _native.build_all()
            return Fusion(dataset, batchify_fn, "fused", None, dataset.pipeline)
        raise TypeError("a fused dataset needs its FusedBatchify as batchify_fn")
    if pipeline is not None:
        inner = dataset
        transforms: List[Any] = []
        source, why = _sources.source_of(inner)
        if source is None:
            source = _sources.Encoded(dataset, pipeline.flag)
    else:
        inner, transforms, why = _unwrap(dataset)
        if inner is None:
            return exact(why)
        source, why = _sources.source_of(inner)
        if source is None:
            return exact(why)
    if not _codecs.available():
        return exact(f"the image codecs are not installed: {_codecs.INSTALL_HINT}")
    rest = _batchify.as_loader_default(batchify_fn)
    if rest is None:
        name = getattr(batchify_fn, "__name__", type(batchify_fn).__name__)
        return exact(f"a custom batchify_fn ({name}) expects the transformed samples")
    if pipeline is None:
        flat: List[Any] = []
        try:
            for transform in transforms:
                _flatten(transform, flat)
            pipeline = _pipeline(flat, source.flag, scaled_decode)
        except _Unfused as exc:
            return exact(str(exc))
    elif pipeline.flag != source.flag:
        raise ValueError(
            f"pipeline flag={pipeline.flag} differs from the dataset's flag={source.flag}"
        )
    fused = FusedDataset(source, pipeline)
    # The C helpers built here, in the process that makes the fusion, before any worker
    # starts: workers only load a build (vision/_native.py).
    _native.build_all()
    return Fusion(fused, FusedBatchify(pipeline, rest), "fused", None, pipeline)


def fuse_for_loader(
    dataset: Any,
    batchify_fn: Optional[Callable],
    *,
    fuse_transforms: bool,
    try_nopython: Optional[bool],
) -> Tuple[Optional[Fusion], str]:
    """What ``ShardedDataLoader`` asks: ``(fusion, image_path)``, the fused path for a Gluon
    image chain or a fused dataset, or ``None`` and ``stats()['image_path']``'s sentence.

    Only a ``transform_first`` chain (``_LazyTransformDataset``) or a ``FusedDataset`` is
    considered; any other dataset is ``'exact'`` at the cost of one type test."""
    from mxnet.gluon.data import dataset as gluon_dataset

    fused = isinstance(dataset, FusedDataset)
    if type(dataset) is not getattr(gluon_dataset, "_LazyTransformDataset", None) and not fused:
        return None, "exact"
    if try_nopython:
        return None, "exact: try_nopython=True runs Gluon's C++ pipeline"
    if not (fuse_transforms or fused):
        return None, "exact: fuse_transforms=False"
    fusion = fuse(dataset, batchify_fn)
    if fusion.path == "fused":
        return fusion, "fused"
    return None, f"exact: {fusion.reason}"
