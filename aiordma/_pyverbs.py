"""The edge to pyverbs, rdma-core's Python bindings: the import guard, and
:func:`verbs_errors`, which turns pyverbs' failures into aiordma's.

pyverbs is not a pip dependency (see pyproject.toml): it comes from the
distribution. ``aiordma/__init__.py`` imports this module first, so a
missing install produces one clear, actionable error, and the root logger
is left as the application configured it. Every pyverbs call that can fail
runs under :func:`verbs_errors`, except the pure driver's posts
(``verbs/_driver/pure.py``), which return the provider's errno as the
compiled driver does.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator

from aiordma.exceptions import DeviceError

INSTALL_HINT = (
    "aiordma needs pyverbs, rdma-core's Python bindings. Install the distribution "
    "package (Debian/Ubuntu/Fedora: 'python3-pyverbs') and create your virtualenv "
    "from the system interpreter with '/usr/bin/python3 -m venv --system-site-packages', "
    "or run './dev setup' in an aiordma checkout. Building PyPI's 'pyverbs' sdist "
    "(all of rdma-core, needs cmake and cython) is the alternative."
)

_root = logging.getLogger()
_handlers, _level = list(_root.handlers), _root.level
try:
    import pyverbs.base  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without pyverbs
    raise ImportError(INSTALL_HINT) from exc
finally:
    # pyverbs.base calls logging.basicConfig() on import; logging set-up belongs
    # to the application, so undo it.
    for _handler in _root.handlers[:]:
        if _handler not in _handlers:
            _root.removeHandler(_handler)
    _root.setLevel(_level)


@contextlib.contextmanager
def verbs_errors(what: str, default_errno: int = errno.EIO) -> Iterator[None]:
    """Translate pyverbs' exceptions raised by ``what`` into :class:`~aiordma.DeviceError`.

    The one edge where pyverbs failures become aiordma's: ``errno`` is the
    verbs call's error code (``default_errno`` when pyverbs gave none).
    """
    from pyverbs.pyverbs_error import PyverbsError

    try:
        yield
    except PyverbsError as exc:
        code = getattr(exc, "error_code", 0)
        if isinstance(code, int) and code > 0:
            raise DeviceError(code, f"{what} failed: {os.strerror(code)}") from exc
        # No errno from the call (pyverbs gives 0 or -1): its own text says why.
        reason = str(exc).strip() or os.strerror(default_errno)
        raise DeviceError(default_errno, f"{what} failed: {reason}") from exc
