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

Neither side assumes the other's windows. Each starts with
:data:`CONTROL_BASE` control credits (every side posts at least that many
control buffers) and no data credits, and grants the rest in its first
packet (HELLO), which also says how large its windows are, so a grant
beyond them is caught as a protocol error. A side whose receive buffers
come from a shared pool (:class:`SharedDataCredits`) grants as many data
credits as the pool lends it, which may change while it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from aiordma.verbs.srq import ReceivePool

CONTROL_BASE: Final = 4
"""Control credits each side holds before the peer's HELLO: every side posts
at least this many control buffers (the smallest control window)."""


@dataclass
class CreditWindow:
    """Credit accounting for one direction pair of a connection (pure logic).

    ``available``: packets we may still send. ``owed``: buffers we re-posted
    and have not yet told the peer about.
    """

    window: int
    """Control buffers this side posts for the peer."""
    available: int = field(init=False)
    limit: int = field(init=False)
    """Control buffers the peer posts for us (:data:`CONTROL_BASE` until its HELLO)."""
    owed: int = field(init=False)
    _owed_by_data: int = 0

    def __post_init__(self) -> None:
        if self.window < CONTROL_BASE:
            raise ValueError(f"a credit window needs at least {CONTROL_BASE} buffers")
        self.available = self.limit = CONTROL_BASE
        self.owed = self.window - CONTROL_BASE  # granted in our HELLO

    def announced(self, peer_window: int) -> None:
        """The peer's HELLO said how many control buffers it posts."""
        if peer_window < CONTROL_BASE:
            raise ValueError(f"peer announced a control window of {peer_window}")
        self.limit = peer_window

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
        if credits < 0 or self.available + credits > self.limit:
            raise ValueError(
                f"peer granted {credits} credits with {self.available} of {self.limit} unused"
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
    """Data buffers this side posts for the peer (all granted in its HELLO)."""
    available: int = field(init=False)
    limit: int = field(init=False)
    """The most data credits the peer may grant us (0 until its HELLO)."""
    owed: int = field(init=False)

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ValueError("a data window needs at least 2 buffers")
        self.available = self.limit = 0
        self.owed = self.window  # granted in our HELLO

    def announced(self, peer_window: int) -> None:
        """The peer's HELLO said how many data credits it may grant at most."""
        if peer_window < 1:
            raise ValueError(f"peer announced a data window of {peer_window}")
        self.limit = peer_window

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
        if credits < 0 or self.available + credits > self.limit:
            raise ValueError(
                f"peer granted {credits} data credits with {self.available} of {self.limit} unused"
            )
        self.available += credits

    def arrived(self, last: bool = False) -> None:
        """A data message of the peer took one of our buffers (``last``: it
        spent the peer's last credit)."""

    def reposted(self) -> None:
        """The application consumed a data message and its buffer is posted again."""
        self.owed += 1


@dataclass
class SharedDataCredits(DataCredits):
    """The data credits a channel on a shared :class:`~aiordma.verbs.srq.ReceivePool` grants.

    Pure logic.

    ``window`` bounds what it grants at once; it starts with ``base`` (taken
    from the pool when it joined) and doubles its ``share`` each time a
    message of the peer says it spent its last credit, as far as the pool
    lends (the receiver cannot tell: credits in flight look the same). It
    keeps what it borrowed until the pool is pressed: then it gives back a
    buffer each time one of its messages is read, down to ``base``.
    """

    pool: ReceivePool = field(kw_only=True)
    base: int = field(kw_only=True)
    tokens: int = field(init=False)
    """Buffers this member owns: granted to the peer, or holding a message."""
    held: int = field(init=False)
    """Credits granted (or owed) to the peer whose messages have not arrived."""
    share: int = field(init=False)
    """The tokens it aims for now (``base`` to ``window``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.base <= self.window:
            raise ValueError(f"base ({self.base}) must be between 1 and window ({self.window})")
        self.tokens = self.held = self.share = self.owed = self.base

    def should_send_update(self) -> bool:
        # As a window of its own returns credits once half of it is owed,
        # with the buffers this member owns now as its window.
        return self.owed >= max(1, self.tokens // 2)

    def arrived(self, last: bool = False) -> None:
        if self.held < 1:
            raise ValueError("peer sent a data message without a credit")
        self.held -= 1
        if last:  # the peer used all it had: lend it more
            self.share = min(self.window, self.share * 2)

    def reposted(self) -> None:
        pool = self.pool
        if self.tokens > self.share or (pool.pressed and self.tokens > self.base):
            self.tokens -= 1
            pool.give(1)
            return
        self.held += 1
        self.owed += 1
        while self.tokens < self.share and not pool.pressed:
            if not pool.borrow():
                self.share = self.tokens
                break
            self.tokens += 1
            self.held += 1
            self.owed += 1

    def leave(self) -> int:
        """The member detaches: the tokens it gives back (its queued messages'
        buffers, and those granted to its peer, which is gone)."""
        tokens, self.tokens, self.held, self.owed = self.tokens, 0, 0, 0
        return tokens
