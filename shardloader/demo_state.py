"""The demo's checkpoint: network parameters, trainer states and the loader's position.

``state.json`` holds the loader's ``state_dict()`` and the options the run depends on. It is
written last, after the parameter and trainer files are in place, and names them with a
per-checkpoint tag, so a crash while saving leaves the previous checkpoint usable.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import mxnet as mx

__all__ = ["Checkpoint", "CheckpointMismatch"]

_VERSION = 1
_STATE = "state.json"


class CheckpointMismatch(ValueError):
    """The checkpoint was made with options that change the data or the model."""


class Checkpoint:
    """Save and restore a demo run in ``directory``.

    Parameters
    ----------
    directory : str
        Where the files go; created on the first save.
    config : dict
        The options a resumed run must share with the saved one (seed, sizes, ...).
    """

    def __init__(self, directory: str, config: Dict[str, Any]) -> None:
        self.directory = directory
        self.config = config

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def save(self, net: Any, trainer: Any, loader: Any) -> None:
        """Write the parameters, the trainer states and ``loader.state_dict()``."""
        os.makedirs(self.directory, exist_ok=True)
        position = loader.state_dict()
        tag = f"e{position['epoch']}-b{position['consumed']}"
        files = {"params": f"model-{tag}.params", "trainer": f"trainer-{tag}.states"}
        net.save_parameters(self._path(files["params"]))
        trainer.save_states(self._path(files["trainer"]))
        state = {"version": _VERSION, "config": self.config, "files": files, "loader": position}
        tmp = self._path(f"{_STATE}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1)
        old = self._read()
        os.replace(tmp, self._path(_STATE))
        if old is not None:  # the previous checkpoint's files, now that nothing points to them
            for name in old.get("files", {}).values():
                if name not in files.values() and os.path.exists(self._path(name)):
                    os.remove(self._path(name))

    def _read(self) -> Optional[Dict[str, Any]]:
        try:
            with open(self._path(_STATE), encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def load(self, net: Any, trainer: Any, loader: Any, ctx: List[mx.Context]) -> Optional[Dict]:
        """Restore ``net``, ``trainer`` and ``loader`` from the last save.

        Returns
        -------
        dict or None
            The saved state (``state["loader"]`` is the loader's position), or None when
            there is no checkpoint.

        Raises
        ------
        CheckpointMismatch
            When the checkpoint was saved with a different configuration.
        """
        state = self._read()
        if state is None:
            return None
        if state.get("version") != _VERSION:
            raise CheckpointMismatch(
                f"{self._path(_STATE)} has format version {state.get('version')!r}, "
                f"expected {_VERSION}; run without --resume to start over"
            )
        saved = state.get("config", {})
        changed = [k for k in self.config if saved.get(k) != self.config[k]]
        if changed:
            details = ", ".join(f"{k}: {saved.get(k)!r} -> {self.config[k]!r}" for k in changed)
            raise CheckpointMismatch(
                f"the checkpoint in {self.directory} was made with other options ({details}); "
                f"use the same options, or run without --resume to start over"
            )
        net.load_parameters(self._path(state["files"]["params"]), ctx=ctx)
        trainer.load_states(self._path(state["files"]["trainer"]))
        loader.load_state_dict(state["loader"])
        return state
