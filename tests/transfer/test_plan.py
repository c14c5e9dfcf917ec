"""A transfer's table: pairing, joining neighbours, splitting at the piece (no device)."""

from __future__ import annotations

from array import array

from aiordma import bulk_table
from aiordma.transfer import _plan

PIECE = 1 << 20


Row = tuple[int, ...]  # bulk_table.Record: addresses, length, keys, tag


def plan(local: list[tuple[int, int]], remote: list[int], *, piece: int = PIECE,
         lkeys: tuple[int, ...] = (5,), rkeys: tuple[int, ...] = (9,),
         lregion: list[int] | None = None) -> list[Row]:  # fmt: skip
    count = len(local)
    lengths = array("Q", [n for _, n in local])
    table = bulk_table.new_table(_plan.records_needed(lengths, count, piece))
    n = _plan.fill(array("Q", [a for a, _ in local]), lengths,
                   array("I", lregion or [0] * count), array("I", lkeys),
                   array("Q", remote), array("I", [0] * count), array("I", rkeys),
                   count, piece, table)  # fmt: skip
    return [tuple(bulk_table.record(table, r)) for r in range(n)]


def test_scattered_pairs_are_one_record_each_tagged_with_their_index() -> None:
    rows = plan([(1000, 64), (5000, 64)], [9000, 3000])
    assert rows == [(1000, 9000, 64, 5, 9, 0), (5000, 3000, 64, 5, 9, 1)]


def test_neighbours_on_both_sides_join_up_to_the_piece() -> None:
    blocks = [(1000 + 100 * i, 100) for i in range(5)]
    assert plan(blocks, [7000 + 100 * i for i in range(5)]) == [(1000, 7000, 500, 5, 9, 0)]
    # the same neighbours with a 250-byte piece: the join stops at each piece
    rows = plan(blocks, [7000 + 100 * i for i in range(5)], piece=250)
    assert [(r[0], r[2], r[5]) for r in rows] == [(1000, 250, 0), (1250, 250, 2)]


def test_neighbours_on_one_side_only_or_in_other_regions_stay_apart() -> None:
    assert len(plan([(0, 8), (8, 8)], [100, 200])) == 2
    assert len(plan([(0, 8), (8, 8)], [100, 108], lkeys=(5, 6), lregion=[0, 1])) == 2


def test_long_blocks_split_into_pieces_and_empty_ones_vanish() -> None:
    rows = plan([(0, 0), (4096, 2 * PIECE + 10)], [0, 1 << 30])
    assert [(r[0], r[1], r[2], r[5]) for r in rows] == [
        (4096, 1 << 30, PIECE, 1),
        (4096 + PIECE, (1 << 30) + PIECE, PIECE, 1),
        (4096 + 2 * PIECE, (1 << 30) + 2 * PIECE, 10, 1),
    ]


def test_mismatch_names_the_first_unequal_pair() -> None:
    assert _plan.mismatch(array("Q", [1, 2, 3]), array("Q", [1, 2, 3]), 3) == -1
    assert _plan.mismatch(array("Q", [1, 2, 3]), array("Q", [1, 5, 4]), 3) == 1
