"""The bulk table's layout (aiordma/bulk_table.py): host tests, run on both paths."""

from __future__ import annotations

from aiordma import bulk_table
from aiordma.bulk_table import LAYOUT, Record


def test_a_record_round_trips_through_its_four_words() -> None:
    table = bulk_table.new_table(3)
    assert len(table) == 3 * LAYOUT.record_words
    assert not any(table)
    record = Record(0x1000, 0xFFFF_FFFF_FFFF_0000, 4096, 0xFFFF_FFFE, 0x1234_5678, 0xFFFF_FFFF)
    base = LAYOUT.record_words
    table[base : base + LAYOUT.record_words] = type(table)("Q", record.words())
    assert bulk_table.record(table, 1) == record
    assert bulk_table.tag_of(table, 1) == 0xFFFF_FFFF
    assert bulk_table.record(table, 0) == Record(0, 0, 0, 0, 0, 0)


def test_the_layout_is_the_documented_one() -> None:
    """The planner, the bulk run and both drivers index records with these
    numbers (the module's table); ``Record.words`` writes them in this order."""
    words = (LAYOUT.local_addr, LAYOUT.remote_addr, LAYOUT.length_lkey, LAYOUT.rkey_tag)
    assert (LAYOUT.record_words, words) == (4, (0, 1, 2, 3))
