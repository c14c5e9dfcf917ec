"""What a benchmark's operations cost in counted work, beside their time.

Work requests posted, completions taken and wake-ups do not drift with the
machine as seconds do, so an A/B states them per message on each side:
the queue pair's ``posted_*`` gauges and its completion queue's
``waiting()`` counts, read before and after the measured run.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiordma.verbs.queue_pair import QueuePair

KEYS = ("work_requests", "completions", "wakeups")
"""What is counted, in the order it is printed."""


def read(qp: QueuePair) -> dict[str, int]:
    """``qp``'s totals so far: work requests posted on both its queues, and
    the completions and wake-ups of its completion queue (which a process
    running one connection has to itself)."""
    gauges = qp.stats()["gauges"]
    waiting = qp.completion_queue.waiting()
    return {
        "work_requests": int(gauges["posted_sends"] + gauges["posted_receives"]),
        "completions": int(waiting["completions"]),
        "wakeups": int(waiting["wakeups"]),
    }


def encode(qp: QueuePair) -> bytes:
    """:func:`read` as the benchmark peer's answer to an empty message."""
    return json.dumps(read(qp)).encode()


def decode(answer: bytes | bytearray | memoryview) -> dict[str, int] | None:
    """The counts in a peer's answer (None: an answer without them)."""
    try:
        counts = json.loads(bytes(answer))
    except ValueError:
        return None
    if not isinstance(counts, dict) or any(not isinstance(counts.get(k), int) for k in KEYS):
        return None
    return {k: counts[k] for k in KEYS}


def per_message(
    before: dict[str, int] | None, after: dict[str, int] | None, messages: int, prefix: str = ""
) -> dict[str, float]:
    """``{prefix + key + "_per_message": ...}`` from two readings (nothing if
    either is missing or no message was counted)."""
    if before is None or after is None or messages <= 0:
        return {}
    return {f"{prefix}{k}_per_message": (after[k] - before[k]) / messages for k in KEYS}


def describe(extra: dict[str, float]) -> str:
    """The counts of a result's ``extra`` as one bracketed note ("" if none)."""
    parts = []
    for side, prefix in (("here", ""), ("peer", "peer_")):
        values = [extra.get(f"{prefix}{k}_per_message") for k in KEYS]
        if all(v is not None for v in values):
            wr, wc, wake = values
            parts.append(f"{side} {wr:.2f} WR {wc:.2f} CQE {wake:.2f} wake")
    return f"  [per msg: {'; '.join(parts)}]" if parts else ""
