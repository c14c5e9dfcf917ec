"""The bytes this side of a channel holds exposed to its peer (pure logic).

A large message stays readable by the peer from its announcement until the
peer's DONE: read, or the answer to its REVOKE (the peer may be reading a
message when its sender withdraws it, so a revoked one stays counted until
then). :class:`Ledger` counts those bytes under ``max_exposed`` and hands
out message ids; :class:`~aiordma.channel.rendezvous.Exposures` does the
I/O (keys, timers, futures) and asks it what each event means.

Call order of one message: ``expose -> (done | revoke -> (done |
forget_revoked))``, or ``expose -> withdraw`` when its announcement could
not be sent; ``clear`` ends every one.
"""

from __future__ import annotations

import itertools

from aiordma.exceptions import ProtocolError


class Ledger:
    """Exposed and revoked large messages of one side, by message id."""

    def __init__(self, max_exposed: int) -> None:
        self.max_exposed = max_exposed
        self.exposed: dict[int, int] = {}
        """Sizes of the messages exposed and not revoked, by id."""
        self.revoked: dict[int, int] = {}
        """Sizes of the messages this side revoked, by id: readable until the
        peer's DONE answers the REVOKE."""
        self.exposed_bytes = 0
        """Bytes readable by the peer now (revoked messages included)."""
        self._ids = itertools.count(1)

    def room_for(self, size: int) -> bool:
        """Whether ``size`` more bytes may be exposed under ``max_exposed``."""
        return self.exposed_bytes + size <= self.max_exposed

    def expose(self, size: int) -> int:
        """Count a large message of ``size`` bytes as exposed; returns its id."""
        msg_id = next(self._ids)
        self.exposed[msg_id] = size
        self.exposed_bytes += size
        return msg_id

    def done(self, msg_id: int) -> None:
        """The peer's DONE for ``msg_id``: it read the message, or answered its
        revocation; its bytes stop counting. Raises :class:`ProtocolError`
        for a message this side does not hold exposed."""
        size = self.exposed.pop(msg_id, None)
        if size is None:
            size = self.revoked.pop(msg_id, None)
        if size is None:
            raise ProtocolError(f"DONE for message {msg_id}, which is not exposed")
        self.exposed_bytes -= size

    def withdraw(self, msg_id: int) -> bool:
        """The send of ``msg_id`` failed before the peer learnt of it: forget it.
        Returns False if it was not exposed."""
        size = self.exposed.pop(msg_id, None)
        if size is None:
            return False
        self.exposed_bytes -= size
        return True

    def revoke(self, msg_id: int) -> bool:
        """Revoke an unread message: it stays readable (and counted) until the
        peer's DONE answers the REVOKE. Returns False if it had already ended."""
        size = self.exposed.pop(msg_id, None)
        if size is None:
            return False
        self.revoked[msg_id] = size
        return True

    def forget_revoked(self, msg_id: int) -> bool:
        """The peer did not answer a REVOKE in time: the exposure ends anyway.
        Returns False if the answer came."""
        size = self.revoked.pop(msg_id, None)
        if size is None:
            return False
        self.exposed_bytes -= size
        return True

    def clear(self) -> list[int]:
        """The channel failed: every exposure ends, revoked ones too. Returns their ids."""
        ids = [*self.exposed, *self.revoked]
        self.exposed.clear()
        self.revoked.clear()
        self.exposed_bytes = 0
        return ids
