"""The fused path's C helpers: each built from a C file of this package, once, and called
through ``ctypes`` (which releases the GIL).

Two libraries use it: ``_region`` (decoding only the crop's box of a JPEG, linked against
the system's libjpeg-turbo) and ``_write`` (an image into its planes of the batch in one
pass). No Python package offers either, so a ``Library`` compiles its C file with the
system's C compiler (``$CC``, else ``cc``) into ``~/.cache/shardloader/NAME-<hash>.so``
(``$XDG_CACHE_HOME`` is honoured), named by the source's hash so that a changed source gets a
new build. ``recognise.fuse`` builds every library when it makes a fused pipeline, in the
loader's main process before its workers start (``build_all``); a worker only loads a build,
never makes one, so a machine without a compiler pays for one failed build, not one per
worker.

Each is optional: without a compiler or the headers it needs, or with its switch set to
``0`` in the environment, ``available()`` is False, ``why_unavailable()`` says why, and the
caller takes its OpenCV and simplejpeg path, which gives the same pixels (docs/vision.md,
"Compiled helpers").
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
_COMPILE_TIMEOUT_S = 60.0

#: One C function: its name, its result type and its argument types.
Signature = Tuple[str, Any, Sequence[Any]]

_libraries: List[Library] = []


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shardloader")


class Library:
    """One C file of this package, built and loaded on demand.

    Parameters
    ----------
    name : str
        The C file's stem (``_region`` for ``_region.c``); without its underscore, it names
        the build (``region-<hash>.so``).
    label : str
        Its name in ``native()`` (``"region_decode"``).
    switch : str
        The environment variable that, set to ``0``, keeps the library off.
    libraries : sequence of str
        What to link against (``"jpeg"`` for ``-ljpeg``).
    functions : sequence of ``Signature``
        The functions to bind once loaded (``function(name)`` returns them).
    needs : str
        What building it needs, for the reason given when it fails ("a C compiler and
        libjpeg-turbo's headers").
    """

    def __init__(
        self,
        name: str,
        label: str,
        switch: str,
        libraries: Sequence[str],
        functions: Sequence[Signature],
        needs: str,
    ) -> None:
        self.source = os.path.join(_HERE, f"{name}.c")
        self.stem = name.lstrip("_")
        self.label = label
        self.switch = switch
        self.libraries = tuple(libraries)
        self.signatures = tuple(functions)
        self.needs = needs
        self.functions: Optional[Dict[str, Any]] = None  # bound once loaded
        self.reason: Optional[str] = None  # why it is off (None: on, or not tried yet)
        self._target: Optional[str] = None
        self._lock = threading.Lock()
        _libraries.append(self)

    def target(self) -> str:
        """The built library's path: the cache folder, named by the source's hash."""
        if self._target is None:
            with open(self.source, "rb") as f:
                digest = hashlib.sha256(f.read() + sys.platform.encode()).hexdigest()[:16]
            self._target = os.path.join(_cache_dir(), f"{self.stem}-{digest}.so")
        return self._target

    def available(self, build: bool = False) -> bool:
        """Whether the library is loaded: found built, or built now if ``build``. The answer
        is kept for the process (a library not found built is looked for again later)."""
        if self.functions is None and self.reason is None:
            with self._lock:
                if self.functions is None and self.reason is None:
                    self._load(build)
        return self.functions is not None

    def why_unavailable(self) -> Optional[str]:
        """Why ``available()`` is False: ``None`` when it is True, or when the library was
        only looked for, not built (``vision.fuse`` builds it: nothing here has asked yet)."""
        return self.reason

    def status(self) -> str:
        """``"on"``, or ``"off: "`` and why; builds the library if it is not built yet."""
        return "on" if self.available(build=True) else f"off: {self.reason}"

    def function(self, name: str) -> Any:
        """The bound C function ``name``; ``None`` when the library is not loaded."""
        functions = self.functions
        return None if functions is None else functions[name]

    def _load(self, build: bool) -> None:
        if os.environ.get(self.switch, "").strip() == "0":
            self.reason = f"{self.switch}=0"
            return
        try:
            target = self.target()
        except OSError as exc:  # an install without the C source
            self.reason = f"its source is missing ({exc})"
            return
        if not os.path.exists(target):
            if not build:
                return  # not built yet: asked again later (vision.fuse builds it)
            try:
                failed = self._compile(target)
            except OSError as exc:
                failed = f"its cache folder is not writable ({exc})"
            if failed is not None:
                self.reason = failed
                return
        # Its calls bind to the libraries it was linked against, not to another copy of
        # those symbols already in the process (MXNet's own library exports a libjpeg).
        mode = os.RTLD_LOCAL | getattr(os, "RTLD_DEEPBIND", 0)
        try:
            library = ctypes.CDLL(target, mode=mode)
        except OSError as exc:
            self.reason = f"loading it failed ({exc})"
            return
        functions = {}
        for name, restype, argtypes in self.signatures:
            function = getattr(library, name)
            function.restype = restype
            function.argtypes = list(argtypes)
            functions[name] = function
        self.functions = functions

    def _compile(self, target: str) -> Optional[str]:
        """Build the source into ``target``; ``None``, or why it could not."""
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd, temporary = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
        os.close(fd)
        command = [os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-o", temporary]
        command += [self.source] + [f"-l{name}" for name in self.libraries]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            os.unlink(temporary)
            return f"the C compiler could not run ({exc})"
        if done.returncode != 0:
            os.unlink(temporary)
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return f"compiling it failed ({last}); it needs {self.needs}"
        os.replace(temporary, target)  # atomic: another process may be building it too
        return None


def build_all() -> None:
    """Build and load every library not built yet: the loader calls this in its main
    process, once, before any worker starts (building takes a fraction of a second)."""
    for library in _libraries:
        library.available(build=True)


def native() -> Dict[str, str]:
    """Each compiled helper of the fused path and whether it is on here: ``"on"``, or
    ``"off: "`` and why (no C compiler, no libjpeg-turbo headers, its switch set to 0).

    Builds what is not built yet, as making a fused pipeline does (docs/vision.md,
    "Compiled helpers"). The pixels are the same either way; only the CPU time per image
    differs.

    Returns
    -------
    dict
        ``{"region_decode": ..., "write": ...}``: the libraries by name.
    """
    return {library.label: library.status() for library in _libraries}
