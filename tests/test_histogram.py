"""Latency histograms (pure logic, no device)."""

from __future__ import annotations

from collections import Counter

import pytest

from aiordma.metrics import BUCKETS, Histogram, record, tally


def test_histogram_buckets_and_quantiles() -> None:
    h = Histogram()
    assert h.quantile(0.5) is None
    for seconds in (0.5e-6, 3e-6, 3e-6, 1e-3, 100.0):
        h.observe(seconds)
    assert h.count == 5
    assert h.sum == pytest.approx(100.0010065)
    snap = h.snapshot()
    assert snap["buckets"] == {1e-6: 1, 4e-6: 2, BUCKETS[10]: 1, BUCKETS[-1]: 1}
    assert snap["p50"] == 4e-6  # the third of five falls in the 4 us bucket
    assert snap["p99"] == BUCKETS[-1]


def test_merging_adds_counts_buckets_and_sums() -> None:
    a, b = Histogram(), Histogram()
    a.observe(2e-6)
    b.observe(2e-6)
    b.observe(1.0)
    a.merge(b)
    assert a.count == 3
    assert a.sum == pytest.approx(1.000004)
    assert a.snapshot()["buckets"] == {2e-6: 2, BUCKETS[20]: 1}


def test_record_makes_the_histogram_on_first_use() -> None:
    histograms: dict[str, Histogram] = {}
    record(histograms, "call", 3e-6)
    record(histograms, "call", 3e-6)
    assert histograms["call"].count == 2
    assert histograms["call"].snapshot()["buckets"] == {4e-6: 2}


def test_tally_counts_an_event_and_its_amount_from_zero() -> None:
    counters: Counter[str] = Counter()
    tally(counters, "messages_sent", "bytes_sent", 64)
    tally(counters, "messages_sent", "bytes_sent", 0)
    assert counters == {"messages_sent": 2, "bytes_sent": 64}
