"""The bulk table: one-sided requests as records of four 64-bit words.

A transfer agent's descriptor lists become a table (``array('Q')``) that
the verbs layer posts with no Python per request. Each record is one RDMA
READ or WRITE:

====  ===============  ==================================================
word  name             holds
====  ===============  ==================================================
0     ``LOCAL_ADDR``   the local address
1     ``REMOTE_ADDR``  the peer's address
2     ``LENGTH_LKEY``  ``length | lkey << 32``: bytes moved, local key
3     ``RKEY_TAG``     ``rkey | tag << 32``: the peer's key, and the
                       owner's index for the record (the descriptor it
                       came from), which a failure names
====  ===============  ==================================================

Who uses it: the planner writes records (``aiordma/transfer/_plan.py``),
a bulk run posts them in chunks and reads a failed record's tag
(``aiordma/verbs/_bulk.py``), and both drivers turn records into work
requests (``aiordma/verbs/_driver/``). They all take the layout from here.
"""

from __future__ import annotations

from array import array
from typing import Final, NamedTuple

RECORD_WORDS: Final = 4
"""64-bit words per record."""
LOCAL_ADDR: Final = 0
REMOTE_ADDR: Final = 1
LENGTH_LKEY: Final = 2
RKEY_TAG: Final = 3


class Record(NamedTuple):
    """One record, unpacked (for the pure driver and tests; compiled code
    reads the words itself)."""

    local_addr: int
    remote_addr: int
    length: int
    lkey: int
    rkey: int
    tag: int

    def words(self) -> tuple[int, int, int, int]:
        """The record's four words, in table order."""
        return (self.local_addr, self.remote_addr, self.length | self.lkey << 32,
                self.rkey | self.tag << 32)  # fmt: skip


def new_table(records: int) -> array[int]:
    """A zeroed table with room for ``records`` records."""
    return array("Q", bytes(8 * RECORD_WORDS * records))


def record(table: array[int], r: int) -> Record:
    """Record ``r`` of ``table``, unpacked."""
    base = RECORD_WORDS * r
    word = table[base + LENGTH_LKEY]
    key = table[base + RKEY_TAG]
    return Record(
        table[base + LOCAL_ADDR], table[base + REMOTE_ADDR],
        word & 0xFFFFFFFF, word >> 32, key & 0xFFFFFFFF, key >> 32,
    )  # fmt: skip


def tag_of(table: array[int], r: int) -> int:
    """The tag of record ``r``: its owner's index."""
    return int(table[RECORD_WORDS * r + RKEY_TAG] >> 32)
