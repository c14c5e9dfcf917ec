"""Counters and latency histograms: what a connection, a server or an RPC client is doing.

Every queue pair, message channel, RPC client and server keeps a
:class:`Stats` (plain integers and fixed-bucket histograms, updated where
the event happens); ``stats()`` on each returns a snapshot as a dict, and
:mod:`aiordma.prometheus` exports them all. Recording is on by default; set
``AIORDMA_METRICS=0`` in the environment (read at import) or call
:func:`enable` to turn it off, which leaves every count at zero.
"""

from __future__ import annotations

import functools
import os
import re
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from aiordma._histogram import BUCKETS, Histogram, record, tally

_on: bool = os.environ.get("AIORDMA_METRICS", "1").strip().lower() not in (
    "0",
    "false",
    "no",
    "off",
)


def enabled() -> bool:
    """Whether counters and histograms are being recorded."""
    return _on


def enable(on: bool = True) -> None:
    """Turn recording on or off for the whole process (it is on unless
    ``AIORDMA_METRICS=0``). Counts already made are kept."""
    global _on
    _on = bool(on)


class Stats:
    """Named counters and latency histograms of one object.

    ``add(name, n)`` and ``observe(name, seconds)`` record (when recording
    is on); :meth:`snapshot` gives ``{"counters": {...}, "latency": {...}}``.
    Counter names are ``snake_case``; a counter per kind (operations by
    opcode, errors by status) is ``"family:kind"`` (``"errors:IBV_WC_REM_ACCESS_ERR"``).
    """

    __slots__ = ("__weakref__", "counters", "gauge_sources", "histograms", "kind")

    def __init__(self, kind: str, gauges: Callable[[], dict[str, int]] | None = None) -> None:
        self.kind = kind
        """What the stats belong to (``"queue_pair"``, ``"channel"``...)."""
        self.counters: Counter[str] = Counter()
        self.histograms: dict[str, Histogram] = {}
        self.gauge_sources: list[Callable[[], dict[str, int]]] = [gauges] if gauges else []
        """Functions giving current values (exposed bytes...), read at snapshot time."""

    def freeze(self) -> None:
        """Keep the gauges' values as they are now and let go of their
        sources: the object they read has closed, and a source (a bound
        method) would keep it alive."""
        if self.gauge_sources:
            self.gauge_sources = [functools.partial(dict, self.gauges())]

    def gauges(self) -> dict[str, int]:
        """Current values, summed over the gauge sources."""
        total: Counter[str] = Counter()
        for source in self.gauge_sources:
            total.update(source())
        return dict(total)

    def add(self, name: str, n: int = 1) -> None:
        if _on:
            self.counters[name] += n

    def count(self, name: str, amount_name: str, amount: int) -> None:
        """One ``name`` event of ``amount`` (``amount_name``): a message and its bytes."""
        if _on:
            tally(self.counters, name, amount_name, amount)

    def observe(self, name: str, seconds: float) -> None:
        if _on:
            record(self.histograms, name, seconds)

    def merge(self, other: Stats, *, gauges: bool = True) -> None:
        """Add ``other``'s counts (and, with ``gauges``, its live values) to these."""
        self.counters.update(other.counters)
        if gauges:
            self.gauge_sources.extend(other.gauge_sources)
        for name, histogram in other.histograms.items():
            mine = self.histograms.get(name)
            if mine is None:
                mine = self.histograms[name] = Histogram()
            mine.merge(histogram)

    def copy(self) -> Stats:
        """These stats as they are now, gauges read once (a copy the owner's
        loop cannot change while an exporter reads it)."""
        copy = Stats(self.kind)
        copy.merge(self, gauges=False)
        copy.gauge_sources = [functools.partial(dict, self.gauges())]
        return copy

    def snapshot(self) -> dict[str, Any]:
        """``{"counters": ..., "gauges": ..., "latency": ...}`` as plain data."""
        return {
            "counters": dict(self.counters),
            "gauges": self.gauges(),
            "latency": {name: h.snapshot() for name, h in self.histograms.items()},
        }


def merged(kind: str, parts: Iterable[Stats]) -> Stats:
    """One :class:`Stats` summing ``parts``."""
    total = Stats(kind)
    for part in parts:
        total.merge(part)
    return total


# -- what the exporter walks ---------------------------------------------------

_sources: weakref.WeakSet[Any] = weakref.WeakSet()


def watch(owner: Any) -> None:
    """Let exporters see ``owner``, which has a ``_metric_sources()`` method
    yielding ``(labels, stats)`` pairs (a server, or a client connection)."""
    _sources.add(owner)


def unwatch(owner: Any) -> None:
    _sources.discard(owner)


def collect() -> Iterator[tuple[dict[str, str], Stats]]:
    """Every watched object's ``(labels, stats)``, for an exporter, each a
    copy taken at once.

    An exporter runs in a thread of its own while each source's loop
    updates it: a source whose collections changed while being read is
    left out of this scrape (the next has it), never the whole scrape.
    """
    for owner in list(_sources):
        try:
            pairs = [(labels, stats.copy()) for labels, stats in owner._metric_sources()]
        except RuntimeError:  # "... changed size during iteration"
            continue
        yield from pairs


# -- reading an exposition back (``aiordma stats``) ---------------------------------

_SAMPLE = re.compile(r"^(aiordma_[a-zA-Z0-9_]+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def format_exposition(text: str) -> str:
    """aiordma's samples in Prometheus text ``text``, as a table per labelled source.

    Counters and gauges are listed by name (a ``op``/``status``/``kind``
    label folded into it); histograms as count and mean.
    """
    groups: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, raw_labels, raw_value = match.groups()
        labels = dict(_LABEL.findall(raw_labels or ""))
        if name.endswith("_bucket") or name.endswith("_created"):
            continue
        where = [(k, labels.pop(k, "")) for k in ("server", "peer", "pool")]
        source = ", ".join(f"{k}={v}" for k, v in where if v)
        for key in ("op", "status", "kind"):
            if key in labels:
                name = f"{name}:{labels.pop(key)}"
        try:
            value = float(raw_value)
        except ValueError:
            continue
        groups.setdefault(source or "(process)", {})[name.removeprefix("aiordma_")] = value
    process = groups.get("(process)", {})
    sources = process.pop("sources", None)
    if not process:
        groups.pop("(process)", None)
    if not groups:
        if sources is not None:
            return (
                "aiordma is exported there, but has nothing to show: no server, client "
                "connection or pool is open (yet, or any more)"
            )
        return "no aiordma metrics there (is aiordma.prometheus.register() called?)"
    out = []
    for source in sorted(groups):
        out.append(source)
        values = groups[source]
        for name in sorted(values):
            if name.endswith("_seconds_sum"):
                continue
            if name.endswith("_seconds_count"):
                base = name.removesuffix("_count")
                count = values[name]
                total = values.get(base + "_sum", 0.0)
                mean = f"mean {total / count * 1e6:,.1f} us" if count else "no samples"
                out.append(f"  {base:<40} {count:>14,.0f}  {mean}")
            else:
                out.append(f"  {name:<40} {values[name]:>14,.0f}")
    return "\n".join(out)


__all__ = ["BUCKETS", "Histogram", "Stats", "collect", "enable", "enabled", "format_exposition",
           "record", "tally"]  # fmt: skip
