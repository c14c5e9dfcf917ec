"""What crossed the link: the check a cross-host figure prints (pure logic, host only)."""

from __future__ import annotations

import pytest

from aiordma.lab.crossing import CardBytes, LinkBytes, card_files, describe, parse_card


def test_a_card_is_read_from_its_two_counter_files() -> None:
    assert card_files("ens4") == (
        "/sys/class/net/ens4/statistics/tx_bytes",
        "/sys/class/net/ens4/statistics/rx_bytes",
    )
    assert parse_card("123\n456\n") == CardBytes(sent=123, received=456)
    for bad in ("", "1", "1\n2\n3", "cat: no such file\n2"):
        with pytest.raises(ValueError, match="two integers"):
            parse_card(bad)


def test_a_payload_crossed_only_if_both_cards_counted_it() -> None:
    before = LinkBytes(CardBytes(1_000, 2_000), CardBytes(5_000, 6_000))
    # A 1 MB write from host 1: its card sends it, host 2's receives it.
    after = LinkBytes(CardBytes(1_051_000, 12_000), CardBytes(15_000, 1_056_000))
    moved = after.since(before)
    assert moved == LinkBytes(CardBytes(1_050_000, 10_000), CardBytes(10_000, 1_050_000))
    assert moved.crossed(1_000_000)
    assert not moved.crossed(2_000_000)
    # Host 1's own loopback traffic would count on no card: nothing crossed.
    still = LinkBytes(CardBytes(1_000, 2_000), CardBytes(5_000, 6_000)).since(before)
    assert not still.crossed(1)
    # One card counting is not enough: the bytes must arrive at the other host.
    one_sided = LinkBytes(CardBytes(2_000_000, 0), CardBytes(0, 0))
    assert not one_sided.crossed(1_000_000)


def test_the_line_a_result_prints_says_what_moved_and_the_verdict() -> None:
    moved = LinkBytes(CardBytes(1_050_000, 10_000), CardBytes(10_000, 1_050_000))
    row = moved.to_json(1_000_000)
    assert row["crossed"] is True
    assert (
        describe(row)
        == moved.describe(1_000_000)
        == ("link MB out/in: host 1 1.1/0.010, host 2 0.010/1.1, payload 1.0: crossed")
    )
    assert moved.describe(5_000_000).endswith("payload 5.0: NOT CROSSED")


def test_the_warm_up_that_crossed_too_is_said_apart() -> None:
    """Issue 81: "payload 67.1" beside 136.1 MB on each card, with nothing to
    say that a warm-up of as much had crossed too."""
    moved = LinkBytes(CardBytes(200_000, 136_100_000), CardBytes(136_100_000, 200_000))
    assert moved.describe(67_100_000, warmup=67_100_000).endswith(
        "payload 67.1 timed + 67.1 warm-up: crossed"
    )
    assert moved.to_json(67_100_000, 1_000)["warmup"] == 1_000
