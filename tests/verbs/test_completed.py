"""What an awaited work request resolves to (pure logic, no device)."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass

import pytest

from aiordma import Opcode, WorkCompletion
from aiordma.verbs._completed import from_wc


@dataclass
class _Entry:
    """A completion entry as a driver hands it over (network byte order immediate)."""

    wr_id: int = 7
    opcode: int = 128
    byte_len: int = 64
    imm_data: int = 0
    qp_num: int = 17
    wc_flags: int = 0


def test_fields_equality_and_repr_are_a_value_s() -> None:
    wc = WorkCompletion(1, Opcode.SEND, 64, None, 17)
    assert (wc.wr_id, wc.opcode, wc.byte_len, wc.imm_data, wc.qp_num, wc.atomic_value) == (
        1, Opcode.SEND, 64, None, 17, None,
    )  # fmt: skip
    assert wc == WorkCompletion(1, Opcode.SEND, 64, None, 17)
    assert wc != WorkCompletion(1, Opcode.SEND, 64, None, 17, atomic_value=0)
    assert len({wc, WorkCompletion(1, Opcode.SEND, 64, None, 17)}) == 1
    assert repr(wc) == (
        "WorkCompletion(wr_id=1, opcode=<Opcode.SEND: 0>, byte_len=64, imm_data=None, "
        "qp_num=17, atomic_value=None)"
    )


def test_it_is_immutable() -> None:
    wc = WorkCompletion(1, Opcode.SEND, 64, None, 17)
    with pytest.raises(AttributeError):
        wc.byte_len = 0  # type: ignore[misc]
    assert wc.byte_len == 64


def test_it_copies_and_pickles_whole() -> None:
    wc = WorkCompletion(3, Opcode.FETCH_ADD, 8, None, 17, atomic_value=41)
    assert pickle.loads(pickle.dumps(wc)) == wc
    assert copy.copy(wc) == wc


def test_an_entry_becomes_a_completion_with_its_immediate_in_host_order() -> None:
    plain = from_wc(_Entry())
    assert plain == WorkCompletion(7, Opcode.RECV, 64, None, 17)
    with_imm = from_wc(_Entry(opcode=129, imm_data=0x01000000, wc_flags=2))
    assert with_imm.opcode is Opcode.RECV_RDMA_WITH_IMM
    assert with_imm.imm_data == 1
    assert from_wc(_Entry(opcode=999)).opcode is Opcode.SEND  # unknown: the send family
    assert from_wc(_Entry(opcode=4), 5).atomic_value == 5
