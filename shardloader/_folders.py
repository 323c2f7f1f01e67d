"""Folders shardloader writes files into and reads them back from: refused unless they are
the user's own and only the user can write to them."""

from __future__ import annotations

import os
import stat


class UnsafeFolder(ValueError):
    """A folder shardloader reads or writes (the demo's folders, the object-storage cache) is
    not the user's own, or others can write to it."""


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


_DEMO_WHY = (
    "another user could plant files in it, and the demo loads trainer states from it, "
    "which are pickles: loading a planted one would run its code as you"
)


def check_own_folder(
    path: str, role: str, why: str = _DEMO_WHY, option: str = "--cache-dir"
) -> None:
    """Refuse ``path`` unless it is a directory of the current user that only the user can
    write to, in a parent that others cannot rename it out of.

    Parameters
    ----------
    path : str
        The folder.
    role : str
        What it is for, for the message (``"cache folder"``, ``"checkpoint folder"``).
    why : str
        Why a folder others can write is refused, for the message.
    option : str
        The argument that picks another folder, for the message.

    Raises
    ------
    UnsafeFolder
        Naming the folder, what is wrong with it and what to do.
    """
    st = os.stat(path)
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(f"the {role} {path} is not a directory; pass another {option}")
    if st.st_uid != me:
        raise UnsafeFolder(
            f"the {role} {path} belongs to {_owner(st.st_uid)}, not to you ({_owner(me)}): "
            f"{why}. Pass a {option} of your own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeFolder(
            f"the {role} {path} can be written by others (mode {stat.filemode(st.st_mode)}): "
            f"{why}. Run `chmod go-w {path}`, or pass a {option} of your own"
        )
    parent = os.path.dirname(os.path.abspath(path))
    pst = os.stat(parent)
    if pst.st_mode & stat.S_IWOTH and not pst.st_mode & stat.S_ISVTX:
        raise UnsafeFolder(
            f"the {role} {path} is in {parent}, which anyone can write to without the sticky "
            f"bit (mode {stat.filemode(pst.st_mode)}), so another user could replace it: "
            f"{why}. Pass a {option} elsewhere"
        )


def make_own_folder(
    path: str, role: str, why: str = _DEMO_WHY, option: str = "--cache-dir"
) -> None:
    """Create ``path`` (only its owner may enter it) if it is missing, then
    ``check_own_folder``."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    check_own_folder(path, role, why, option)
