"""Receive-ring accounting (no device): both sides place every record alike,
a writer never takes space it was not given, and a peer that breaks the
rule is caught at its first bad record."""

from __future__ import annotations

import random
from collections import deque

import pytest

from aiordma.channel.ring import ALIGN, MAX_RING, RingOwner, RingWriter, check_size, span
from aiordma.exceptions import ProtocolError

SIZE = 16 * ALIGN


def test_records_follow_each_other_aligned() -> None:
    writer, owner = RingWriter(SIZE), RingOwner(SIZE)
    places = [writer.reserve(n) for n in (1, ALIGN, ALIGN + 1)]
    assert [(p.offset, p.sequence, p.taken) for p in places if p] == [
        (0, 0, ALIGN),
        (ALIGN, 1, ALIGN),
        (2 * ALIGN, 2, 2 * ALIGN),
    ]
    assert [owner.arrive(i, n) for i, n in enumerate((1, ALIGN, ALIGN + 1))] == [
        0,
        ALIGN,
        2 * ALIGN,
    ]
    assert writer.free == SIZE - 4 * ALIGN


def test_a_record_past_the_end_goes_to_the_start_and_owns_the_skipped_bytes() -> None:
    writer, owner = RingWriter(SIZE), RingOwner(SIZE)
    quarter = SIZE // 4
    lengths = (quarter, quarter, quarter, ALIGN)  # the head at 3/4 and a unit
    for sequence, length in enumerate(lengths):
        assert writer.reserve(length) is not None
        owner.arrive(sequence, length)
    for _ in lengths:
        owner.free_oldest()
    writer.grant(owner.take_owed())
    place = writer.reserve(quarter)  # a quarter no longer fits before the end
    assert place is not None
    assert place.offset == 0
    assert place.taken == SIZE - (3 * quarter + ALIGN) + quarter
    assert owner.arrive(4, quarter) == 0
    owner.free_oldest()
    assert owner.owed == place.taken  # the skip comes back with the record
    writer.grant(owner.take_owed())
    assert writer.free == SIZE


def test_a_writer_waits_for_grants_and_takes_nothing_meanwhile() -> None:
    writer = RingWriter(SIZE)
    while writer.reserve(SIZE // 4) is not None:
        pass
    free = writer.free
    assert writer.reserve(SIZE // 4) is None
    assert writer.free == free


def test_records_larger_than_a_quarter_are_refused_on_both_sides() -> None:
    writer, owner = RingWriter(SIZE), RingOwner(SIZE)
    assert writer.fits(SIZE // 4)
    assert not writer.fits(SIZE // 4 + 1)
    assert not writer.fits(0)
    with pytest.raises(ValueError, match="quarter"):
        writer.reserve(SIZE // 4 + 1)
    with pytest.raises(ProtocolError, match="ring record of"):
        owner.arrive(0, SIZE // 4 + 1)
    with pytest.raises(ProtocolError, match="ring record of"):
        RingOwner(SIZE).arrive(0, 0)


def test_a_record_out_of_sequence_is_a_protocol_error() -> None:
    owner = RingOwner(SIZE)
    owner.arrive(0, 10)
    with pytest.raises(ProtocolError, match="record 2 arrived where 1 was due"):
        owner.arrive(2, 10)


def test_a_peer_writing_past_its_grants_is_caught() -> None:
    owner = RingOwner(SIZE)
    for sequence in range(4):  # never frees: the fifth quarter has no grant
        owner.arrive(sequence, SIZE // 4)
    with pytest.raises(ProtocolError, match="ring bytes with"):
        owner.arrive(4, SIZE // 4)


def test_returning_more_than_was_written_is_a_protocol_error() -> None:
    writer = RingWriter(SIZE)
    assert writer.reserve(ALIGN) is not None
    writer.grant(1)
    with pytest.raises(ProtocolError, match="returned"):
        writer.grant(1)


def test_owed_space_is_due_at_half_the_ring() -> None:
    owner = RingOwner(SIZE)
    for sequence in range(2):
        owner.arrive(sequence, SIZE // 4)
    owner.free_oldest()
    assert not owner.due()
    owner.free_oldest()
    assert owner.due()
    assert owner.take_owed() * ALIGN == SIZE // 2
    assert owner.owed == 0
    with pytest.raises(RuntimeError):
        owner.free_oldest()


def test_take_owed_gives_back_at_most_its_limit() -> None:
    owner = RingOwner(SIZE)
    owner.arrive(0, SIZE // 4)
    owner.free_oldest()
    assert owner.take_owed(limit=1) == 1
    assert owner.owed == SIZE // 4 - ALIGN


def test_sequence_numbers_wrap_at_32_bits() -> None:
    writer, owner = RingWriter(SIZE), RingOwner(SIZE)
    writer._sequence = owner._sequence = 0xFFFF_FFFF
    place = writer.reserve(1)
    assert place is not None
    assert place.sequence == 0xFFFF_FFFF
    owner.arrive(0xFFFF_FFFF, 1)
    assert writer.reserve(1) == (ALIGN, 0, ALIGN)
    assert owner.arrive(0, 1) == ALIGN


@pytest.mark.parametrize("size", [0, 3 * ALIGN, 4 * ALIGN + 1, MAX_RING + ALIGN])
def test_ring_sizes_are_checked(size: int) -> None:
    with pytest.raises(ValueError, match="a ring of"):
        check_size(size)
    check_size(4 * ALIGN)
    check_size(MAX_RING)


@pytest.mark.parametrize("seed", range(20))
def test_writer_and_owner_agree_and_never_deadlock(seed: int) -> None:
    """Random record sizes, a reader that takes at random moments, grants
    delayed in flight: every offset agrees, no record overlaps an unfreed
    one, and a waiting writer is always owed a grant once the reader has
    caught up."""
    rng = random.Random(seed)
    writer, owner = RingWriter(SIZE), RingOwner(SIZE)
    live: deque[tuple[int, int]] = deque()  # (offset, span) of unfreed records
    grants: deque[int] = deque()  # returned units in flight
    written = waits = 0
    while written < 400:
        action = rng.random()
        if action < 0.5:
            length = rng.randint(1, SIZE // 4)
            place = writer.reserve(length)
            if place is None:
                # Waiting for room: the reader catches up and the grants in
                # flight land; if that is not room enough, the space owed
                # must be due (no deadlock), and then it is.
                while live:
                    live.popleft()
                    owner.free_oldest()
                while grants:
                    writer.grant(grants.popleft())
                place = writer.reserve(length)
                if place is None:
                    waits += 1
                    assert owner.due(), "a waiting writer is owed nothing due"
                    writer.grant(owner.take_owed())
                    place = writer.reserve(length)
                    assert place is not None
            offset = owner.arrive(place.sequence, length)
            assert offset == place.offset
            end = offset + span(length)
            assert end <= SIZE
            for other, width in live:
                assert end <= other or other + width <= offset, "a record overwrote an unread one"
            live.append((offset, span(length)))
            written += 1
        elif action < 0.8 and live:
            live.popleft()
            owner.free_oldest()
            if rng.random() < 0.5:
                grants.append(owner.take_owed())  # piggybacked on a packet going back
        elif grants:
            writer.grant(grants.popleft())
    assert written == 400
    assert waits, "the writer never had to wait for the owner's grant"
