"""The compile boundary: one driver per CQ, QP and SRQ, chosen here once.

The compiled core (``_core``, Cython, built when a compiler and the verbs
headers are there) drains completion queues and posts work requests in C.
Whether it runs is decided where every compiled-or-pure choice is,
:mod:`aiordma._compiled`: not with ``AIORDMA_PURE=1`` in the environment,
nor when it is not built or stale. Without it, or for an object whose C
handle was not found, the pure driver (:mod:`.pure`) does the same work
through pyverbs. The selectors below always return a driver; nothing
above this package asks which one it got.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiordma._compiled import PURE_ENV, load_core
from aiordma.verbs._driver.base import CQDriver, QPDriver, SRQDriver
from aiordma.verbs._driver.handles import official_handle
from aiordma.verbs._driver.pure import PureCQDriver, PureQPDriver, PureSRQDriver

if TYPE_CHECKING:
    from pyverbs.cq import CQ, CompChannel
    from pyverbs.qp import QP
    from pyverbs.srq import SRQ

__all__ = ["ABI", "PURE_ENV", "CQDriver", "QPDriver", "SRQDriver", "core", "cq_driver",
           "path", "qp_driver", "srq_driver"]  # fmt: skip

ABI: Final = 8
"""The ``_core`` interface version this side expects."""


REBUILD: Final = "reinstall aiordma with pip, which rebuilds it, or run ./dev setup in a checkout"
"""What to do about a build older than its source, for pip users and checkouts alike."""


core, path = load_core("aiordma.verbs._driver._core", ABI, REBUILD)
"""The compiled module (None on the pure path), and a line saying which path runs and why."""


def cq_driver(cq: CQ, channel: CompChannel, fd: int) -> CQDriver:
    """The driver for ``cq`` (whose completion channel has descriptor ``fd``)."""
    if core is not None:
        address = core.find_cq(cq, fd, official_handle(cq, "cq"))
        if address:
            driver: CQDriver = core.CQDriver(address)
            return driver
    return PureCQDriver(cq, channel)


def qp_driver(qp: QP, send_cq: CQDriver, recv_cq: CQDriver) -> QPDriver:
    """The driver for ``qp``, completing on the CQs of those drivers: compiled
    only if both of them are (the QP's handle is checked against theirs)."""
    if core is not None and send_cq.compiled and recv_cq.compiled:
        send, recv = getattr(send_cq, "address", 0), getattr(recv_cq, "address", 0)
        address = core.find_qp(qp, send, recv, official_handle(qp, "qp"))
        if address:
            driver: QPDriver = core.QPDriver(address)
            return driver
    return PureQPDriver(qp)


def srq_driver(
    srq: SRQ, current: SRQDriver | None = None, via: QPDriver | None = None
) -> SRQDriver:
    """The driver for ``srq``: the compiled one once a QP receiving from it
    has a compiled driver (``via``: its handle names the SRQ), else
    ``current`` or a pure one."""
    if current is not None and current.compiled:
        return current
    address = getattr(via, "srq_address", 0) if via is not None else 0
    if core is not None and address:
        driver: SRQDriver = core.SRQDriver(address)
        if current is not None:
            current.detach()
        return driver
    return current if current is not None else PureSRQDriver(srq)
