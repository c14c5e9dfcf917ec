"""The bulk table: one-sided requests as records of four 64-bit words.

A transfer agent's descriptor lists become a table (``array('Q')``) that
the verbs layer posts with no Python per request. Each record is one RDMA
READ or WRITE:

====  ===============  ==================================================
word  name             holds
====  ===============  ==================================================
0     ``local_addr``   the local address
1     ``remote_addr``  the peer's address
2     ``length_lkey``  ``length | lkey << 32``: bytes moved, local key
3     ``rkey_tag``     ``rkey | tag << 32``: the peer's key, and the
                       owner's index for the record (the descriptor it
                       came from), which a failure names
====  ===============  ==================================================

Who uses it: the planner writes records (``aiordma/transfer/_plan.py``),
a bulk run posts them in chunks and reads a failed record's tag
(``aiordma/verbs/_bulk.py``), and both drivers turn records into work
requests (``aiordma/verbs/_driver/``). They all take the layout from
``LAYOUT``: the typed modules as C fields, declared once in
``bulk_table.pxd`` (this module is compiled for that); the driver core,
which must load when the typed modules run from source, as numbers read
at import.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython


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


@cython.cclass
class Layout:
    """The record's layout: its size in words and where each word is (the
    table above), as C integers for typed code."""

    def __init__(self) -> None:
        self.record_words = 4
        self.local_addr = 0
        self.remote_addr = 1
        self.length_lkey = 2
        self.rkey_tag = 3


LAYOUT: Final = Layout()
"""The one :class:`Layout`: typed code holds it in a typed variable."""


def new_table(records: int) -> array[int]:
    """A zeroed table with room for ``records`` records."""
    return array("Q", bytes(8 * LAYOUT.record_words * records))


def record(table: array[int], r: int) -> Record:
    """Record ``r`` of ``table``, unpacked."""
    base = LAYOUT.record_words * r
    word = table[base + LAYOUT.length_lkey]
    key = table[base + LAYOUT.rkey_tag]
    return Record(
        table[base + LAYOUT.local_addr], table[base + LAYOUT.remote_addr],
        word & 0xFFFFFFFF, word >> 32, key & 0xFFFFFFFF, key >> 32,
    )  # fmt: skip


def tag_of(table: array[int], r: int) -> int:
    """The tag of record ``r``: its owner's index."""
    return int(table[LAYOUT.record_words * r + LAYOUT.rkey_tag] >> 32)
