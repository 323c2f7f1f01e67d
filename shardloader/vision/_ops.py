"""The geometric steps of an image pipeline, with the semantics of MXNet 1.9.1's ``mx.image``.

Each step works in two halves, so that the random draws happen where the loader seeds them
(in ``__getitem__``, docs/design.md invariant 5) and the pixel work where it is cheapest (in
batchify, straight into the batch):

- ``draw(height, width)``: the step's parameters for an image of that size, drawn from
  Python's ``random`` with the calls ``mx.image`` makes, in the same order;
- ``apply(pixels, params)``: the step on uint8 HWC pixels (OpenCV's ``cv2.resize``, whose
  interpolation codes ``mx.image`` passes through: 0 nearest, 1 bilinear, 2 cubic, 3 area,
  4 Lanczos; 9 picks one from the sizes as ``mx.image`` does);
- ``size(height, width, params)``: the image size after the step.

Each keeps ``_step.Step``, the contract ``ImagePipeline`` asks instead of testing classes:
``Flip`` folds into the final write, and the random crops can start from a reduced decode.
"""

from __future__ import annotations

import math
import random
from typing import Any, Optional, Tuple

import numpy as np

from . import _codecs
from ._step import StepBase

Box = Tuple[int, int, int, int]  # x0, y0, width, height
_INTERPOLATIONS = (0, 1, 2, 3, 4)


def check_interpolation(value: Any, where: str, auto: bool = False) -> int:
    """``value`` as an interpolation code, or a ``ValueError`` naming ``where``."""
    allowed = _INTERPOLATIONS + ((9,) if auto else ())
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value not in allowed:
        raise ValueError(f"{where} must be one of {allowed}, got {value!r}")
    return int(value)


def pair(value: Any, where: str) -> Tuple[int, int]:
    """A ``(width, height)`` size from an int or a pair of positive ints."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value, value)
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value)
        or min(value) <= 0
    ):
        raise ValueError(f"{where} must be a positive int or a (width, height) pair, got {value!r}")
    return int(value[0]), int(value[1])


def _pick_interpolation(interp: int, height: int, width: int, new_h: int, new_w: int) -> int:
    """``mx.image._get_interp_method`` for the codes we accept (9: by the sizes)."""
    if interp != 9:
        return interp
    if new_h > height and new_w > width:
        return 2
    if new_h < height and new_w < width:
        return 3
    return 1


def resize(pixels: np.ndarray, width: int, height: int, interp: int) -> np.ndarray:
    """``cv2.resize`` that keeps the channel axis of a one-channel image."""
    cv2 = _codecs.loaded()[1]
    out = cv2.resize(pixels, (width, height), interpolation=interp)
    return out[:, :, None] if out.ndim == 2 else out


def _crop_resize(pixels: np.ndarray, box: Box, size: Tuple[int, int], interp: int) -> np.ndarray:
    """``mx.image.fixed_crop``: crop ``box``, then resize to ``size`` (width, height) unless
    the crop already has that size."""
    x0, y0, w, h = box
    out = pixels[y0 : y0 + h, x0 : x0 + w]
    if (w, h) != size:
        method = _pick_interpolation(interp, h, w, size[1], size[0])
        out = resize(out, size[0], size[1], method)
    return out


def crop_scaled(
    pixels: np.ndarray, box: Box, size: Tuple[int, int], full: Tuple[int, int]
) -> np.ndarray:
    """The bilinear ``size`` (width, height) resize of ``box``, a box of the full-size image
    (``full``: height, width), sampled from ``pixels``, a reduced-scale decode of it.

    The box rarely falls on whole pixels of the reduced image, so instead of cropping there
    (up to half a reduced pixel, several full pixels, off) the output samples the reduced
    image through the affine map that takes an output pixel's centre to the full-size point
    ``cv2.resize`` would sample, expressed in reduced coordinates.
    """
    cv2 = _codecs.loaded()[1]
    x0, y0, w, h = box
    sx, sy = pixels.shape[1] / full[1], pixels.shape[0] / full[0]
    out_w, out_h = size
    # full-size x = x0 + (u + 0.5) * w / out_w - 0.5; reduced = (full + 0.5) * sx - 0.5
    matrix = np.array(
        [
            [w / out_w * sx, 0.0, (x0 + 0.5 * w / out_w) * sx - 0.5],
            [0.0, h / out_h * sy, (y0 + 0.5 * h / out_h) * sy - 0.5],
        ]
    )
    src = pixels[:, :, 0] if pixels.shape[2] == 1 else pixels
    out = cv2.warpAffine(
        src,
        matrix,
        (out_w, out_h),
        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_REPLICATE,
    )
    return out[:, :, None] if out.ndim == 2 else out


def _scale_down(src_size: Tuple[int, int], size: Tuple[int, int]) -> Tuple[int, int]:
    """``mx.image.scale_down``: shrink a crop size to fit the image, keeping its aspect."""
    w, h = float(size[0]), float(size[1])
    sw, sh = src_size
    if sh < h:
        w, h = w * sh / h, sh
    if sw < w:
        w, h = sw, h * sw / w
    return int(w), int(h)


def _crop_floor(step: Any, box: Box) -> Optional[Tuple[float, float]]:
    """A random crop's reduced decode: the fractions of the full size the decode may shrink
    to and keep the output's resolution, or ``None`` when there is nothing to gain."""
    if step.interpolation != 1:
        return None  # the scaled crop samples bilinearly (``crop_scaled``)
    x0, y0, w, h = box
    out_w, out_h = step.target
    if w < 2 * out_w or h < 2 * out_h:
        return None  # libjpeg-turbo's smallest step is 1/2: nothing to gain
    return out_h / h, out_w / w


def _center_box(height: int, width: int, size: Tuple[int, int]) -> Box:
    new_w, new_h = _scale_down((width, height), size)
    return int((width - new_w) / 2), int((height - new_h) / 2), new_w, new_h


class Resize(StepBase):
    """Gluon's ``transforms.Resize``: to ``size`` (width, height), or with ``keep_ratio`` and
    an int size, the shorter edge to ``size``."""

    random = False

    def __init__(
        self, size: Any, keep_ratio: bool = False, interpolation: int = 1, auto: bool = False
    ) -> None:
        self.keep_ratio = bool(keep_ratio) and isinstance(size, (int, np.integer))
        self.short = int(size) if self.keep_ratio else None
        self.target = None if self.keep_ratio else pair(size, "Resize size")
        # ``auto``: 9 picks by the sizes (ImageRecordIter's resize; Gluon's Resize has no 9)
        self.interpolation = check_interpolation(interpolation, "Resize interpolation", auto)

    def draw(self, height: int, width: int) -> None:
        return None

    def size(self, height: int, width: int, params: Any) -> Tuple[int, int]:
        if self.target is not None:
            return self.target[1], self.target[0]
        short = self.short
        assert short is not None  # keep_ratio: a target or a short side, never neither
        if height > width:
            return height * short // width, short
        return short, width * short // height

    def apply(self, pixels: np.ndarray, params: Any) -> np.ndarray:
        height, width = self.size(pixels.shape[0], pixels.shape[1], None)
        method = _pick_interpolation(
            self.interpolation, pixels.shape[0], pixels.shape[1], height, width
        )
        return resize(pixels, width, height, method)


class CenterCrop(StepBase):
    """Gluon's ``transforms.CenterCrop`` (``mx.image.center_crop``): the centre ``size``
    crop, upsampled if the image is smaller."""

    random = False

    def __init__(self, size: Any, interpolation: int = 1) -> None:
        self.target = pair(size, "CenterCrop size")
        self.interpolation = check_interpolation(
            interpolation, "CenterCrop interpolation", auto=True
        )

    def draw(self, height: int, width: int) -> Box:
        return _center_box(height, width, self.target)

    def size(self, height: int, width: int, params: Any) -> Tuple[int, int]:
        return self.target[1], self.target[0]

    def apply(self, pixels: np.ndarray, params: Box) -> np.ndarray:
        return _crop_resize(pixels, params, self.target, self.interpolation)

    def decode_region(self, params: Box) -> Box:
        return params  # the crop reads its box alone


class FixedCrop(StepBase):
    """Gluon's ``transforms.CropResize``: the box ``(x, y, width, height)``, then optionally
    resized to ``size``."""

    random = False

    def __init__(self, box: Box, size: Optional[Any] = None, interpolation: int = 1) -> None:
        x0, y0, w, h = (int(v) for v in box)
        self.box: Box = (x0, y0, w, h)
        self.target = None if size is None else pair(size, "CropResize size")
        self.interpolation = check_interpolation(interpolation, "CropResize interpolation")

    def draw(self, height: int, width: int) -> Box:
        x0, y0, w, h = self.box
        if x0 < 0 or y0 < 0 or x0 + w > width or y0 + h > height:
            raise ValueError(
                f"CropResize box (x={x0}, y={y0}, width={w}, height={h}) does not fit an "
                f"image of {width}x{height}"
            )
        return self.box

    def size(self, height: int, width: int, params: Any) -> Tuple[int, int]:
        if self.target is None:
            return self.box[3], self.box[2]
        return self.target[1], self.target[0]

    decode_region = CenterCrop.decode_region

    def apply(self, pixels: np.ndarray, params: Box) -> np.ndarray:
        x0, y0, w, h = params
        out = pixels[y0 : y0 + h, x0 : x0 + w]
        if self.target is not None:
            out = resize(out, self.target[0], self.target[1], self.interpolation)
        return out


class RandomCrop(StepBase):
    """``mx.image.random_crop`` (ImageRecordIter's ``rand_crop``): a ``size`` crop at a
    uniformly drawn position, shrunk to fit a smaller image and resized back."""

    random = True

    def __init__(self, size: Any, interpolation: int = 1) -> None:
        self.target = pair(size, "RandomCrop size")
        self.interpolation = check_interpolation(
            interpolation, "RandomCrop interpolation", auto=True
        )

    def draw(self, height: int, width: int) -> Box:
        new_w, new_h = _scale_down((width, height), self.target)
        x0 = random.randint(0, width - new_w)
        y0 = random.randint(0, height - new_h)
        return x0, y0, new_w, new_h

    size = CenterCrop.size
    apply = CenterCrop.apply
    decode_region = CenterCrop.decode_region

    def decode_floor(self, params: Box) -> Optional[Tuple[float, float]]:
        return _crop_floor(self, params)

    def apply_reduced(self, pixels: np.ndarray, params: Box, full: Tuple[int, int]) -> np.ndarray:
        return crop_scaled(pixels, params, self.target, full)


class RandomResizedCrop(StepBase):
    """Gluon's ``transforms.RandomResizedCrop`` (``mx.image.random_size_crop``): an area
    uniform in ``scale`` of the image's, an aspect ratio log-uniform in ``ratio``, up to 10
    tries for a box that fits, else the centre crop; then resized to ``size``."""

    random = True

    def __init__(
        self,
        size: Any,
        scale: Any = (0.08, 1.0),
        ratio: Any = (3.0 / 4.0, 4.0 / 3.0),
        interpolation: int = 1,
    ) -> None:
        self.target = pair(size, "RandomResizedCrop size")
        if isinstance(scale, (int, float)) and not isinstance(scale, bool):
            scale = (scale, 1.0)
        self.scale = _range(scale, "RandomResizedCrop scale")
        self.ratio = _range(ratio, "RandomResizedCrop ratio")
        if self.ratio[0] <= 0:
            raise ValueError(f"RandomResizedCrop ratio must be positive, got {ratio!r}")
        self.interpolation = check_interpolation(
            interpolation, "RandomResizedCrop interpolation", auto=True
        )

    def draw(self, height: int, width: int) -> Box:
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = random.uniform(*self.scale) * area
            # numpy's exp, as Gluon draws it (libm's may differ in the last bit); then Python
            # floats: the same IEEE arithmetic and square root, without numpy's scalar cost.
            new_ratio = float(np.exp(random.uniform(*log_ratio)))
            new_w = int(round(math.sqrt(target_area * new_ratio)))
            new_h = int(round(math.sqrt(target_area / new_ratio)))
            if new_w <= width and new_h <= height:
                x0 = random.randint(0, width - new_w)
                y0 = random.randint(0, height - new_h)
                return x0, y0, new_w, new_h
        return _center_box(height, width, self.target)

    size = CenterCrop.size
    apply = CenterCrop.apply
    decode_region = CenterCrop.decode_region
    decode_floor = RandomCrop.decode_floor
    apply_reduced = RandomCrop.apply_reduced


class RecordIterResizedCrop(RandomResizedCrop):
    """``mx.io.ImageRecordIter``'s ``random_resized_crop``: an area uniform in ``scale`` of
    the image's, an aspect ratio (width / height) *uniform* in ``ratio``, then width and
    height swapped with probability 0.5; up to 10 tries, else the centre ``size`` crop. With
    ``scale`` and ``ratio`` both ``(1, 1)`` it makes no try (ImageRecordIter's skip)."""

    def draw(self, height: int, width: int) -> Box:
        if self.scale == (1.0, 1.0) and self.ratio == (1.0, 1.0):
            return _center_box(height, width, self.target)
        area = height * width
        for _ in range(10):
            target_area = random.uniform(*self.scale) * area
            ratio = random.uniform(*self.ratio)
            new_h = math.floor(math.sqrt(target_area / ratio) + 0.5)
            new_w = math.floor(math.sqrt(target_area * ratio) + 0.5)
            if random.random() > 0.5:
                new_w, new_h = new_h, new_w
            if new_w <= width and new_h <= height:
                y0 = random.randint(0, height - new_h)
                x0 = random.randint(0, width - new_w)
                return x0, y0, new_w, new_h
        return _center_box(height, width, self.target)


class Flip(StepBase):
    """Gluon's ``RandomFlipLeftRight`` (``axis=1``) and ``RandomFlipTopBottom``
    (``axis=0``): a flip with probability ``p``, by indexing."""

    random = True
    folds_into_write = True

    def __init__(self, axis: int, p: float = 0.5) -> None:
        self.axis = axis
        self.p = float(p)

    def draw(self, height: int, width: int) -> bool:
        return random.random() < self.p

    def write_flip(self, params: bool) -> Tuple[bool, bool]:
        return bool(params) and self.axis == 1, bool(params) and not self.axis

    def apply(self, pixels: np.ndarray, params: bool) -> np.ndarray:
        return self.flipped(pixels, bool(params) and self.axis == 1, bool(params) and not self.axis)

    @staticmethod
    def flipped(pixels: np.ndarray, left_right: bool, top_bottom: bool) -> np.ndarray:
        """``pixels`` flipped, as a view."""
        if left_right:
            pixels = pixels[:, ::-1]
        if top_bottom:
            pixels = pixels[::-1]
        return pixels


def _range(value: Any, where: str) -> Tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a (min, max) pair of numbers, got {value!r}") from None
    if not 0 <= low <= high:
        raise ValueError(f"{where} must be a (min, max) pair with 0 <= min <= max, got {value!r}")
    return low, high
