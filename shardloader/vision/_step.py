"""``Step``: the one contract every step of an ``ImagePipeline`` keeps.

A step declares what it is, and the pipeline asks it instead of testing its class (the model
is FFCV's ``Operation``, whose state and allocation each operation declares itself):

- ``random``: whether ``draw`` draws random numbers;
- ``draw(height, width)``: the step's parameters for an image of that size (in
  ``__getitem__``, where the loader seeds the draws);
- ``size(height, width, params)``: the image size after the step;
- ``apply(pixels, params)``: the step on uint8 HWC pixels;
- ``folds_into_write``: the step can be left to the final write into the batch (a flip,
  which the write into the batch makes as it copies, ``_write``); then ``write_flip(params)``
  says which flips it adds;
- ``decode_floor(params)``: where the step can start from a reduced-scale decode, the
  fractions ``(height, width)`` of the full size the decode may shrink to, else ``None``;
  then ``apply_reduced(pixels, params, full)`` applies it to such a decode.
- ``decode_region(params)``: where the step reads only a box of the image, that box
  ``(x0, y0, width, height)``, else ``None``: as the first step, it lets the decode skip
  the rest (``_region``).

``StepBase`` gives the defaults: not random, no fold, no reduced decode, no region.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Tuple

import numpy as np


class Step(Protocol):
    """What ``ImagePipeline`` asks of a step (module docstring)."""

    random: bool
    folds_into_write: bool

    def draw(self, height: int, width: int) -> Any: ...

    def size(self, height: int, width: int, params: Any) -> Tuple[int, int]: ...

    def apply(self, pixels: np.ndarray, params: Any) -> np.ndarray: ...

    def write_flip(self, params: Any) -> Tuple[bool, bool]: ...

    def decode_floor(self, params: Any) -> Optional[Tuple[float, float]]: ...

    def decode_region(self, params: Any) -> Optional[Tuple[int, int, int, int]]: ...

    def apply_reduced(
        self, pixels: np.ndarray, params: Any, full: Tuple[int, int]
    ) -> np.ndarray: ...


class StepBase:
    """The defaults of ``Step``: a deterministic step that keeps its size, folds nothing into
    the write and starts from a full-size decode."""

    random = False
    folds_into_write = False

    def size(self, height: int, width: int, params: Any) -> Tuple[int, int]:
        return height, width

    def write_flip(self, params: Any) -> Tuple[bool, bool]:
        return False, False

    def decode_floor(self, params: Any) -> Optional[Tuple[float, float]]:
        return None

    def decode_region(self, params: Any) -> Optional[Tuple[int, int, int, int]]:
        return None

    def apply_reduced(self, pixels: np.ndarray, params: Any, full: Tuple[int, int]) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} starts from a full-size decode")
