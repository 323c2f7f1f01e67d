"""``ImageRecordLoader``: ``mx.io.ImageRecordIter``'s arguments, on the fused path.

The mapping of each argument is the table in docs/vision.md. ImageRecordIter's ``mean_*``
and ``std_*`` are in pixel units (0..255): the batch is ``(pixel - mean) / std``, with no
division by 255, exactly as ImageRecordIter computes it.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import batchify as _batchify
from ._engine.options import LoaderOptions
from ._validate import arguments_for, check_bool, check_int, check_options, option, optional
from .dataiter import LoaderDataIter
from .loader import ShardedDataLoader
from .recordio import ImageRecordDataset
from .vision import _codecs, _sources
from .vision._fused import FusedBatchify, FusedDataset
from .vision.device import PlacedNormalize
from .vision.pipeline import ImagePipeline

__all__ = ["ImageRecordLoader", "image_record_iter"]


def _data_shape(name: str, value: Any) -> tuple:
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        or value[0] not in (1, 3)
    ):
        raise ValueError(
            f"{name} must be (channels, height, width) with 1 or 3 channels and positive "
            f"sizes, got {value!r}"
        )
    return tuple(value)


def _aspect_range(min_aspect_ratio: Optional[float], max_aspect_ratio: float) -> tuple:
    """ImageRecordIter's aspect-ratio range: ``[min_aspect_ratio, max_aspect_ratio]``, or
    without ``min_aspect_ratio``, ``[1 - max_aspect_ratio, 1 + max_aspect_ratio]``."""
    if max_aspect_ratio < 0:
        raise ValueError(f"max_aspect_ratio must be >= 0, got {max_aspect_ratio!r}")
    if min_aspect_ratio is None:
        low, high = 1.0 - max_aspect_ratio, 1.0 + max_aspect_ratio
        if low <= 0:
            raise ValueError(
                f"without min_aspect_ratio the aspect ratio is in [1 - max_aspect_ratio, "
                f"1 + max_aspect_ratio] (ImageRecordIter's), here [{low:g}, {high:g}]; give "
                f"min_aspect_ratio= too (e.g. min_aspect_ratio=3/4, max_aspect_ratio=4/3)"
            )
        return low, high
    low, high = float(min_aspect_ratio), float(max_aspect_ratio)
    if not 0 < low <= high:
        raise ValueError(
            f"need 0 < min_aspect_ratio <= max_aspect_ratio, got {min_aspect_ratio!r} and "
            f"{max_aspect_ratio!r}"
        )
    return low, high


# ImageRecordIter's arguments whose step is not fused: taken only at the value that does
# nothing (so a recipe that passes its defaults runs unchanged), refused by name otherwise.
_NOT_FUSED = {
    "max_rotate_angle": (0, "a random rotation"),
    "rotate": (-1, "a rotation"),
    "max_shear_ratio": (0, "a random shear"),
    "random_h": (0, "a jitter in HSL space"),
    "random_s": (0, "a jitter in HSL space"),
    "random_l": (0, "a jitter in HSL space"),
    "max_random_scale": (1, "a random scaling (an affine warp)"),
    "min_random_scale": (1, "a random scaling (an affine warp)"),
    "max_crop_size": (-1, "random square crop sizes"),
    "min_crop_size": (-1, "random square crop sizes"),
    "pad": (0, "padding"),
    "max_img_size": (1e10, "a size bound after the affine warp"),
    "min_img_size": (0, "a size bound after the affine warp"),
    "mean_img": ("", "a mean image"),
    "scale": (1, "a scaling of the batch"),
    "max_random_contrast": (0, "the old contrast jitter"),
    "max_random_illumination": (0, "the old illumination jitter"),
    "path_imglist": ("", "labels from a list file (the labels are the records')"),
}
# ImageRecordIter's arguments with no effect here: shardloader manages its own buffers,
# logging and threads.
_IGNORED = ("verbose", "prefetch_buffer", "fill_value", "shuffle_chunk_size", "device_id")
_DATAITER = ("provide_data", "provide_label", "reset", "iter_next", "getdata", "getlabel",
             "getpad", "getindex", "next")  # fmt: skip
# ImageRecordIter's own (MXNet 1.9.1): float32, uint8, int8; it refuses the others ("unknown
# dtype for ImageRecordIter2"). float16 and float64 are shardloader's (Gluon's Cast).
_DTYPES = ("float32", "float16", "float64", "uint8", "int8")


def _int8_table(mean: Sequence[float], channels: int) -> np.ndarray:
    """ImageRecordIter's ``dtype='int8'``: each pixel less its channel's mean, rounded and
    saturated to -128..127; the std is not applied (measured against its batches)."""
    values = np.arange(256, dtype=np.float32)[None, :]
    means = np.resize(np.asarray(mean, np.float32), channels)[:, None]
    return np.clip(np.rint(values - means), -128, 127).astype(np.float32)


def _takes() -> List[str]:
    own = [p for p in inspect.signature(ImageRecordLoader.__init__).parameters][1:-1]
    loader = [p for p in inspect.signature(ShardedDataLoader.__init__).parameters][1:]
    extra = [n for n in loader if n not in own and n not in ("dataset", "batchify_fn")]
    return own + extra + list(_NOT_FUSED) + list(_IGNORED)


def _check_arguments(door: str, kwargs: dict) -> None:
    """The door's refusals: an argument it does not know (with "did you mean"), one of
    ``_NOT_FUSED`` asking for its step, and ShardedDataLoader arguments the door sets."""
    takes = _takes()
    for name, value in kwargs.items():
        if name in ("dataset", "batchify_fn"):
            raise TypeError(f"{door}() builds its own {name}; it takes: {', '.join(takes)}")
        if name in _NOT_FUSED:
            noop, what = _NOT_FUSED[name]
            if value is not None and value != noop:
                raise ValueError(
                    f"{door}(): {name}={value!r} asks for {what}, which shardloader's fused "
                    f"image path does not run; it takes {name} only at {noop!r} (no effect). "
                    f"Remove it, or keep mx.io.ImageRecordIter for this pipeline"
                )
            continue
        if name in _IGNORED or name in takes:
            continue
        near = difflib.get_close_matches(name, takes, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise TypeError(
            f"{door}() got an unexpected keyword argument {name!r}{hint} It takes: "
            f"{', '.join(takes)}"
        )


def _last_batch(round_batch: Optional[bool], last_batch: Optional[str]) -> Optional[str]:
    """``round_batch`` as the loader's ``last_batch``: True keeps every batch full, the
    records left over starting the next epoch ('rollover'); False keeps a short last
    batch ('keep')."""
    if round_batch is None:
        return last_batch
    wanted = "rollover" if round_batch else "keep"
    if last_batch is not None and last_batch != wanted:
        raise ValueError(
            f"round_batch={round_batch} means last_batch={wanted!r}, but last_batch="
            f"{last_batch!r} was given too; give one of them"
        )
    return wanted


def _amount(name: str, value: Any) -> float:
    amount = float(value)
    if amount < 0:
        raise ValueError(f"{name} must be >= 0, got {amount!r}")
    return amount


def _threads(name: str, value: Any) -> int:
    """``preprocess_threads``: worker processes, by default ``min(4, os.cpu_count())``."""
    return check_int(name, min(4, os.cpu_count() or 1) if value is None else value, 0)


def _dtype(name: str, value: Any) -> Optional[str]:
    if value is not None and value not in _DTYPES:
        raise ValueError(
            f"{name} must be one of {_DTYPES} or None, got {value!r} (ImageRecordIter itself "
            f"takes float32, uint8 and int8)"
        )
    return value


@dataclass(frozen=True)
class _DoorOptions:
    """The door's own arguments, ImageRecordIter's (those that are the loader's go to
    ``LoaderOptions``): each spelled once, with its default and its check, checked where
    the options are made. The defaults are ``ImageRecordLoader``'s (a test holds its
    signature to them)."""

    path_imgrec: str
    path_imgidx: Optional[str] = option(None)
    data_shape: Tuple[int, int, int] = option((3, 224, 224), _data_shape)
    rand_crop: bool = option(False, check_bool)
    random_resized_crop: bool = option(False, check_bool)
    min_random_area: float = option(1.0)
    max_random_area: float = option(1.0)
    max_aspect_ratio: float = option(0.0)
    min_aspect_ratio: Optional[float] = option(None)
    rand_mirror: bool = option(False, check_bool)
    resize: int = option(-1, functools.partial(check_int, minimum=-1))
    mean_r: float = option(0.0)
    mean_g: float = option(0.0)
    mean_b: float = option(0.0)
    std_r: float = option(1.0)
    std_g: float = option(1.0)
    std_b: float = option(1.0)
    preprocess_threads: int = option(None, _threads)
    output: str = option("float32")  # with dtype=, the output it means
    inter_method: int = option(1)
    brightness: float = option(0.0, _amount)
    contrast: float = option(0.0, _amount)
    saturation: float = option(0.0, _amount)
    pca_noise: float = option(0.0, _amount)
    label_width: int = option(1, functools.partial(check_int, minimum=1))
    round_batch: Optional[bool] = option(None, optional(check_bool))
    data_name: str = option("data")
    label_name: str = option("softmax_label")
    dtype: Optional[str] = option(None, _dtype)
    # The entry point's name, for messages ("ImageRecordLoader" or "image_record_iter").
    door: str = option("ImageRecordLoader")
    # Worked out from the above: the aspect-ratio range of the random resized crop.
    ratio: Tuple[float, float] = option((1.0, 1.0), init=False)

    def __post_init__(self) -> None:
        check_options(self)
        door, channels = self.door, self.data_shape[0]
        if self.rand_crop and self.random_resized_crop:
            raise ValueError("random_resized_crop=True conflicts with rand_crop=True (as in "
                             "ImageRecordIter): give one of them")  # fmt: skip
        if self.random_resized_crop:
            ratio = _aspect_range(self.min_aspect_ratio, self.max_aspect_ratio)
            object.__setattr__(self, "ratio", ratio)
        elif self.max_aspect_ratio != 0 or self.min_aspect_ratio not in (None, 1, 1.0):
            raise ValueError(
                f"{door}(): max_aspect_ratio/min_aspect_ratio without random_resized_crop=True "
                f"ask for ImageRecordIter's aspect-ratio warp (an affine warp), which the "
                f"fused path does not run; use them with random_resized_crop=True"
            )
        inter_method = self.inter_method
        if isinstance(inter_method, bool) or inter_method not in (0, 1, 2, 3, 4, 9):
            raise ValueError(
                f"{door}(): inter_method must be one of 0, 1, 2, 3, 4 or 9, got "
                f"{inter_method!r}" + (" (10, a random method per image, is not fused)"
                                       if inter_method == 10 else "")
            )  # fmt: skip
        for name in ("brightness", "contrast", "saturation", "pca_noise"):
            if getattr(self, name) and channels == 1:
                raise ValueError(f"{name} needs colour images: data_shape has 1 channel")
        output, dtype = self.output, self.dtype
        if dtype is not None:
            if output != "float32":
                raise ValueError(f"give dtype= or output=, not both (got {dtype!r}, {output!r})")
            object.__setattr__(self, "output", "uint8" if dtype == "uint8" else "float32")
        if self.output not in ("float32", "uint8", "device"):
            raise ValueError(f"output must be one of 'float32', 'uint8', 'device', got {output!r}")


class _Labels:
    """A source whose labels are ImageRecordIter's: with ``label_width=1`` one float32
    number, else a float32 array of ``label_width``; a record holding another number of
    labels raises, naming it (ImageRecordIter's check)."""

    def __init__(self, source: Any, width: int, path: str) -> None:
        self.source, self.width, self.path = source, width, path
        self.kind, self.flag = source.kind, source.flag

    def __len__(self) -> int:
        return len(self.source)

    def read(self, idx: int) -> Tuple[Any, Any]:
        data, (label,) = self.source.read(idx)
        values = np.asarray(label, np.float32).reshape(-1)
        if values.size != self.width:
            raise ValueError(
                f"record {idx} of {self.path} holds {values.size} labels but label_width="
                f"{self.width}; pass label_width={values.size}"
            )
        return data, (values[0] if self.width == 1 else values,)

    def fail(self, idx: int, data: Any) -> None:
        self.source.fail(idx, data)


class ImageRecordLoader(ShardedDataLoader):
    """A loader over an indexed ``.rec`` of images that takes ``mx.io.ImageRecordIter``'s
    arguments, with their meaning, and runs on the fused image path.

    It is a ``ShardedDataLoader`` (process workers, ``preprocess_threads`` of them), for a
    Gluon loop (``for data, label in loader``), so it also has seeds, sharding, resume and
    errors naming the record; ``dataiter()`` (or ``image_record_iter(...)``) gives the
    ``mx.io.DataIter`` for ``Module.fit`` and code written against ImageRecordIter.
    Batches are ``[data, label]``: data float32 ``(batch_size, C, H, W)`` (uint8 with
    ``dtype='uint8'``), label float32 ``(batch_size,)``, or ``(batch_size, label_width)``.
    docs/vision.md's table gives each argument's meaning and the differences.

    Parameters
    ----------
    path_imgrec : str
        The ``.rec`` file of images.
    path_imgidx : str, optional
        Its index; by default the ``.idx`` file next to it (``path_imgrec`` with ``.idx``).
    data_shape : (channels, height, width), default (3, 224, 224)
        The output shape; 1 channel decodes to grey.
    batch_size : int
        Images per batch.
    label_width : int, default 1
        Labels per record: ``(batch_size,)`` labels for 1, ``(batch_size, k)`` for k.
    shuffle : bool, default False
        Shuffle every epoch (seeded by ``seed`` and the epoch).
    rand_crop : bool, default False
        A random ``data_shape`` crop instead of the centre one.
    random_resized_crop : bool, default False
        ImageRecordIter's: area uniform in ``[min_random_area, max_random_area]`` of the
        image's, aspect ratio uniform in ``[min_aspect_ratio, max_aspect_ratio]``, width and
        height swapped with probability 0.5, then resized to ``data_shape``.
    min_random_area, max_random_area : float, default 1.0
    max_aspect_ratio : float, default 0.0
    min_aspect_ratio : float, optional
        Defaults to ``1 - max_aspect_ratio`` (so the range is ``1 ± max_aspect_ratio``).
    rand_mirror : bool, default False
        Flip left-right with probability 0.5.
    resize : int, default -1
        Resize the shorter edge to this first (-1: don't).
    brightness, contrast, saturation : float, default 0
        Colour jitters after the crop, in a random order, each with a factor
        ``1 + uniform(-x, x)``.
    pca_noise : float, default 0
        AlexNet's PCA lighting noise, weights normal with this standard deviation.
    mean_r, mean_g, mean_b, std_r, std_g, std_b : float
        In pixel units (0..255), as ImageRecordIter's: ``(pixel - mean) / std``.
    num_parts, part_index : int
        Read only part ``part_index`` of ``num_parts`` (one per machine).
    preprocess_threads : int, optional
        Worker processes (``num_workers``); by default ``min(4, os.cpu_count())``.
    seed : int, optional
        Makes shuffling and augmentation reproducible for any number of workers.
    round_batch : bool, optional
        ``True``: every batch full, the records left over starting the next epoch
        (``last_batch='rollover'``); ``False``: a short last batch (``'keep'``). Not given:
        ``last_batch`` decides (Gluon's ``'keep'``). ``dataiter()`` always pads.
    data_name, label_name : str, default 'data', 'softmax_label'
        The names ``dataiter()`` gives the fields.
    dtype : {'float32', 'float16', 'float64', 'uint8', 'int8'}, optional
        The batch's dtype; ``'uint8'`` gives the pixels, not normalised, and ``'int8'`` the
        pixels less the mean, rounded and saturated, the std not applied (both as
        ImageRecordIter).
    output : {'float32', 'uint8', 'device'}, default 'float32'
        ``'uint8'`` leaves normalisation to ``shardloader.vision.normalize``. ``'device'``
        moves uint8 (4x fewer bytes) and normalises each batch after it is placed (on
        ``ctx=``'s devices, where the loader places it), so the loop receives float32.
    inter_method : int, default 1
        The interpolation code (0 nearest, 1 bilinear, 2 cubic, 3 area, 4 Lanczos, 9 by
        the sizes).
    **loader_kwargs
        Any other ``ShardedDataLoader`` argument (``last_batch``, ``ctx``, ``timeout``...);
        ImageRecordIter arguments whose step is not fused (``max_rotate_angle``,
        ``random_h``...) only at their no-effect values. Anything else is refused, by name.
    """

    def __init__(
        self,
        path_imgrec: str,
        path_imgidx: Optional[str] = None,
        data_shape: Sequence[int] = (3, 224, 224),
        batch_size: Optional[int] = None,
        shuffle: bool = False,
        rand_crop: bool = False,
        random_resized_crop: bool = False,
        min_random_area: float = 1.0,
        max_random_area: float = 1.0,
        max_aspect_ratio: float = 0.0,
        min_aspect_ratio: Optional[float] = None,
        rand_mirror: bool = False,
        resize: int = -1,
        mean_r: float = 0.0,
        mean_g: float = 0.0,
        mean_b: float = 0.0,
        std_r: float = 1.0,
        std_g: float = 1.0,
        std_b: float = 1.0,
        num_parts: int = 1,
        part_index: int = 0,
        preprocess_threads: Optional[int] = None,
        seed: Optional[int] = None,
        output: str = "float32",
        inter_method: int = 1,
        brightness: float = 0.0,
        contrast: float = 0.0,
        saturation: float = 0.0,
        pca_noise: float = 0.0,
        label_width: int = 1,
        round_batch: Optional[bool] = None,
        data_name: str = "data",
        label_name: str = "softmax_label",
        dtype: Optional[str] = None,
        **loader_kwargs: Any,
    ) -> None:
        given = dict(locals())  # every argument, taken by name below: spelled once
        door = loader_kwargs.pop("_door", "ImageRecordLoader")
        _check_arguments(door, loader_kwargs)
        for name in list(loader_kwargs):
            if name in _NOT_FUSED or name in _IGNORED:
                del loader_kwargs[name]
        if not _codecs.available():
            raise ImportError(f"{door} needs the image codecs: {_codecs.INSTALL_HINT}")
        if batch_size is None:
            raise TypeError(f"{door} needs batch_size=, got None")
        o = _DoorOptions(**arguments_for(_DoorOptions, given), door=door)
        channels, height, width = o.data_shape
        self._on_device = o.output == "device"
        self.pipeline = ImagePipeline(
            (width, height),
            resize=o.resize if o.resize > 0 else None,
            random_resized_crop=o.random_resized_crop,
            scale=(o.min_random_area, o.max_random_area),
            ratio=o.ratio,
            random_crop=o.rand_crop,
            center_crop=not (o.rand_crop or o.random_resized_crop),
            flip_left_right=o.rand_mirror,
            mean=(o.mean_r, o.mean_g, o.mean_b) if channels == 3 else o.mean_r,
            std=(o.std_r, o.std_g, o.std_b) if channels == 3 else o.std_r,
            output="uint8" if o.output == "device" else o.output,
            interpolation=o.inter_method,
            flag=1 if channels == 3 else 0,
            pixel_units=True,
            dtype=o.dtype if o.dtype not in (None, "uint8") else "float32",
            color_jitter=(o.brightness, o.contrast, o.saturation),
            lighting=o.pca_noise,
            crop_draws="image_record_iter",
        )
        if o.dtype == "int8":
            self.pipeline.lut = _int8_table(self.pipeline.mean, self.pipeline.channels)
        if o.output == "device":  # the loader's pipeline normalises each placed batch
            self.pipeline.on_device = PlacedNormalize(
                self.pipeline.mean, self.pipeline.std, pixel_units=True
            )
        records = ImageRecordDataset(o.path_imgrec, o.path_imgidx, flag=self.pipeline.flag)
        source, _ = _sources.source_of(records)
        # The loader's own options (batch_size, shuffle, seed, num_parts, part_index) pass
        # to it by name, as given; preprocess_threads and round_batch are its num_workers
        # and last_batch.
        super().__init__(
            FusedDataset(_Labels(source, o.label_width, o.path_imgrec), self.pipeline),
            batchify_fn=FusedBatchify(self.pipeline, _batchify.loader_default()),
            num_workers=o.preprocess_threads,
            last_batch=_last_batch(o.round_batch, loader_kwargs.pop("last_batch", None)),
            **arguments_for(LoaderOptions, given),
            **loader_kwargs,
        )
        self._data_shape = (channels, height, width)
        self._rows = batch_size
        self._label_width = o.label_width
        self._names = (o.data_name, o.label_name)

    def __getattr__(self, name: str) -> Any:
        if name in _DATAITER:
            raise AttributeError(
                f"'ImageRecordLoader' object has no attribute {name!r}: it is the loader for "
                f"a Gluon loop (for data, label in loader). For mx.io.DataIter's {name}, use "
                f"loader.dataiter(), or vision.image_record_iter(...) in place of "
                f"mx.io.ImageRecordIter(...)"
            )
        raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")

    def dataiter(self, data_name: Optional[str] = None, label_name: Optional[str] = None):
        """An ``mx.io.DataIter`` over this loader for ``Module.fit``, with ImageRecordIter's
        ``provide_data``, ``provide_label`` (``(batch_size,)`` or ``(batch_size,
        label_width)``), names (``data_name``, ``label_name``) and a full last batch whose
        ``getpad()`` counts its filler rows (``shardloader.dataiter.LoaderDataIter``)."""
        import mxnet as mx

        uint8 = self.pipeline.output == "uint8" and not self._on_device
        dtype = np.uint8 if uint8 else self.pipeline.dtype.type
        n, width = self._rows, self._label_width
        return LoaderDataIter(
            self,
            provide_data=[
                mx.io.DataDesc(data_name or self._names[0], (n, *self._data_shape), dtype)
            ],
            provide_label=[
                mx.io.DataDesc(
                    label_name or self._names[1], (n,) if width == 1 else (n, width), np.float32
                )
            ],
            batch_size=n,
        )


def image_record_iter(*args: Any, **kwargs: Any):
    """The one-line replacement for ``mx.io.ImageRecordIter(...)``: the same arguments (see
    ``ImageRecordLoader``), an ``mx.io.DataIter`` with ``provide_data``, ``provide_label``,
    ``reset``, ``iter_next``, ``getdata``, ``getlabel`` and ``getpad``.

    Every epoch has ``ceil(records / batch_size)`` batches; the last is filled to
    ``batch_size`` and ``getpad()`` counts its filler rows, with ``round_batch`` True or
    False (docs/vision.md says how that differs from ImageRecordIter)."""
    kwargs.setdefault("_door", "image_record_iter")
    round_batch = kwargs.pop("round_batch", True)
    check_bool("round_batch", round_batch)
    if kwargs.get("last_batch", "keep") != "keep":
        raise ValueError(
            f"image_record_iter pads the last batch (round_batch); last_batch="
            f"{kwargs['last_batch']!r} is for ImageRecordLoader"
        )
    return ImageRecordLoader(*args, **kwargs).dataiter()
