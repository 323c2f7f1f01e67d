"""How to install an optional extra, said once for every message that needs it.

shardloader is on no package index, so ``pip install shardloader[EXTRA]`` cannot work. The
advice names what does: installing the extra from the clone this package runs from (when it
runs from one: an editable or source install), with the clone's constraints, or the extra's
packages themselves at the versions the project pins (constraints.txt).

- ``install_hint(extra)``: the advice, one line.
- ``missing_extra(extra, needed_for)``: an ``ImportError`` that says what needs the extra and
  how to install it.

An extra's packages are listed in ``EXTRAS`` with their pinned versions (a test checks them
against pyproject.toml and constraints.txt).
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

__all__ = ["EXTRAS", "clone_root", "install_hint", "missing_extra"]

# extra -> its packages, pinned as in constraints.txt.
EXTRAS: Dict[str, Tuple[str, ...]] = {
    "vision": ("simplejpeg==1.9.0", "opencv-python-headless==4.11.0.86"),
    "s3": ("boto3==1.35.99",),
    "bench": (
        "simplejpeg==1.9.0",
        "opencv-python-headless==4.11.0.86",
        "psutil==7.2.2",
        "matplotlib==3.10.9",
        "Pillow==13.0.0",
    ),
}


def clone_root() -> Optional[str]:
    """The clone this package runs from (its pyproject.toml names shardloader), or ``None``
    for an installed wheel."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(root, "pyproject.toml")) as f:
            if 'name = "shardloader"' not in f.read():
                return None
    except OSError:
        return None
    return root


def install_hint(extra: str) -> str:
    """How to install ``extra``: from the clone, with its constraints, where there is one;
    always the pinned packages themselves."""
    packages = " ".join(EXTRAS[extra])
    root = clone_root()
    if root is None:
        return f"pip install {packages}"
    constraints = os.path.join(root, "constraints.txt")
    pin = f"-c '{constraints}' " if os.path.exists(constraints) else ""
    return f"pip install {pin}-e '{root}[{extra}]' (this clone), or pip install {packages}"


def missing_extra(extra: str, needed_for: str) -> ImportError:
    """The error for ``needed_for`` without the ``extra`` extra (raise it)."""
    return ImportError(
        f"{needed_for} needs the {extra!r} extra, which is not installed: {install_hint(extra)}"
    )
