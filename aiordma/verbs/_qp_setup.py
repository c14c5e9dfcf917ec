"""A queue pair's set-up, apart from the object: its limits checked, the
pyverbs ``QP`` created, and the attributes that connect it.

:class:`~aiordma.QueuePair` calls these once each; nothing here keeps
state. Call order: ``check_limits -> create -> [connect_attr]``
(``connect_attr`` for :meth:`QueuePair.connect`; rdma_cm computes its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

from aiordma import _ibv
from aiordma._pyverbs import verbs_errors
from aiordma.verbs.endpoint import Endpoint, gid_to_str
from aiordma.verbs.memory import Access
from aiordma.verbs.options import QueuePairOptions

if TYPE_CHECKING:
    from pyverbs.cq import CQ
    from pyverbs.srq import SRQ

    from aiordma.verbs._lifecycle import Owner


def check_limits(opts: QueuePairOptions, device: Owner) -> int:
    """ValueError naming the first of ``opts``' depths or scatter/gather
    counts ``device`` cannot hold; else the RDMA reads in flight it grants
    (``max_rd_atomic``, brought within the device's limit)."""
    attrs = device.attributes
    for name in ("send_depth", "recv_depth"):
        if not 0 < getattr(opts, name) <= attrs.max_qp_wr:
            raise ValueError(f"{name} must be between 1 and {attrs.max_qp_wr}")
    for name in ("max_send_sge", "max_recv_sge"):
        if not 0 < getattr(opts, name) <= attrs.max_sge:
            raise ValueError(f"{name} must be between 1 and {attrs.max_sge}")
    return max(1, min(opts.max_rd_atomic, attrs.max_qp_rd_atom))


def create(device: Owner, opts: QueuePairOptions, send_cq: CQ, recv_cq: CQ, srq: SRQ | None) -> QP:
    """An RC queue pair in INIT on ``device``, completing on ``send_cq`` and
    ``recv_cq`` (receiving from ``srq`` if given). Its access flags allow
    every kind: memory regions carry the least-privilege grants."""
    init = QPInitAttr(
        qp_type=_ibv.QPT_RC, scq=send_cq, rcq=recv_cq, srq=srq,
        cap=QPCap(
            max_send_wr=opts.send_depth, max_recv_wr=opts.recv_depth,
            max_send_sge=opts.max_send_sge, max_recv_sge=opts.max_recv_sge,
            max_inline_data=opts.max_inline,
        ),
        sq_sig_all=0,
    )  # fmt: skip
    attr = QPAttr(port_num=opts.port)
    attr.qp_access_flags = int(Access.LOCAL_WRITE | Access.REMOTE | Access.REMOTE_ATOMIC)
    with verbs_errors(f"creating a queue pair on {device.name}"):
        return QP(device.pd, init, attr)


def connect_attr(
    device: Owner, opts: QueuePairOptions, remote: Endpoint, psn: int, gid_index: int,
    rd_atomic: int,
) -> QPAttr:  # fmt: skip
    """The attributes that take a queue pair through RTR to RTS, connected
    to ``remote``, sending from ``psn`` and source GID ``gid_index``."""
    attr = QPAttr(port_num=opts.port)
    attr.path_mtu = opts.path_mtu or device.context.query_port(opts.port).active_mtu
    attr.dest_qp_num = remote.qp_num
    attr.rq_psn = remote.psn
    attr.max_dest_rd_atomic = rd_atomic
    attr.min_rnr_timer = opts.min_rnr_timer
    route = GlobalRoute(dgid=GID(gid_to_str(remote.gid)), sgid_index=gid_index)
    attr.ah_attr = AHAttr(port_num=opts.port, is_global=1, gr=route, dlid=remote.lid)
    attr.timeout = opts.timeout
    attr.retry_cnt = opts.retry_cnt
    attr.rnr_retry = opts.rnr_retry
    attr.sq_psn = psn
    attr.max_rd_atomic = min(rd_atomic, device.attributes.max_qp_init_rd_atom)
    return attr
