"""How ``aiordma bench`` shows results: table rows with ratios, and progress while it runs."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from aiordma.bench import counts
from aiordma.bench.stats import Result
from aiordma.lab.crossing import describe


def ratio(result: Result, reference: Result) -> str:
    """``result`` against ``reference``: latency as a multiple, throughput as a share.

    A reference that reported zero (perftest prints two decimals, so a short
    run can show 0.00 MB/s) gives no ratio rather than a division by zero.
    """
    if result.latency is not None and reference.latency is not None:
        ours, theirs, form = result.latency.p50, reference.latency.p50, "{:.1f}x {}"
    elif result.mode in ("send_rate", "msg_rate"):
        ours, theirs, form = result.ops_per_s, reference.ops_per_s, "{:.0%} of {}"
    else:
        ours, theirs, form = result.mb_per_s, reference.mb_per_s, "{:.0%} of {}"
    if not theirs > 0 or not math.isfinite(theirs):
        return f"no ratio: {reference.tool} reported {theirs:g}"
    return form.format(ours / theirs, reference.tool)


def row(result: Result, references: Sequence[Result] = ()) -> str:
    """One line of the table; ``references`` add ratios (for aiordma's own rows)."""
    head = f"{result.tool:<10} {result.mode:<10} {result.size:>9} B  depth {result.depth:<3}"
    if result.latency is not None:
        lat = result.latency
        text = (f"{head} p50 {lat.p50:9.1f} us  p99 {lat.p99:9.1f} us  "
                f"p99.9 {lat.p999:9.1f} us  mean {lat.mean:9.1f} us")  # fmt: skip
    else:
        text = (f"{head} {result.mb_per_s:9.1f} MB/s  {result.gbit_per_s:6.2f} Gbit/s  "
                f"{result.ops_per_s:9.0f} ops/s")  # fmt: skip
    ratios = [ratio(result, ref) for ref in references if ref is not result]
    if ratios:
        text += f"  ({', '.join(ratios)})"
    if result.latency is not None and result.latency.cpu is not None:
        text += f"  [machine CPU {result.latency.cpu:.0f} us/op]"
    credits = result.extra.get("credit_packets_per_message")
    if credits is not None:
        text += f"  [{credits:.2f} credit-only packets/msg]"
    text += counts.describe(result.extra)
    link = result.extra.get("link")
    if link is not None:
        text += f"  [{describe(link)}]"
    return text


class Progress:
    """A status line on a terminal, rewritten in place with the operations done;
    elsewhere (a log, the lab's console) one line as each measurement starts."""

    def __init__(self, total: int, out: TextIO = sys.stderr) -> None:
        self._total = total
        self._step = 0
        self._out = out
        self._live = out.isatty()
        self._label = ""
        self._last = 0.0

    def start(self, label: str) -> None:
        self._step += 1
        self._label = f"[{self._step}/{self._total}] {label}"
        if self._live:
            self._show(self._label, force=True)
        else:
            print(f"{self._label} ...", file=self._out, flush=True)

    def update(self, done: int) -> None:
        self._show(f"{self._label}: {done} ops")

    def clear(self) -> None:
        if self._live:
            self._out.write("\r\033[K")
            self._out.flush()

    def _show(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if not self._live or (not force and now - self._last < 0.2):
            return
        self._last = now
        self._out.write(f"\r\033[K{text}")
        self._out.flush()
