"""``fuse``: recognise a Gluon image chain and run it on the fused path.

``dataset.transform_first(Compose([...]))`` (or one bare transform) over an image dataset
shardloader can read encoded, built from the transforms in ``_RECOGNISED``, with the loader's
default batchify function, becomes a ``FusedDataset`` and a ``FusedBatchify``. Anything
else keeps the exact path, unchanged, with a sentence saying why (``Fusion.reason``).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from .. import batchify as _batchify
from .._compat import MX2
from . import _codecs, _color, _ops, _sources
from ._fused import FusedBatchify, FusedDataset
from .pipeline import ImagePipeline

__all__ = ["Fusion", "fuse"]


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
    """

    def __init__(self, dataset, batchify_fn, path, reason=None, pipeline=None) -> None:
        self.dataset, self.batchify_fn = dataset, batchify_fn
        self.path, self.reason, self.pipeline = path, reason, pipeline

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


def _geometric(t: Any, T: Any) -> Optional[Any]:
    """The step for a geometric Gluon transform, or ``None`` if ``t`` is not one."""
    kind = type(t)
    if kind is T.Resize:
        if t._keep and not isinstance(t._size, int):
            raise _Unfused("Resize with keep_ratio=True and a (width, height) size")
        return _ops.Resize(t._size, t._keep, t._interpolation)
    if kind is T.CenterCrop:
        args = t._args  # 1.x: (size, interp); 2.x: (width, height, interp)
        size = args[0] if len(args) == 2 else (args[0], args[1])
        return _ops.CenterCrop(size, args[-1])
    if kind is T.RandomResizedCrop:
        if MX2:
            kw = t._kwargs
            return _ops.RandomResizedCrop(
                (kw["width"], kw["height"]), kw["area"], kw["ratio"], kw["interp"]
            )
        size, scale, ratio, interp = t._args
        return _ops.RandomResizedCrop(size, scale, ratio, interp)
    if kind is getattr(T, "CropResize", None):
        if t._size is not None and t._interpolation is None:
            raise _Unfused("CropResize with a size and interpolation=None (Gluon refuses it)")
        return _ops.FixedCrop((t._x, t._y, t._width, t._height), t._size, t._interpolation or 1)
    if kind in (T.RandomFlipLeftRight, T.RandomFlipTopBottom):
        return _ops.Flip(1 if kind is T.RandomFlipLeftRight else 0, getattr(t, "p", 0.5))
    return None


_JITTERS = ("RandomBrightness", "RandomContrast", "RandomSaturation", "RandomLighting")


def _jitter(t: Any, T: Any, flag: int) -> Optional[Any]:
    """The step for one of Gluon's colour jitters, or ``None`` if ``t`` is not one."""
    name = type(t).__name__
    kind = type(t)
    if name not in _JITTERS + ("RandomColorJitter",) or kind is not getattr(T, name, None):
        return None
    if flag == 0:
        raise _Unfused(f"transform {name} on grey images (flag=0) is not fused")
    if name == "RandomColorJitter":
        brightness, contrast, saturation, hue = t._args
        if hue:
            raise _Unfused("transform RandomColorJitter with hue > 0 is not fused")
        return _color.ColorJitter(brightness, contrast, saturation)
    if name == "RandomLighting":
        return _color.Lighting(t._alpha)
    low, high = t._args
    return _color.Jitter(name[len("Random") :].lower(), low, high)


class _Unfused(Exception):
    """A chain the fused path does not run; the message is the reason."""


def _pipeline(transforms: List[Any], flag: int, scaled_decode: bool) -> ImagePipeline:
    """The pipeline for a flattened chain, or ``_Unfused`` naming the transform."""
    from mxnet.gluon.data.vision import transforms as T

    steps, output, mean, std, dtype = [], "hwc", 0.0, 1.0, "float32"
    normalized = cast = False
    for t in transforms:
        name = type(t).__name__
        if cast:
            raise _Unfused(f"transform {name} after Cast is not fused")
        if output == "hwc":
            try:
                step = _geometric(t, T) or _jitter(t, T, flag)
            except ValueError as exc:
                raise _Unfused(f"transform {name} is not fused: {exc}") from None
            if step is not None:
                steps.append(step)
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
    pixel_steps = ("Resize", "CenterCrop", "RandomResizedCrop", "CropResize", "RandomColorJitter")
    return name in pixel_steps + _JITTERS or name.startswith("RandomFlip")


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
            return Fusion(dataset, batchify_fn, "fused", None, dataset.pipeline)
        raise TypeError("a fused dataset needs its FusedBatchify as batchify_fn")
    if pipeline is not None:
        inner, transforms = dataset, []
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
    return Fusion(fused, FusedBatchify(pipeline, rest), "fused", None, pipeline)
