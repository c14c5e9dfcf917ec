"""Export aiordma's metrics to Prometheus (``pip install 'aiordma[prometheus]'``).

    from prometheus_client import start_http_server
    import aiordma.prometheus

    aiordma.prometheus.register()   # once, in the process that serves or connects
    start_http_server(9464)

:func:`register` adds a collector to a ``prometheus_client`` registry; at
each scrape it reads the :mod:`aiordma.metrics` of every server and every
client connection that is open (or was, for servers, until it closed) and
yields them as metric families:

- ``aiordma_<counter>_total`` for each counter, labelled ``server``,
  ``peer``, ``pool`` (a :class:`~aiordma.SharedReceiveQueue`) or
  ``completion_queue`` (one that may spin: the default); when a process has
  several kinds, each sample has all their labels, the others empty;
  counters of a kind (``ops:rdma_read``, ``errors:<status>``) become one
  family with an ``op`` or ``status`` label;
- ``aiordma_<name>_seconds`` histograms for latencies (awaited verbs, RPC
  calls and handlers);
- ``aiordma_<gauge>`` gauges (connections, exposed bytes, a pool's free
  buffers);
- ``aiordma_sources``, how many servers, client connections and pools
  there are (0: aiordma is exported, but nothing is open yet, or any more).

Nothing is exported per connection of a server (their number is not
bounded): a server's figures are summed over its connections.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "aiordma.prometheus needs prometheus_client: pip install 'aiordma[prometheus]'"
    ) from exc

from aiordma import metrics

_LABELLED = {"ops": "op", "errors": "status"}
"""Counter families whose kind becomes a label."""


class AiordmaCollector(Collector):
    """Yields the metrics of every watched server and client connection."""

    def collect(self) -> Iterator[Any]:
        counters: dict[str, CounterMetricFamily] = {}
        gauges: dict[str, GaugeMetricFamily] = {}
        histograms: dict[str, HistogramMetricFamily] = {}
        sources = list(metrics.collect())
        # Every family carries every source label present in this scrape
        # (empty where it does not apply): a family's label names are fixed,
        # and a server's and a client connection's samples share families.
        names = sorted({name for labels, _ in sources for name in labels})
        for labels, stats in sources:
            values = [labels.get(name, "") for name in names]
            for counter, value in sorted(stats.counters.items()):
                family_name, _, kind = counter.partition(":")
                extra = _LABELLED.get(family_name, "kind") if kind else None
                family = counters.get(counter if extra is None else family_name)
                if family is None:
                    family = CounterMetricFamily(
                        f"aiordma_{family_name}",
                        f"aiordma {family_name.replace('_', ' ')}",
                        labels=[*names, extra] if extra else names,
                    )
                    counters[counter if extra is None else family_name] = family
                family.add_metric([*values, kind] if extra else values, value)
            for name, value in sorted(stats.gauges().items()):
                gauge = gauges.get(name)
                if gauge is None:
                    gauge = gauges[name] = GaugeMetricFamily(
                        f"aiordma_{name}", f"aiordma {name.replace('_', ' ')}", labels=names
                    )
                gauge.add_metric(values, value)
            for name, histogram in sorted(stats.histograms.items()):
                family_h = histograms.get(name)
                if family_h is None:
                    family_h = histograms[name] = HistogramMetricFamily(
                        f"aiordma_{name}_seconds",
                        f"aiordma {name.replace('_', ' ')} latency",
                        labels=names,
                    )
                cumulative, buckets = 0, []
                for bound, n in zip(metrics.BUCKETS, histogram.counts, strict=True):
                    cumulative += n
                    buckets.append((repr(bound), cumulative))
                buckets.append(("+Inf", histogram.count))
                family_h.add_metric(values, buckets, histogram.sum)
        yield from counters.values()
        yield from gauges.values()
        yield from histograms.values()
        yield GaugeMetricFamily(
            "aiordma_sources",
            "aiordma servers, client connections and pools exported now",
            value=len(sources),
        )


_registered: weakref.WeakKeyDictionary[CollectorRegistry, AiordmaCollector] = (
    weakref.WeakKeyDictionary()
)
"""Each registry's collector, keyed by the registry itself: an ``id`` is
reused once its registry is freed, and a new registry would seem served."""


def register(registry: CollectorRegistry = REGISTRY) -> AiordmaCollector:
    """Add aiordma's collector to ``registry`` (the default one if not given);
    calling it again for the same registry does nothing more."""
    collector = _registered.get(registry)
    if collector is None:
        collector = _registered[registry] = AiordmaCollector()
        registry.register(collector)
    return collector


__all__ = ["AiordmaCollector", "register"]
