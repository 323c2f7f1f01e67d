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
    """Sleeps ``seconds`` at index ``bad`` while ``flag_file`` exists. With ``wake=True``,
    removing the file also ends a sleep under way (within 50 ms), and ``sleeping`` counts
    the calls asleep in this process (a thread pool's: what a test waits on, instead of a
    fixed sleep)."""

    def __init__(
        self, n: int, bad: int, seconds: float, flag_file: str, wake: bool = False
    ) -> None:
        super().__init__(n)
        self.bad, self.seconds, self.flag_file, self.wake = bad, seconds, flag_file, wake
        self.sleeping = 0

    def __getitem__(self, i):
        if i == self.bad and os.path.exists(self.flag_file):
            if not self.wake:
                time.sleep(self.seconds)
                return super().__getitem__(i)
            self.sleeping += 1
            try:
                deadline = time.monotonic() + self.seconds
                while os.path.exists(self.flag_file) and time.monotonic() < deadline:
                    time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
            finally:
                self.sleeping -= 1
        return super().__getitem__(i)


class RandomAugDataset(RangeDataset):
    """Each sample draws from random, numpy and MXNet RNGs (an 'augmentation')."""

    def __getitem__(self, i):
        return np.array(
            [i, random.random(), np.random.rand(), mx.nd.random.uniform().asscalar()],
            dtype=np.float64,
        )


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


class WorkerInfoDataset(RangeDataset):
    """Sample i reports what ``get_worker_info()`` says where it is loaded:
    ``[i, id, num_workers, seed (-1 for None), info.dataset is self, len(info.dataset)]``,
    or ``[i, -1, 0, -1, 0, 0]`` when it returns None."""

    def __getitem__(self, i):
        from shardloader import get_worker_info

        info = get_worker_info()
        if info is None:
            return np.array([i, -1, 0, -1, 0, 0], dtype=np.int64)
        seed = -1 if info.seed is None else info.seed
        row = [i, info.id, info.num_workers, seed, info.dataset is self, len(info.dataset)]
        return np.array(row, dtype=np.int64)


class RecordingInit:
    """A ``worker_init_fn`` that writes one JSON file per call: its argument, what
    ``get_worker_info()`` says, and its first draws from ``numpy.random`` and ``random``."""

    def __init__(self, directory) -> None:
        self.directory = str(directory)

    def __call__(self, worker_id: int) -> None:
        import json
        import threading

        from shardloader import get_worker_info

        info = get_worker_info()
        record = {
            "worker_id": worker_id,
            "info": None if info is None else [info.id, info.num_workers, info.seed],
            "np": float(np.random.rand()),
            "py": random.random(),
        }
        name = f"{os.getpid()}-{threading.get_ident()}-{worker_id}.json"
        with open(os.path.join(self.directory, name), "w") as f:
            json.dump(record, f)

    @staticmethod
    def read(directory):
        import json

        records = []
        for name in sorted(os.listdir(directory)):
            with open(os.path.join(directory, name)) as f:
                records.append(json.load(f))
        return sorted(records, key=lambda r: r["worker_id"])


class NoisyClassification:
    """A fixed 2-class problem whose samples get noise from ``np.random`` (an augmentation):
    sample i is (float32 features of width ``dim``, int32 label)."""

    def __init__(self, n: int, dim: int = 6, seed: int = 0) -> None:
        rng = np.random.RandomState(seed)
        self.y = rng.randint(0, 2, size=n).astype(np.int32)
        centres = rng.randn(2, dim)
        self.x = (centres[self.y] + rng.randn(n, dim)).astype(np.float32)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        noise = 0.1 * np.random.randn(self.x.shape[1])
        return (self.x[i] + noise).astype(np.float32), self.y[i]


class RandomAugExitOnce(RandomAugDataset):
    """RandomAugDataset whose worker process dies (``os._exit``) the first time it loads
    index ``bad``; ``once_file`` remembers that it happened."""

    def __init__(self, n: int, bad: int, once_file: str) -> None:
        super().__init__(n)
        self.bad, self.once_file = bad, once_file
        self.parent = os.getpid()

    def __getitem__(self, i):
        if i == self.bad and os.getpid() != self.parent and not os.path.exists(self.once_file):
            open(self.once_file, "w").close()
            os._exit(7)
        return super().__getitem__(i)
