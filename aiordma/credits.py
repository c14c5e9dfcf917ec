"""Credit-based flow control for sends into a peer's pre-posted receive buffers.

Each side posts ``window`` receive buffers and tells the peer, through
credits, how many it has posted; a packet is sent only against a credit, so
a sender can never find the peer's receive queue empty (no receiver-not-ready
retries) and a slow receiver holds senders back instead of failing them.

Buffers are counted in two windows. Data messages (:class:`DataCredits`)
hold their buffer until the application takes them, so they carry the
back-pressure. Control packets (:class:`CreditWindow`: rendezvous DONE
notices and credit updates) are consumed by the protocol on arrival, so
they always make progress, whatever the applications do; a window of their
own means a receiver that stopped reading can never starve the DONE or the
credit update that would let the other side go on.

In the control window one credit is kept for credit-only packets: when both
sides have used every other credit, each can still return the credits it
owes, so the exchange cannot deadlock. Buffers consumed by credit-only
packets are owed back but never trigger a credit-only packet of their own,
so two idle peers do not ping-pong credits forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CreditWindow:
    """Credit accounting for one direction pair of a connection (pure logic).

    ``available``: packets we may still send. ``owed``: buffers we re-posted
    and have not yet told the peer about.
    """

    window: int
    available: int = field(init=False)
    owed: int = 0
    _owed_by_data: int = 0

    def __post_init__(self) -> None:
        if self.window < 4:
            raise ValueError("a credit window needs at least 4 buffers")
        self.available = self.window

    def can_send_data(self) -> bool:
        """Whether a data packet may go now (the last credit is kept for credit updates)."""
        return self.available > 1

    def take_for_data(self) -> int:
        """Spend a credit on a data packet; returns the owed credits to piggyback on it."""
        if not self.can_send_data():
            raise RuntimeError("no credit for a data packet")
        self.available -= 1
        return self._piggyback()

    def should_send_update(self) -> bool:
        """Whether to send a credit-only packet now: enough owed because of data, and a credit."""
        return self._owed_by_data >= max(1, self.window // 2) and self.available >= 1

    def take_for_update(self) -> int:
        """Spend a credit on a credit-only packet; returns the credits it carries."""
        if self.available < 1:
            raise RuntimeError("no credit for a credit update")
        self.available -= 1
        return self._piggyback()

    def _piggyback(self) -> int:
        owed, self.owed, self._owed_by_data = self.owed, 0, 0
        return owed

    def piggyback(self) -> int:
        """Hand the owed credits to a packet that does not spend one of these credits."""
        return self._piggyback()

    def granted(self, credits: int) -> None:
        """The peer re-posted ``credits`` buffers for us."""
        if credits < 0 or self.available + credits > self.window:
            raise ValueError(
                f"peer granted {credits} credits with {self.available} of {self.window} unused"
            )
        self.available += credits

    def reposted(self, for_data: bool) -> None:
        """We re-posted a receive buffer that a packet of the peer consumed."""
        self.owed += 1
        if for_data:
            self._owed_by_data += 1


@dataclass
class DataCredits:
    """Credits for data messages, whose buffers the application empties (pure logic).

    They need no reserve: they are returned on any packet, or by a
    :class:`CreditWindow`-governed control packet once half a window is owed.
    A sender waiting here is back-pressure from a receiver that is not
    consuming, never a deadlock: everything the receiver consumed is owed
    back, and half a window owed always triggers an update.
    """

    window: int
    available: int = field(init=False)
    owed: int = 0

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ValueError("a data window needs at least 2 buffers")
        self.available = self.window

    def can_send(self) -> bool:
        return self.available > 0

    def take(self) -> None:
        if self.available < 1:
            raise RuntimeError("no credit for a data message")
        self.available -= 1

    def should_send_update(self) -> bool:
        return self.owed >= max(1, self.window // 2)

    def piggyback(self) -> int:
        owed, self.owed = self.owed, 0
        return owed

    def granted(self, credits: int) -> None:
        if credits < 0 or self.available + credits > self.window:
            raise ValueError(
                f"peer granted {credits} data credits with {self.available} of {self.window} unused"
            )
        self.available += credits

    def reposted(self) -> None:
        """The application consumed a data message and its buffer is posted again."""
        self.owed += 1
