"""Ctrl-C is never lost while a loader is iterated (docs/design.md, invariant 8).

Python runs a SIGINT handler at the next bytecode boundary of the main thread. When that
boundary is inside a ``__del__`` method (MXNet's ``NDArrayBase.__del__`` runs for every
array a training step frees), the ``KeyboardInterrupt`` cannot propagate: Python prints
"Exception ignored in ..." and carries on, and the user has to press Ctrl-C again. This
happens with Gluon's own loader too; it is a property of any MXNet program.

``install()`` chains a ``sys.unraisablehook`` that remembers such an interrupt instead of
reporting it as ignored; the loader's ``next()`` raises it (``raise_pending``), so the
training loop ends at the next batch. Other unraisable errors go to the previous hook
untouched. The hook only records: re-raising from inside it would be swallowed the same
way.
"""

from __future__ import annotations

import sys
import threading

_installed = False
pending = False  # a KeyboardInterrupt was swallowed in the main thread


def _hook_factory(previous):
    def hook(unraisable) -> None:
        global pending
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and (
            threading.current_thread() is threading.main_thread()
        ):
            pending = True  # not ignored after all: no "Exception ignored" report
            return
        previous(unraisable)

    hook.shardloader = True
    return hook


def install() -> None:
    """Install the hook once per process (idempotent, cheap)."""
    global _installed
    if _installed:
        return
    _installed = True
    if not getattr(sys.unraisablehook, "shardloader", False):
        sys.unraisablehook = _hook_factory(sys.unraisablehook)


def raise_pending() -> None:
    """Raise the ``KeyboardInterrupt`` a destructor swallowed, if any (main thread only)."""
    global pending
    if pending and threading.current_thread() is threading.main_thread():
        pending = False
        raise KeyboardInterrupt("Ctrl-C (it first arrived inside a destructor)")
