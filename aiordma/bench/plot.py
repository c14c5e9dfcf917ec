"""``--plot FILE.png``: latency and throughput against message size, one line per mode and tool.

Needs matplotlib (``pip install aiordma[bench]``); it is imported only here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from aiordma.bench.stats import Result

_STYLE = {"aiordma": "-", "perftest": "--", "tcp": ":"}
_MARKER = {"aiordma": "o", "perftest": "s", "tcp": "^"}


def _series(results: Sequence[Result], latency: bool) -> dict[tuple[str, str], list[Result]]:
    """Points per (mode, tool), by size; a measurement of nothing has no place on a log scale."""
    series: dict[tuple[str, str], list[Result]] = defaultdict(list)
    for r in results:
        if (r.latency is not None) == latency and r.mb_per_s > 0:
            series[(r.mode, r.tool)].append(r)
    for points in series.values():
        points.sort(key=lambda r: r.size)
    return dict(sorted(series.items()))


def plot(results: Sequence[Result], path: str, title: str = "aiordma bench") -> None:
    """Write a PNG: p50 latency (left) and MB/s (right) against message size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat_ax, bw_ax) = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    colors: dict[str, str] = {}
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, latency in ((lat_ax, True), (bw_ax, False)):
        for (mode, tool), points in _series(results, latency).items():
            color = colors.setdefault(mode, palette[len(colors) % len(palette)])
            ys = [r.latency.p50 if r.latency else r.mb_per_s for r in points]
            ax.plot([r.size for r in points], ys, _STYLE.get(tool, "-."), color=color,
                    marker=_MARKER.get(tool, "x"), label=f"{mode} ({tool})")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    lat_ax.set_ylabel("p50 round trip (us)")
    lat_ax.set_title("latency (lower is better)")
    bw_ax.set_ylabel("MB/s")
    bw_ax.set_title("throughput (higher is better)")
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
