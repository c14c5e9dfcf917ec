"""What an awaited work request resolves to: a :class:`WorkCompletion`.

One is made for every awaited verb, so it is an extension type when
compiled (``_completed.pxd``; see :mod:`aiordma._compiled`);
:mod:`aiordma.verbs.completion` re-exports it with :class:`Opcode`.
"""

from __future__ import annotations

import enum
import socket
from typing import TYPE_CHECKING, Any

from aiordma import _ibv

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

__all__ = ["Opcode", "WorkCompletion", "from_wc"]


class Opcode(enum.IntEnum):
    """What a work completion completed (``ibv_wc_opcode``)."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMP_SWAP = 3
    FETCH_ADD = 4
    BIND_MW = 5
    LOCAL_INV = 6
    TSO = 7
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


_OPCODES: dict[int, Opcode] = {int(opcode): opcode for opcode in Opcode}
_FIELDS = ("wr_id", "opcode", "byte_len", "imm_data", "qp_num", "atomic_value")


@cython.cclass
class WorkCompletion:
    """The successful completion of one work request (immutable)."""

    def __init__(self, wr_id: int, opcode: Opcode, byte_len: int, imm_data: int | None,
                 qp_num: int, atomic_value: int | None = None) -> None:  # fmt: skip
        self._wr_id = wr_id
        self._opcode = opcode
        self._byte_len = byte_len
        self._imm_data = imm_data
        self._qp_num = qp_num
        self._atomic_value = atomic_value

    @property
    def wr_id(self) -> int:
        """The work request's id."""
        return self._wr_id

    @property
    def opcode(self) -> Opcode:
        """What completed."""
        return self._opcode

    @property
    def byte_len(self) -> int:
        """Bytes received (receives) or transferred (reads, atomics)."""
        return self._byte_len

    @property
    def imm_data(self) -> int | None:
        """Immediate data carried by a send/write with immediate (host byte order), else None."""
        return self._imm_data

    @property
    def qp_num(self) -> int:
        """The number of the queue pair the work was posted on."""
        return self._qp_num

    @property
    def atomic_value(self) -> int | None:
        """For atomics: the 64-bit value the remote word held before the operation."""
        return self._atomic_value

    def _fields(self) -> tuple[Any, ...]:
        return (self._wr_id, self._opcode, self._byte_len, self._imm_data, self._qp_num,
                self._atomic_value)  # fmt: skip

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(_FIELDS, self._fields(), strict=True))
        return f"WorkCompletion({shown})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkCompletion):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __reduce__(self) -> tuple[Any, ...]:
        return WorkCompletion, self._fields()


@cython.ccall
def from_wc(wc: Any, atomic_value: int | None = None) -> WorkCompletion:
    """The :class:`WorkCompletion` of a successful completion entry (the
    driver's, or pyverbs' ``WC``)."""
    imm = socket.ntohl(wc.imm_data) if wc.wc_flags & _ibv.WC_WITH_IMM else None
    return WorkCompletion(wc.wr_id, _OPCODES.get(wc.opcode, Opcode.SEND), wc.byte_len, imm,
                     wc.qp_num, atomic_value)  # fmt: skip
