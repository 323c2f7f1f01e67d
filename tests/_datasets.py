"""Module-level datasets for tests, so they pickle under the spawn start method."""

from __future__ import annotations

import os
import random
import time

import mxnet as mx
import numpy as np


class RangeDataset:
    """Sample i is (float32 vector filled with i, int label i)."""

    def __init__(self, n: int, width: int = 4) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return np.full((self.width,), i, dtype=np.float32), i


class ReverseSlowDataset(RangeDataset):
    """Later samples finish first: sample i sleeps longer the smaller i is."""

    def __getitem__(self, i):
        time.sleep(0.002 * (self.n - i) / self.n * 10)
        return super().__getitem__(i)


class FailingDataset(RangeDataset):
    """Raises for one index."""

    def __init__(self, n: int, bad: int, exc_type=KeyError) -> None:
        super().__init__(n)
        self.bad, self.exc_type = bad, exc_type

    def __getitem__(self, i):
        if i == self.bad:
            raise self.exc_type(f"sample {i} is broken")
        return super().__getitem__(i)


class ExitingDataset(RangeDataset):
    """Kills its worker process at one index (only inside a worker process)."""

    def __init__(self, n: int, bad: int, how: str = "exit", once_file: str = "") -> None:
        super().__init__(n)
        self.bad, self.how, self.once_file = bad, how, once_file
        self.parent = os.getpid()

    def __getitem__(self, i):
        first_time = not self.once_file or not os.path.exists(self.once_file)
        if i == self.bad and os.getpid() != self.parent and first_time:
            if self.once_file:
                open(self.once_file, "w").close()
            if self.how == "exit":
                os._exit(7)
            os.kill(os.getpid(), 9)
        return super().__getitem__(i)


class SleepyDataset(RangeDataset):
    """Sleeps ``seconds`` at index ``bad`` while ``flag_file`` exists."""

    def __init__(self, n: int, bad: int, seconds: float, flag_file: str) -> None:
        super().__init__(n)
        self.bad, self.seconds, self.flag_file = bad, seconds, flag_file

    def __getitem__(self, i):
        if i == self.bad and os.path.exists(self.flag_file):
            time.sleep(self.seconds)
        return super().__getitem__(i)


class RandomAugDataset(RangeDataset):
    """Each sample draws from random, numpy and MXNet RNGs (an 'augmentation')."""

    def __getitem__(self, i):
        return np.array([i, random.random(), np.random.rand(),
                         mx.nd.random.uniform().asscalar()], dtype=np.float64)


class ImageDataset:
    """uint8 'images' whose pixels encode the sample index."""

    def __init__(self, n: int, shape=(3, 32, 32)) -> None:
        self.n, self.shape = n, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return np.full(self.shape, i % 251, dtype=np.uint8), np.int32(i)


class VarLenDataset:
    """Variable-length int sequences: sample i has length 1 + i % 7."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return np.arange(1 + i % 7, dtype=np.int32) + i, i
