"""Normalising uint8 batches where they are used: on the device, with MXNet's operators."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compat import device_of, to_device
from .pipeline import _channels


def normalize(batch: Any, mean: Any = 0.0, std: Any = 1.0, *, pixel_units: bool = False) -> Any:
    """ToTensor and Normalize for a uint8 NCHW batch, on the batch's own device.

    With ``output='uint8'`` the loader moves 4x fewer bytes, and the device does what the
    workers would have done: ``(batch / 255 - mean) / std`` per channel, in float32, equal
    to the workers' ``output='float32'`` within float rounding.

    Parameters
    ----------
    batch : NDArray or mx.np.ndarray
        uint8, shape ``(N, C, H, W)``, as an ``output='uint8'`` loader yields it (after
        ``ctx=`` placement, it is already on the device).
    mean, std : float or sequence of float
        Per channel, in ToTensor's units (0..1); in pixel units (0..255) with
        ``pixel_units=True``.

    Returns
    -------
    NDArray or mx.np.ndarray
        float32, same shape and device.

    Examples
    --------
    >>> import mxnet as mx
    >>> from shardloader.vision import normalize
    >>> x = mx.nd.array([[[[0, 255]]]], dtype='uint8')
    >>> normalize(x, mean=0.5, std=0.5).asnumpy()
    array([[[[-1.,  1.]]]], dtype=float32)
    """
    shape = getattr(batch, "shape", None)
    if shape is None or len(shape) != 4:
        raise ValueError(f"batch must be an (N, C, H, W) array, got shape {shape}")
    channels = shape[1]
    mean_v, std_v = _channels(mean, "mean"), _channels(std, "std")
    for name, values in (("mean", mean_v), ("std", std_v)):
        if len(values) not in (1, channels):
            raise ValueError(f"{name} must have 1 or {channels} values, got {len(values)}")
    scale = 1.0 if pixel_units else 255.0
    # (x / 255 - m) / s == x * (1 / (255 s)) - m / s: one multiply-add per value.
    mul = np.resize(1.0 / (scale * np.asarray(std_v, np.float64)), channels)
    add = np.resize(-np.asarray(mean_v, np.float64) / np.asarray(std_v, np.float64), channels)
    return _affine(batch, mul, add)


class PlacedNormalize:
    """``output='device'``: a placed batch's images (its first field) normalised where they
    are, with ``normalize``; the loader's pipeline runs it after placement (``_pipeline``)."""

    def __init__(self, mean: Any, std: Any, pixel_units: bool) -> None:
        self.mean, self.std, self.pixel_units = mean, std, pixel_units

    def __call__(self, batch: Any) -> Any:
        data, *rest = batch
        return [normalize(data, self.mean, self.std, pixel_units=self.pixel_units), *rest]


def _affine(batch: Any, mul: np.ndarray, add: np.ndarray) -> Any:
    """``batch * mul + add`` per channel, as float32 on the batch's device."""
    import mxnet as mx

    device = device_of(batch)
    # 2.x's mx.np.ndarray is also an mx.nd.NDArray: ask for it first.
    legacy = not (hasattr(mx, "np") and isinstance(batch, mx.np.ndarray))
    make = mx.nd.array if legacy else mx.np.array
    shape = (1, len(mul), 1, 1)
    mul_a = to_device(make(mul.astype(np.float32).reshape(shape), dtype="float32"), device)
    add_a = to_device(make(add.astype(np.float32).reshape(shape), dtype="float32"), device)
    values = batch.astype("float32")
    if legacy:
        return mx.nd.broadcast_add(mx.nd.broadcast_mul(values, mul_a), add_a)
    return values * mul_a + add_a
