"""Numeric constants of the verbs ABI (``infiniband/verbs.h``), in one place.

pyverbs exposes them too, but as Cython enums whose attribute lookups cost
more than a module constant on the per-message path, and whose names differ
between releases. These values are part of the kernel/user ABI and never
change.
"""

from __future__ import annotations

from typing import Final

# enum ibv_wr_opcode
WR_RDMA_WRITE: Final = 0
WR_RDMA_WRITE_WITH_IMM: Final = 1
WR_SEND: Final = 2
WR_SEND_WITH_IMM: Final = 3
WR_RDMA_READ: Final = 4
WR_ATOMIC_CMP_AND_SWP: Final = 5
WR_ATOMIC_FETCH_AND_ADD: Final = 6
WR_BIND_MW: Final = 8
ANSWERED_OPCODES: Final = frozenset({WR_SEND, WR_SEND_WITH_IMM, WR_RDMA_WRITE_WITH_IMM})
"""Sends the peer sees as a receive completion, so may answer."""

WR_NAMES: Final = {
    WR_RDMA_WRITE: "rdma_write",
    WR_RDMA_WRITE_WITH_IMM: "rdma_write_with_imm",
    WR_SEND: "send",
    WR_SEND_WITH_IMM: "send_with_imm",
    WR_RDMA_READ: "rdma_read",
    WR_ATOMIC_CMP_AND_SWP: "atomic_cmp_swap",
    WR_ATOMIC_FETCH_AND_ADD: "atomic_fetch_add",
    WR_BIND_MW: "bind_window",
}
"""The names aiordma reports for each work-request opcode (in errors)."""

SEND_OPCODES: Final = frozenset({WR_SEND, WR_SEND_WITH_IMM})
ATOMIC_OPCODES: Final = frozenset({WR_ATOMIC_CMP_AND_SWP, WR_ATOMIC_FETCH_AND_ADD})
INLINE_OPCODES: Final = frozenset(
    {WR_SEND, WR_SEND_WITH_IMM, WR_RDMA_WRITE, WR_RDMA_WRITE_WITH_IMM}
)

# enum ibv_send_flags
SEND_SIGNALED: Final = 1 << 1
SEND_INLINE: Final = 1 << 3

# enum ibv_qp_type
QPT_RC: Final = 2

# enum ibv_qp_state
QPS_INIT: Final = 1
QPS_RTR: Final = 2
QPS_RTS: Final = 3
QPS_ERR: Final = 6

# enum ibv_qp_attr_mask
QP_STATE: Final = 1 << 0
QP_TIMEOUT: Final = 1 << 9
QP_MIN_RNR_TIMER: Final = 1 << 15

# enum ibv_wc_status, enum ibv_wc_flags, enum ibv_wc_opcode
WC_SUCCESS: Final = 0
WC_RECV: Final = 1 << 7
"""Set in the opcode of every receive completion."""
WC_RECV_RDMA_WITH_IMM: Final = WC_RECV | 1
"""The opcode of a receive that an RDMA write with immediate consumed."""
WC_WITH_IMM: Final = 1 << 1

# enum ibv_mw_type, and the ibv_device_cap_flags that say which are supported
MW_TYPE_1: Final = 1
MW_TYPE_2: Final = 2
DEVICE_MEM_WINDOW: Final = 1 << 17
DEVICE_MEM_WINDOW_TYPE_2A: Final = 1 << 23
DEVICE_MEM_WINDOW_TYPE_2B: Final = 1 << 24

# enum ibv_atomic_cap
ATOMIC_NONE: Final = 0
