"""Child process for test_resume: build a loader, load a saved state, save what it yields.

    python resume_child.py CONFIG.json

CONFIG holds ``dataset`` (a class name in tests/_datasets.py), ``dataset_args``, ``loader``
(keyword arguments of ShardedDataLoader), ``state`` (a JSON file from ``state_dict()``),
``epochs`` (how many iterations to run after loading) and ``out`` (an .npz to write). Array
``e{epoch}_b{batch}_l{leaf}`` is leaf ``leaf`` of batch ``batch`` of the ``epoch``-th
iteration after the resume.
"""

from __future__ import annotations

import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)

import _datasets  # noqa: E402
import numpy as np  # noqa: E402

from shardloader import ShardedDataLoader  # noqa: E402


def leaves(batch):
    if isinstance(batch, (list, tuple)):
        return [leaf for item in batch for leaf in leaves(item)]
    return [batch.asnumpy() if hasattr(batch, "asnumpy") else np.asarray(batch)]


def main(config_path: str) -> None:
    with open(config_path) as f:
        config = json.load(f)
    dataset = getattr(_datasets, config["dataset"])(*config["dataset_args"])
    with open(config["state"]) as f:
        state = json.load(f)
    arrays = {}
    with ShardedDataLoader(dataset, **config["loader"]) as loader:
        loader.load_state_dict(state)
        for epoch in range(config["epochs"]):
            for b, batch in enumerate(loader):
                for leaf, array in enumerate(leaves(batch)):
                    arrays[f"e{epoch}_b{b:04d}_l{leaf}"] = array
    np.savez(config["out"], **arrays)


if __name__ == "__main__":
    main(sys.argv[1])
