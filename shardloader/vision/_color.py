"""Colour jitters on uint8 RGB pixels, with the arithmetic of MXNet's image operators.

Gluon's ``RandomBrightness``, ``RandomContrast``, ``RandomSaturation``, ``RandomLighting``
and ``RandomColorJitter`` (without hue) call MXNet's C++ operators, which compute in float32 and
write uint8 by clamping to [0, 255] and truncating. These steps do the same, so for a given
factor the pixels are MXNet's own (measured under 1.9.1 and 2.0.0b1). The factors are drawn
from Python's ``random`` (MXNet draws from its own generator): the same distributions.

MXNet's saturation blends each pixel with ``0.114 * blue`` where the grey value
``0.299 R + 0.587 G + 0.114 B`` was meant (its loop assigns where it should add), in 1.9.1
and 2.0.0b1 alike. ``Saturation`` reproduces that, since the fused path gives Gluon's images.
"""

from __future__ import annotations

import random
from typing import List, Tuple

import numpy as np

from ._step import StepBase

_GREY = np.array([0.299, 0.587, 0.114], np.float32)


def _to_uint8(values: np.ndarray) -> np.ndarray:
    np.clip(values, 0, 255, out=values)
    return values.astype(np.uint8)


def brightness(pixels: np.ndarray, alpha: float) -> np.ndarray:
    return _to_uint8(pixels.astype(np.float32) * np.float32(alpha))


def contrast(pixels: np.ndarray, alpha: float) -> np.ndarray:
    values = pixels.astype(np.float32)
    mean = (values @ _GREY).mean(dtype=np.float32)
    return _to_uint8(values * np.float32(alpha) + np.float32(1 - alpha) * mean)


def saturation(pixels: np.ndarray, alpha: float) -> np.ndarray:
    values = pixels.astype(np.float32)
    grey = values[:, :, 2:3] * _GREY[2]  # MXNet's operator, as it computes (module docstring)
    return _to_uint8(values * np.float32(alpha) + np.float32(1 - alpha) * grey)


_ADJUST = {"brightness": brightness, "contrast": contrast, "saturation": saturation}


class Jitter(StepBase):
    """One of Gluon's ``RandomBrightness``/``RandomContrast``/``RandomSaturation``: a factor
    uniform in ``(low, high)``, Gluon's ``(max(0, 1 - x), 1 + x)``."""

    random = True

    def __init__(self, kind: str, low: float, high: float) -> None:
        self.kind, self.low, self.high = kind, float(low), float(high)

    def draw(self, height: int, width: int) -> float:
        return random.uniform(self.low, self.high)

    def apply(self, pixels: np.ndarray, alpha: float) -> np.ndarray:
        return _ADJUST[self.kind](pixels, alpha)


class ColorJitter(StepBase):
    """Gluon's ``RandomColorJitter(brightness, contrast, saturation)`` with ``hue=0``: the
    adjustments asked for, in a random order, each with a factor ``1 + uniform(-x, x)``."""

    random = True

    def __init__(self, brightness: float, contrast: float, saturation: float) -> None:
        self.amounts = [
            (kind, float(x))
            for kind, x in (
                ("brightness", brightness),
                ("contrast", contrast),
                ("saturation", saturation),
            )
            if x > 0
        ]

    def draw(self, height: int, width: int) -> List[Tuple[str, float]]:
        order = list(self.amounts)
        random.shuffle(order)
        return [(kind, 1.0 + random.uniform(-x, x)) for kind, x in order]

    def apply(self, pixels: np.ndarray, params: List[Tuple[str, float]]) -> np.ndarray:
        for kind, alpha in params:
            pixels = _ADJUST[kind](pixels, alpha)
        return pixels


# AlexNet's PCA of ImageNet's RGB values, as MXNet's adjust_lighting operator holds it.
_EIGVAL = np.array([55.46, 4.794, 1.148], np.float32)
_EIGVEC = np.array(
    [[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]],
    np.float32,
)


def lighting(pixels: np.ndarray, alpha: Tuple[float, float, float]) -> np.ndarray:
    """MXNet's ``adjust_lighting``: add ``eigvec @ (alpha * eigval)`` to every pixel."""
    shift = _EIGVEC @ (np.asarray(alpha, np.float32) * _EIGVAL)
    return _to_uint8(pixels.astype(np.float32) + shift)


class Lighting(StepBase):
    """Gluon's ``RandomLighting(alpha)``: AlexNet-style PCA noise, each of the three
    components' weight normal with standard deviation ``alpha``."""

    random = True

    def __init__(self, alpha: float) -> None:
        self.alpha = float(alpha)

    def draw(self, height: int, width: int) -> Tuple[float, float, float]:
        gauss = random.gauss
        return gauss(0.0, self.alpha), gauss(0.0, self.alpha), gauss(0.0, self.alpha)

    def apply(self, pixels: np.ndarray, alpha: Tuple[float, float, float]) -> np.ndarray:
        return lighting(pixels, alpha)
