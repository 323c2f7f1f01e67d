"""``ImagePipeline``: an image pipeline described by its parameters.

A pipeline is a list of steps on uint8 HWC pixels (``_ops``' geometric ones, ``_color``'s
jitters; each keeps the ``_step.Step`` contract, which ``render`` and the decode floor ask
instead of testing classes), then an output stage applied as each image is written into
the batch: ToTensor and Normalize (float32 NCHW, through one lookup table per channel), or
uint8 NCHW for normalising on the device, or uint8 NHWC as decoded.
"""

from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from . import _codecs, _color, _ops, _region, _scratch, _write
from ._step import Step

OUTPUTS = ("float32", "uint8", "hwc")


def _channels(value: Any, where: str) -> Tuple[float, ...]:
    """Per-channel numbers from a number or a sequence of them."""
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return (float(value),)
    try:
        values = tuple(float(v) for v in np.asarray(value, dtype=np.float64).ravel())
    except (TypeError, ValueError):
        raise ValueError(
            f"{where} must be a number or a sequence of numbers, got {value!r}"
        ) from None
    if not values:
        raise ValueError(f"{where} must not be empty, got {value!r}")
    return values


class ImagePipeline:
    """Decode, crop, resize, flip and normalise images in the loader's workers.

    The steps run in this order, each only if asked for: ``resize`` (the shorter edge, or a
    ``(width, height)``), then one crop (``random_resized_crop``, ``random_crop`` or
    ``center_crop``, each to ``size``), then the flips; then, as each image is written into
    the batch, ToTensor and Normalize. The semantics and random draws are those of Gluon's
    transforms of the same names (docs/vision.md).

    Parameters
    ----------
    size : int or (width, height), optional
        The output size of the crop. Required by the crops.
    resize : int or (width, height), optional
        An int resizes the shorter edge to it (``Resize(resize, keep_ratio=True)``); a pair
        resizes to exactly that.
    random_resized_crop : bool, default False
        Gluon's ``RandomResizedCrop(size, scale, ratio)``.
    scale, ratio : (float, float)
        The area fraction and the aspect-ratio range of ``random_resized_crop``.
    random_crop : bool, default False
        A ``size`` crop at a random position (ImageRecordIter's ``rand_crop``).
    center_crop : bool, default False
        Gluon's ``CenterCrop(size)``.
    flip_left_right, flip_top_bottom : bool, default False
        Flip with probability 0.5.
    mean, std : float or sequence of float
        Normalize's per-channel mean and std, in ToTensor's units (0..1) unless
        ``pixel_units=True`` (0..255, as ``mx.io.ImageRecordIter``'s ``mean_r``...).
    output : {'float32', 'uint8', 'hwc'}, default 'float32'
        ``'float32'``: NCHW, ``(pixel / 255 - mean) / std``, what ``ToTensor()`` then
        ``Normalize(mean, std)`` give. ``'uint8'``: NCHW pixels, to normalise on the device
        with ``shardloader.vision.normalize`` (4x fewer bytes). ``'hwc'``: uint8 NHWC pixels,
        what the steps give with no ToTensor.
    interpolation : int, default 1
        OpenCV's (and ``mx.image``'s) code: 0 nearest, 1 bilinear, 2 cubic, 3 area, 4 Lanczos.
    flag : {1, 0}, default 1
        1 decodes to RGB, 0 to one grey channel.
    scaled_decode : bool, default True
        Let libjpeg-turbo decode at 1/2, 1/4 or 1/8 scale when a random crop would be
        shrunk at least that much anyway. The crop box is drawn at full size first, so the
        random draws are unchanged; the pixels differ slightly from a full-size decode.
    pixel_units : bool, default False
        Read ``mean`` and ``std`` in pixel units (0..255) and skip ToTensor's division.
    dtype : str, default 'float32'
        The dtype of a ``'float32'`` output (``Cast`` after Normalize).
    color_jitter : (brightness, contrast, saturation), optional
        After the crop, Gluon's ``RandomColorJitter(brightness, contrast, saturation)``: the
        adjustments in a random order, each with a factor ``1 + uniform(-x, x)``
        (ImageRecordIter's ``brightness``, ``contrast``, ``saturation``).
    lighting : float, default 0
        Then Gluon's ``RandomLighting(lighting)``, AlexNet's PCA noise (ImageRecordIter's
        ``pca_noise``).
    crop_draws : {'gluon', 'image_record_iter'}, default 'gluon'
        Whose ``random_resized_crop`` draws: Gluon's (aspect ratio log-uniform in ``ratio``)
        or ``mx.io.ImageRecordIter``'s (uniform, then width and height swapped with
        probability 0.5; ``_ops.RecordIterResizedCrop``).

    Examples
    --------
    >>> from shardloader.vision import ImagePipeline
    >>> p = ImagePipeline(size=224, random_resized_crop=True, flip_left_right=True,
    ...                   mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    >>> [type(step).__name__ for step in p.steps]
    ['RandomResizedCrop', 'Flip']
    """

    def __init__(
        self,
        size: Any = None,
        *,
        resize: Any = None,
        random_resized_crop: bool = False,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
        random_crop: bool = False,
        center_crop: bool = False,
        flip_left_right: bool = False,
        flip_top_bottom: bool = False,
        mean: Any = 0.0,
        std: Any = 1.0,
        output: str = "float32",
        interpolation: int = 1,
        flag: int = 1,
        scaled_decode: bool = True,
        pixel_units: bool = False,
        dtype: str = "float32",
        color_jitter: Optional[Sequence[float]] = None,
        lighting: float = 0.0,
        crop_draws: str = "gluon",
    ) -> None:
        if crop_draws not in ("gluon", "image_record_iter"):
            raise ValueError(
                f"crop_draws must be 'gluon' or 'image_record_iter', got {crop_draws!r}"
            )
        steps: List[Step] = []
        if resize is not None:
            keep = isinstance(resize, (int, np.integer)) and not isinstance(resize, bool)
            steps.append(_ops.Resize(resize, keep, interpolation, auto=True))
        crops = [
            n
            for n, on in (
                ("random_resized_crop", random_resized_crop),
                ("random_crop", random_crop),
                ("center_crop", center_crop),
            )
            if on
        ]
        if len(crops) > 1:
            raise ValueError(f"ask for one crop at most, got {' and '.join(crops)}")
        if crops and size is None:
            raise ValueError(f"{crops[0]} needs size=, got size=None")
        if random_resized_crop:
            gluon = crop_draws == "gluon"
            kind = _ops.RandomResizedCrop if gluon else _ops.RecordIterResizedCrop
            steps.append(kind(size, scale, ratio, interpolation))
        elif random_crop:
            steps.append(_ops.RandomCrop(size, interpolation))
        elif center_crop:
            steps.append(_ops.CenterCrop(size, interpolation))
        elif size is not None:
            steps.append(_ops.Resize(size, interpolation=interpolation))
        if color_jitter is not None and any(color_jitter):
            steps.append(_color.ColorJitter(*color_jitter))
        if lighting:
            steps.append(_color.Lighting(lighting))
        if flip_left_right:
            steps.append(_ops.Flip(1))
        if flip_top_bottom:
            steps.append(_ops.Flip(0))
        self._setup(steps, output, mean, std, flag, scaled_decode, pixel_units, dtype)

    #: What the loader runs on each placed batch (``Fusion.on_device``): ``None``, or
    #: ``device.PlacedNormalize`` for ``ImageRecordLoader(output='device')``.
    on_device: Optional[Callable[[Any], Any]] = None

    @classmethod
    def from_steps(
        cls,
        steps: Sequence[Step],
        *,
        output: str = "float32",
        mean: Any = 0.0,
        std: Any = 1.0,
        flag: int = 1,
        scaled_decode: bool = True,
        dtype: str = "float32",
    ) -> ImagePipeline:
        """A pipeline of already built steps (what ``fuse`` recognised in a Gluon chain)."""
        self = cls.__new__(cls)
        self._setup(list(steps), output, mean, std, flag, scaled_decode, False, dtype)
        return self

    def _setup(self, steps, output, mean, std, flag, scaled_decode, pixel_units, dtype) -> None:
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        if flag not in (0, 1):
            raise ValueError(f"flag must be 1 (colour) or 0 (grey), got {flag!r}")
        self.steps = steps
        self.output = output
        self.flag = flag
        self.channels = 3 if flag else 1
        self.scaled_decode = bool(scaled_decode)
        self.mean = _channels(mean, "mean")
        self.std = _channels(std, "std")
        for name, values in (("mean", self.mean), ("std", self.std)):
            if len(values) not in (1, self.channels):
                raise ValueError(
                    f"{name} must have 1 or {self.channels} values for {self.channels}-channel "
                    f"images, got {len(values)}"
                )
        if 0.0 in self.std:
            raise ValueError(f"std must not contain 0, got {self.std}")
        self.dtype = np.dtype(dtype)
        self.lut = self._table(pixel_units)

    def _table(self, pixel_units: bool) -> np.ndarray:
        """One float32 row per channel: ``lut[c, v]`` is pixel value ``v`` after ToTensor and
        Normalize, computed in float32 as MXNet's operators compute it."""
        values = np.arange(256, dtype=np.float32)
        if not pixel_units:
            values = values / np.float32(255.0)
        mean = np.resize(np.asarray(self.mean, np.float32), self.channels)
        std = np.resize(np.asarray(self.std, np.float32), self.channels)
        return ((values[None, :] - mean[:, None]) / std[:, None]).astype(np.float32)

    @property
    def random(self) -> bool:
        """Whether any step draws random numbers."""
        return any(step.random for step in self.steps)

    def draw(self, height: int, width: int) -> Tuple[list, Optional[Tuple[float, float]]]:
        """Every step's parameters for an image of ``height`` x ``width``, and how small a
        scaled decode may be, as fractions of the full height and width (``None``: decode at
        full size)."""
        params = []
        for step in self.steps:
            params.append(step.draw(height, width))
            height, width = step.size(height, width, params[-1])
        return params, self._decode_floor(params)

    def _decode_floor(self, params: list) -> Optional[Tuple[float, float]]:
        """How small the decoded image may be (fractions of the full size), where the first
        step can start from a reduced decode (``Step.decode_floor``)."""
        if not self.scaled_decode or not self.steps:
            return None
        return self.steps[0].decode_floor(params[0])

    def render(
        self, pixels: np.ndarray, params: list, full: Tuple[int, int]
    ) -> Tuple[np.ndarray, _write.Flips]:
        """Apply the steps to decoded uint8 HWC ``pixels``; the result, and the flips left to
        the write into the batch (``_write``). ``full`` is the image's size at full scale: a
        smaller ``pixels`` came from a scaled decode, and the first step's box is scaled to
        it."""
        steps = self.steps
        if pixels.shape[0] != full[0] or pixels.shape[1] != full[1]:
            pixels = steps[0].apply_reduced(pixels, params[0], full)
            steps, params = steps[1:], params[1:]
        # Steps that fold into the write (flips) are left to it: the write flips as it
        # copies, where flipping here would copy the image once more.
        flip_x = flip_y = False
        for step, value in zip(steps, params):
            if step.folds_into_write:
                left_right, top_bottom = step.write_flip(value)
                flip_x ^= left_right
                flip_y ^= top_bottom
                continue
            pixels = _ops.Flip.flipped(pixels, flip_x, flip_y)
            flip_x = flip_y = False
            pixels = step.apply(pixels, value)
        return pixels, (flip_x, flip_y)

    def output_shape(self, height: int, width: int, params: list) -> Tuple[int, int, int]:
        """The HWC shape ``render`` gives for an image of ``height`` x ``width``."""
        for step, value in zip(self.steps, params):
            height, width = step.size(height, width, value)
        return height, width, self.channels

    def decode(
        self,
        data: Any,
        size: Tuple[int, int],
        floor: Optional[Tuple[float, float]],
        params: Optional[list] = None,
    ):
        """Decode a JPEG of ``size`` (height, width) at the smallest scale ``floor`` allows;
        at full scale, only the box the first step reads (``Step.decode_region`` for
        ``params[0]``) where region decode is available (``_region``): the rest of the
        returned full-size array is then stale, and no step reads it."""
        if floor is None and params and self.steps and _region.available():
            box = self.steps[0].decode_region(params[0])
            if box is not None:
                out = _scratch.buffer("decoded", (size[0], size[1], self.channels))
                try:
                    _region.decode(data, self.flag, size, box, out)
                    return out
                except ValueError:
                    pass  # decoded whole below, which raises what a user would see
        min_size = None
        if floor is not None:
            min_size = (math.ceil(size[0] * floor[0]), math.ceil(size[1] * floor[1]))
        return _codecs.decode_jpeg(data, self.flag, min_size)

    def __repr__(self) -> str:
        steps = ", ".join(type(s).__name__ for s in self.steps)
        return f"ImagePipeline([{steps}], output={self.output!r}, flag={self.flag})"
