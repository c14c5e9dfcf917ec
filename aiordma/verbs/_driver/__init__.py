"""Which per-message path runs: the compiled core or pure Python.

:mod:`aiordma.verbs._driver._core` (Cython, built when a compiler and the verbs headers
are there) drains completion queues and posts work requests in C. Without
it, or with ``AIORDMA_PURE=1`` in the environment, the same work runs in
Python through pyverbs. The choice is made once, at import; each CQ and QP
then uses the core only if its handle was found and checked (see
``docs/design.md``, "The compiled core").
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyverbs.cq import CQ
    from pyverbs.qp import QP

    from aiordma.verbs._driver._core import CQDriver, QPDriver

PURE_ENV: Final = "AIORDMA_PURE"
"""Set to 1 to force the pure-Python path (for comparison or debugging)."""
ABI: Final = 2
"""The :mod:`aiordma.verbs._driver._core` interface version this Python side expects."""


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(PURE_ENV, "").strip() not in ("", "0"):
        return None, f"pure Python (forced by {PURE_ENV})"
    try:
        # By name: the import-layering check cannot see inside an extension
        # and would take ``import aiordma.verbs._driver._core`` for an import of the package.
        _core = importlib.import_module("aiordma.verbs._driver._core")
    except ImportError as exc:
        return None, f"pure Python (the compiled core is not built: {exc})"
    if getattr(_core, "ABI", None) != ABI:
        return None, "pure Python (the compiled core is stale: rebuild with ./dev setup)"
    return _core, "compiled (aiordma.verbs._driver._core)"


core, path = _load()
"""The compiled module (None on the pure path), and a line saying which path runs and why."""


def cq_driver(cq: CQ, fd: int) -> CQDriver | None:
    """A :class:`~aiordma.verbs._driver._core.CQDriver` for ``cq``, or None (pure path)."""
    if core is None:
        return None
    address = core.find_cq(cq, fd)
    return core.CQDriver(address) if address else None


def qp_driver(qp: QP, send_cq: CQDriver | None, recv_cq: CQDriver | None) -> QPDriver | None:
    """A ``QPDriver`` for ``qp`` on those CQs, or None (pure path)."""
    if core is None or send_cq is None or recv_cq is None:
        return None
    address = core.find_qp(qp, send_cq.address, recv_cq.address)
    return core.QPDriver(address) if address else None
