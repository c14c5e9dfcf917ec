# cython: annotation_typing=True
"""The check that a call comes from the event loop its resource belongs to.

Every operation on the per-message path makes it, so this module is
compiled when the build could (see :mod:`aiordma._compiled`): the check
costs one C call and no Python frame. :mod:`aiordma.lifecycle` re-exports it.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import TYPE_CHECKING, Any

from aiordma.exceptions import WrongLoopError

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

__all__ = ["check_loop"]

_confirmed: Any = None
"""A weak reference to the loop :func:`check_loop` last confirmed (or None)."""
_thread: int = 0
"""The thread that loop was confirmed running in."""


@cython.ccall
def check_loop(loop: object) -> None:
    """Raise WrongLoopError unless called from ``loop`` (what a resource is bound to).

    On Python 3.11 ``asyncio.get_running_loop()`` makes a ``getpid`` system
    call each time (tens of microseconds under emulation). So once a loop
    has been confirmed running in a thread, a call from that thread while
    that loop is running is taken as coming from it: a thread runs one loop
    at a time.
    """
    global _confirmed, _thread
    if (
        _confirmed is not None
        and _confirmed() is loop
        and _thread == threading.get_ident()
        and loop.is_running()
    ):
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not loop:
        raise WrongLoopError(
            "this object belongs to another event loop; create it (or open the "
            "device) on the loop that uses it"
        )
    _confirmed = weakref.ref(loop)
    _thread = threading.get_ident()
