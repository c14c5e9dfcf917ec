"""What crossed the two-host lab's link: the proof a cross-host figure needs.

A figure measured "across the link" is only that if its bytes went over
the link's cards: a peer placed on the wrong host, or an object a
framework cached on the consumer's node, moves nothing across and looks
fast. Each host's card counts the bytes it sent and received (the
interface's counters: RDMA, TCP and anything else on the link);
:meth:`aiordma.lab.remote.Fabric.link_bytes` reads both hosts', and
:class:`LinkBytes` says, from two readings, whether a run's payload crossed.

Call order: ``before = link_bytes() -> run -> (link_bytes()).since(before).crossed(payload)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CardBytes", "LinkBytes", "card_files", "describe", "parse_card"]


def card_files(nic: str) -> tuple[str, str]:
    """The counter files of card ``nic``: bytes sent, bytes received."""
    stats = Path("/sys/class/net") / nic / "statistics"
    return str(stats / "tx_bytes"), str(stats / "rx_bytes")


def parse_card(text: str) -> CardBytes:
    """A card's counters from the two lines ``cat`` prints of :func:`card_files`
    (ValueError naming what it got otherwise)."""
    fields = text.split()
    if len(fields) != 2 or not all(f.isdigit() for f in fields):
        raise ValueError(f"a card's byte counters are two integers, not {text!r}")
    return CardBytes(sent=int(fields[0]), received=int(fields[1]))


@dataclass(frozen=True)
class CardBytes:
    """Bytes one host's link card sent and received."""

    sent: int
    received: int

    def since(self, before: CardBytes) -> CardBytes:
        return CardBytes(self.sent - before.sent, self.received - before.received)

    @property
    def total(self) -> int:
        return self.sent + self.received


@dataclass(frozen=True)
class LinkBytes:
    """Both hosts' cards: counters, or (after :meth:`since`) what a run moved."""

    host1: CardBytes
    host2: CardBytes

    def since(self, before: LinkBytes) -> LinkBytes:
        """What moved between ``before`` and this reading."""
        return LinkBytes(self.host1.since(before.host1), self.host2.since(before.host2))

    def crossed(self, payload: int) -> bool:
        """Whether ``payload`` bytes went over the link: each host's card
        counted at least that much (either way: a write's bytes leave host
        1, a read's arrive there; headers and acknowledgements only add)."""
        return min(self.host1.total, self.host2.total) >= payload

    def describe(self, payload: int, warmup: int = 0) -> str:
        """One line: what each card moved, against ``payload``, and the verdict."""
        return describe(self.to_json(payload, warmup))

    def to_json(self, payload: int, warmup: int = 0) -> dict[str, Any]:
        """Plain data for a result's ``extra``: ``payload`` is what the timed
        part moved, ``warmup`` what ran before it (counted by the cards too)."""
        return {
            "host1_sent": self.host1.sent,
            "host1_received": self.host1.received,
            "host2_sent": self.host2.sent,
            "host2_received": self.host2.received,
            "payload": payload,
            "warmup": warmup,
            "crossed": self.crossed(payload),
        }


def describe(row: dict[str, Any]) -> str:
    """The line :meth:`LinkBytes.describe` gives, from its :meth:`~LinkBytes.to_json`."""
    verdict = "crossed" if row["crossed"] else "NOT CROSSED"
    return (
        f"link MB out/in: host 1 {_mb(row['host1_sent'])}/{_mb(row['host1_received'])}, "
        f"host 2 {_mb(row['host2_sent'])}/{_mb(row['host2_received'])}, "
        f"payload {_mb(row['payload'])}{_warmup(row.get('warmup', 0))}: {verdict}"
    )


def _warmup(n: int) -> str:
    """The warm-up's bytes, apart: the cards counted them, the MB/s beside did not."""
    return f" timed + {_mb(n)} warm-up" if n else ""


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}" if n >= 100_000 else f"{n / 1e6:.3f}"  # a latency run's KB show
