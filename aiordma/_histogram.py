# cython: annotation_typing=True
"""Latency histograms in fixed power-of-two buckets, and the counter tally.

Every awaited verb and every RPC call is timed into one, and every message
counted, so this module is compiled when the build could
(``_histogram.pxd``; see :mod:`aiordma._compiled`): compiled code records
an observation or a count with no Python frame. :mod:`aiordma.metrics`
re-exports it.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

__all__ = ["BUCKETS", "Histogram", "record", "tally"]

BUCKETS: Final = tuple(1e-6 * 2**i for i in range(0, 25))
"""Upper bounds of the latency histograms' buckets, in seconds: 1 us to
about 16.8 s, doubling (the last bucket also takes anything slower)."""

_LAST = cython.declare(cython.Py_ssize_t, len(BUCKETS) - 1)


@cython.cclass
class Histogram:
    """Latencies in fixed power-of-two buckets (see :data:`BUCKETS`)."""

    def __init__(self) -> None:
        self.counts: list[int] = [0] * len(BUCKETS)
        self.count = 0
        self.sum = 0.0

    @cython.ccall
    def observe(self, seconds: cython.double) -> None:
        index: cython.Py_ssize_t = bisect_left(BUCKETS, seconds)
        self.counts[min(index, _LAST)] += 1
        self.count += 1
        self.sum += seconds

    def merge(self, other: Histogram) -> None:
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.count += other.count
        self.sum += other.sum

    def quantile(self, q: float) -> float | None:
        """An upper bound of the ``q`` quantile (the bucket it falls in), or None if empty."""
        if not self.count:
            return None
        rank = q * self.count
        seen = 0
        for bound, n in zip(BUCKETS, self.counts, strict=True):
            seen += n
            if seen >= rank:
                return float(bound)
        return float(BUCKETS[-1])

    def snapshot(self) -> dict[str, Any]:
        """``count``, ``sum`` (seconds), ``p50``/``p99`` upper bounds and the
        non-empty ``buckets`` as ``{upper bound: count}``."""
        return {
            "count": self.count,
            "sum": self.sum,
            "p50": self.quantile(0.5),
            "p99": self.quantile(0.99),
            "buckets": {b: n for b, n in zip(BUCKETS, self.counts, strict=True) if n},
        }


@cython.ccall
def record(histograms: dict, name: str, seconds: cython.double) -> None:  # type: ignore[type-arg]
    """Observe ``seconds`` in ``histograms[name]``, made on first use: what
    :meth:`aiordma.metrics.Stats.observe` does (compiled, no Python frame)."""
    histogram: Histogram | None = histograms.get(name)
    if histogram is None:
        histogram = histograms[name] = Histogram()
    histogram.observe(seconds)


@cython.ccall
def tally(counters: object, name: str, amount_name: str, amount: cython.Py_ssize_t) -> None:
    """One ``name`` event of ``amount`` (``amount_name``) in ``counters`` (a
    ``Counter``: missing names count from 0): what
    :meth:`aiordma.metrics.Stats.count` does (compiled, no Python frame)."""
    counters[name] += 1  # type: ignore[index]
    counters[amount_name] += amount  # type: ignore[index]
