"""Benchmark results and their summaries (pure logic)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, by the nearest-rank method."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


@dataclass(frozen=True)
class Latency:
    """Latency summary in microseconds."""

    p50: float
    p99: float
    p999: float
    mean: float
    cpu: float | None = None
    """The whole machine's busy CPU per operation (both processes and the
    device's kernel work), in microseconds, when it was measured."""

    @classmethod
    def of(cls, seconds: Sequence[float], cpu: float | None = None) -> Latency:
        """The summary of ``seconds``; ``cpu``: busy CPU seconds per operation
        (by default the ``cpu_per_op`` of ``seconds``, if it has one)."""
        us = [s * 1e6 for s in seconds]
        if cpu is None:
            cpu = getattr(seconds, "cpu_per_op", None)
        return cls(percentile(us, 0.5), percentile(us, 0.99), percentile(us, 0.999),
                   statistics.fmean(us), None if cpu is None else cpu * 1e6)  # fmt: skip


@dataclass(frozen=True)
class Result:
    """One measurement: a tool running a mode at one message size."""

    tool: str
    """``aiordma``, ``perftest`` or ``tcp``."""
    mode: str
    size: int
    depth: int
    iterations: int
    seconds: float
    """Wall time of the measured iterations."""
    latency: Latency | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    warmup: int = 0
    """Operations of ``size`` bytes run before the measured ones (not in the figures)."""

    @property
    def mb_per_s(self) -> float:
        return self.size * self.iterations / self.seconds / 1e6

    @property
    def gbit_per_s(self) -> float:
        return self.mb_per_s * 8 / 1000

    @property
    def ops_per_s(self) -> float:
        return self.iterations / self.seconds

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; a figure that is not finite (a tool that measured nothing) is null."""
        row = asdict(self)
        row.update(mb_per_s=self.mb_per_s, gbit_per_s=self.gbit_per_s, ops_per_s=self.ops_per_s)
        return {
            k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()
        }
