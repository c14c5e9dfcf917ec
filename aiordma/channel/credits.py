# cython: annotation_typing=True
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

from typing import TYPE_CHECKING, Final

from aiordma.verbs.srq import ReceivePool

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

CONTROL_BASE: Final = 4
"""Control credits each side holds before the peer's HELLO: every side posts
at least this many control buffers (the smallest control window)."""


@cython.cclass
class CreditWindow:
    """Credit accounting for one direction pair of a connection (pure logic).

    ``window``: control buffers this side posts for the peer. ``limit``:
    control buffers the peer posts for us (:data:`CONTROL_BASE` until its
    HELLO). ``available``: packets we may still send. ``owed``: buffers we
    re-posted and have not yet told the peer about. (Compiled, these are C
    integers, declared in ``credits.pxd``.)
    """

    def __init__(self, window: cython.int) -> None:
        if window < CONTROL_BASE:
            raise ValueError(f"a credit window needs at least {CONTROL_BASE} buffers")
        self.window = window
        self.available = self.limit = CONTROL_BASE
        self.owed = window - CONTROL_BASE  # granted in our HELLO
        self._owed_by_data = 0

    def __repr__(self) -> str:
        return (f"CreditWindow(window={self.window}, available={self.available}, "
                f"limit={self.limit}, owed={self.owed})")  # fmt: skip

    def announced(self, peer_window: cython.int) -> None:
        """The peer's HELLO said how many control buffers it posts."""
        if peer_window < CONTROL_BASE:
            raise ValueError(f"peer announced a control window of {peer_window}")
        self.limit = peer_window

    @cython.ccall
    def can_send_data(self) -> cython.bint:
        """Whether a data packet may go now (the last credit is kept for credit updates)."""
        return self.available > 1

    @cython.ccall
    def take_for_data(self) -> cython.int:
        """Spend a credit on a data packet; returns the owed credits to piggyback on it."""
        if not self.can_send_data():
            raise RuntimeError("no credit for a data packet")
        self.available -= 1
        return self._piggyback()

    @cython.ccall
    def should_send_update(self) -> cython.bint:
        """Whether to send a credit-only packet now: enough owed because of data, and a credit."""
        return self._owed_by_data >= max(1, self.window // 2) and self.available >= 1

    @cython.ccall
    def take_for_update(self) -> cython.int:
        """Spend a credit on a credit-only packet; returns the credits it carries."""
        if self.available < 1:
            raise RuntimeError("no credit for a credit update")
        self.available -= 1
        return self._piggyback()

    @cython.cfunc
    def _piggyback(self) -> cython.int:
        owed: cython.int = self.owed
        self.owed = self._owed_by_data = 0
        return owed

    @cython.ccall
    def piggyback(self) -> cython.int:
        """Hand the owed credits to a packet that does not spend one of these credits."""
        return self._piggyback()

    @cython.ccall
    def granted(self, credits: cython.int) -> None:
        """The peer re-posted ``credits`` buffers for us."""
        if credits < 0 or self.available + credits > self.limit:
            raise ValueError(
                f"peer granted {credits} credits with {self.available} of {self.limit} unused"
            )
        self.available += credits

    @cython.ccall
    def reposted(self, for_data: cython.bint) -> None:
        """We re-posted a receive buffer that a packet of the peer consumed."""
        self.owed += 1
        if for_data:
            self._owed_by_data += 1


@cython.cclass
class DataCredits:
    """Credits for data messages, whose buffers the application empties (pure logic).

    They need no reserve: they are returned on any packet, or by a
    :class:`CreditWindow`-governed control packet once half a window is owed.
    A sender waiting here is back-pressure from a receiver that is not
    consuming, never a deadlock: everything the receiver consumed is owed
    back, and half a window owed always triggers an update.

    ``window``: data buffers this side posts for the peer (all granted in
    its HELLO). ``limit``: the most data credits the peer may grant us (0
    until its HELLO). ``available`` and ``owed`` as for :class:`CreditWindow`.
    """

    def __init__(self, window: cython.int) -> None:
        if window < 2:
            raise ValueError("a data window needs at least 2 buffers")
        self.window = window
        self.available = self.limit = 0
        self.owed = window  # granted in our HELLO

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(window={self.window}, available={self.available}, "
                f"limit={self.limit}, owed={self.owed})")  # fmt: skip

    def announced(self, peer_window: cython.int) -> None:
        """The peer's HELLO said how many data credits it may grant at most."""
        if peer_window < 1:
            raise ValueError(f"peer announced a data window of {peer_window}")
        self.limit = peer_window

    @cython.ccall
    def can_send(self) -> cython.bint:
        """Whether a data message may go now."""
        return self.available > 0

    @cython.ccall
    def take(self) -> None:
        """Spend a credit on a data message."""
        if self.available < 1:
            raise RuntimeError("no credit for a data message")
        self.available -= 1

    @cython.ccall
    def should_send_update(self) -> cython.bint:
        """Whether enough is owed for a credit-only packet."""
        return self.owed >= max(1, self.window // 2)

    @cython.ccall
    def piggyback(self) -> cython.int:
        """Hand the owed credits to a packet."""
        owed: cython.int = self.owed
        self.owed = 0
        return owed

    @cython.ccall
    def granted(self, credits: cython.int) -> None:
        """The peer re-posted ``credits`` buffers for us."""
        if credits < 0 or self.available + credits > self.limit:
            raise ValueError(
                f"peer granted {credits} data credits with {self.available} of {self.limit} unused"
            )
        self.available += credits

    @cython.ccall
    def arrived(self, last: cython.bint = False) -> None:
        """A data message of the peer took one of our buffers (``last``: it
        spent the peer's last credit)."""

    @cython.ccall
    def reposted(self) -> None:
        """The application consumed a data message and its buffer is posted again."""
        self.owed += 1


@cython.cclass
class SharedDataCredits(DataCredits):
    """The data credits a channel on a shared :class:`~aiordma.verbs.srq.ReceivePool` grants.

    Pure logic.

    ``window`` bounds what it grants at once; it starts with ``base`` (taken
    from the pool when it joined) and doubles its ``share`` each time a
    message of the peer says it spent its last credit, as far as the pool
    lends (the receiver cannot tell: credits in flight look the same). It
    keeps what it borrowed until the pool is pressed: then it gives back a
    buffer each time one of its messages is read, down to ``base``.

    ``tokens``: buffers this member owns (granted to the peer, or holding a
    message). ``held``: credits granted (or owed) to the peer whose messages
    have not arrived. ``share``: the tokens it aims for now (``base`` to
    ``window``).
    """

    def __init__(self, window: cython.int, *, pool: ReceivePool, base: cython.int) -> None:
        super().__init__(window)
        if not 1 <= base <= window:
            raise ValueError(f"base ({base}) must be between 1 and window ({window})")
        self.pool = pool
        self.base = base
        self.tokens = self.held = self.share = self.owed = base

    @cython.ccall
    def should_send_update(self) -> cython.bint:
        # As a window of its own returns credits once half of it is owed,
        # with the buffers this member owns now as its window.
        return self.owed >= max(1, self.tokens // 2)

    @cython.ccall
    def arrived(self, last: cython.bint = False) -> None:
        if self.held < 1:
            raise ValueError("peer sent a data message without a credit")
        self.held -= 1
        if last:  # the peer used all it had: lend it more
            self.share = min(self.window, self.share * 2)

    @cython.ccall
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
        tokens: cython.int = self.tokens
        self.tokens = self.held = self.owed = 0
        return tokens
