"""The demo's checkpoint: network parameters, trainer states and the loader's position.

``state.json`` holds the loader's ``state_dict()`` and the options the run depends on. It is
written last, after the parameter and trainer files are in place, and names them with a
per-checkpoint tag, so a crash while saving leaves the previous checkpoint usable.

The names in ``state.json`` are read back, and the next save deletes the files they name, so
they are trusted only when they are the file names this module writes
(``model-e<epoch>-b<step>.params`` and ``trainer-e<epoch>-b<step>.states``): plain names in
the checkpoint folder, never a path that leads out of it.

The trainer states are pickles (``Trainer.load_states`` unpickles them), so loading one runs
whatever code it holds. The demo therefore works only in folders that are the user's own and
that no one else can write to (``check_own_folder``), creates every file under an
unpredictable name with ``O_EXCL`` before moving it into place, and records each file's
SHA-256 in ``state.json``: a file that does not match is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from typing import Any, Callable, Dict, List, Optional

from .._compat import DeviceType
from .._folders import UnsafeFolder, check_own_folder, make_own_folder

__all__ = [
    "Checkpoint",
    "CheckpointMismatch",
    "CheckpointCorrupt",
    "UnsafeFolder",
    "check_own_folder",
    "make_own_folder",
]

# 2: each file's SHA-256 is recorded, and checked before the file is loaded.
_VERSION = 2
_STATE = "state.json"
# The only file names a checkpoint's state.json may hold, per kind of file.
_FILE_NAMES = {
    "params": (re.compile(r"model-e[0-9]+-b[0-9]+\.params"), "model-e<epoch>-b<step>.params"),
    "trainer": (re.compile(r"trainer-e[0-9]+-b[0-9]+\.states"), "trainer-e<epoch>-b<step>.states"),
}


class CheckpointMismatch(ValueError):
    """The checkpoint cannot be resumed: it was made with options that change the data or the
    model, or in another format."""


class CheckpointCorrupt(CheckpointMismatch):
    """``state.json`` is not a checkpoint this module wrote: unreadable, or naming files that
    are not checkpoint files in the checkpoint folder."""


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_new(directory: str, name: str, write: Callable[[str], None]) -> str:
    """Have ``write(path)`` fill a file created exclusively under an unpredictable name, then
    move it to ``name``; return its SHA-256."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        os.close(fd)
        write(tmp)  # MXNet opens the file by name: the one mkstemp made, no planted link
        digest = _sha256(tmp)
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return digest


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
        """Write the parameters, the trainer states and ``loader.state_dict()``.

        Raises
        ------
        CheckpointCorrupt
            When the ``state.json`` already in the folder is damaged or names files outside
            it; nothing is written or deleted then.
        UnsafeFolder
            When the folder is not the user's own, or others can write to it.
        """
        make_own_folder(self.directory, "checkpoint folder")
        old = self._read()
        # Checked before anything is written, and before any of them is deleted.
        old_files = None if old is None else self._files(old)
        position = loader.state_dict()
        tag = f"e{int(position['epoch'])}-b{int(position['consumed'])}"
        files = {"params": f"model-{tag}.params", "trainer": f"trainer-{tag}.states"}
        sha256 = {
            "params": _write_new(self.directory, files["params"], net.save_parameters),
            "trainer": _write_new(self.directory, files["trainer"], trainer.save_states),
        }
        state = {
            "version": _VERSION,
            "config": self.config,
            "files": files,
            "sha256": sha256,
            "loader": position,
        }
        # An unpredictable name, created exclusively: nothing planted in the folder is followed.
        fd, tmp = tempfile.mkstemp(prefix=f".{_STATE}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(state, f, indent=1)
            os.replace(tmp, self._path(_STATE))
        except BaseException:
            os.unlink(tmp)
            raise
        if old_files is not None:  # the previous checkpoint's, now that nothing points to them
            for name in old_files.values():
                if name not in files.values() and os.path.exists(self._path(name)):
                    os.remove(self._path(name))

    def _corrupt(self, problem: str) -> CheckpointCorrupt:
        return CheckpointCorrupt(
            f"{self._path(_STATE)}: {problem}, so it was not written by this demo; delete "
            f"{self.directory} to start over"
        )

    def _read(self) -> Optional[Dict[str, Any]]:
        """The saved state, or None when there is none."""
        try:
            with open(self._path(_STATE), encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # ValueError: bad JSON or bad UTF-8
            raise self._corrupt(f"cannot be read ({exc})") from exc
        if not isinstance(state, dict):
            raise self._corrupt(f"holds a {type(state).__name__}, not an object")
        return state

    def _files(self, state: Dict[str, Any]) -> Dict[str, str]:
        """The checkpoint's file names, each checked to be a plain name of the right form."""
        files = state.get("files")
        if not isinstance(files, dict) or set(files) != set(_FILE_NAMES):
            raise self._corrupt(
                f"'files' must map {' and '.join(map(repr, _FILE_NAMES))} to file names, "
                f"not {files!r}"
            )
        for kind, name in files.items():
            pattern, form = _FILE_NAMES[kind]
            if not isinstance(name, str) or not pattern.fullmatch(name):
                raise self._corrupt(
                    f"its {kind} file {name!r} is not a checkpoint file in {self.directory} "
                    f"(a plain name of the form {form})"
                )
        return files

    def load(self, net: Any, trainer: Any, loader: Any, ctx: List[DeviceType]) -> Optional[Dict]:
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
        CheckpointCorrupt
            When ``state.json`` is damaged, names files outside the checkpoint folder, or a
            file's SHA-256 differs from the one recorded when the demo wrote it.
        UnsafeFolder
            When the folder is not the user's own, or others can write to it.
        """
        if not os.path.lexists(self.directory):
            return None
        check_own_folder(self.directory, "checkpoint folder")
        state = self._read()
        if state is None:
            return None
        saved = state.get("config")
        saved = saved if isinstance(saved, dict) else {}
        changed = [k for k in self.config if saved.get(k) != self.config[k]]
        if changed:
            details = ", ".join(f"{k}: {saved.get(k)!r} -> {self.config[k]!r}" for k in changed)
            raise CheckpointMismatch(
                f"the checkpoint in {self.directory} was made with other options ({details}); "
                f"use the same options, or run without --resume to start over"
            )
        if state.get("version") != _VERSION:
            raise CheckpointMismatch(
                f"{self._path(_STATE)} has format version {state.get('version')!r}, "
                f"expected {_VERSION}; run without --resume to start over"
            )
        files = self._files(state)
        self._verify(state, files)
        net.load_parameters(self._path(files["params"]), ctx)  # 2.x calls it device=
        trainer.load_states(self._path(files["trainer"]))  # a pickle: verified just above
        loader.load_state_dict(state["loader"])
        return state

    def _verify(self, state: Dict[str, Any], files: Dict[str, str]) -> None:
        """Check each file against the SHA-256 recorded when the demo wrote it."""
        recorded = state.get("sha256")
        if not isinstance(recorded, dict):
            raise self._corrupt("it records no SHA-256 of its files")
        for kind, name in files.items():
            path = self._path(name)
            try:
                actual = _sha256(path)
            except OSError as exc:
                raise self._corrupt(f"its {kind} file {name!r} cannot be read ({exc})") from exc
            if recorded.get(kind) != actual:
                raise CheckpointCorrupt(
                    f"{path} is not the file the demo wrote there (its SHA-256 differs from "
                    f"the one in {_STATE}), so it was not loaded; delete {self.directory} to "
                    f"start over"
                )

    def saved_position(self) -> Optional[Dict[str, int]]:
        """The loader position of the last save (``{"epoch", "consumed"}``), or None when
        there is none or it cannot be read; loads nothing."""
        try:
            state = self._read()
        except CheckpointCorrupt:
            return None
        position = None if state is None else state.get("loader")
        return position if isinstance(position, dict) else None
