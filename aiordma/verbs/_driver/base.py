"""The compile boundary: what the verbs layer asks of a driver, whichever one runs.

Two implementations satisfy these Protocols: :mod:`.pure` over pyverbs'
Python API, and the compiled core (``_core.pyx``) over the C handles of the
same pyverbs objects. :mod:`aiordma.verbs._driver` picks one per CQ, QP and
SRQ, once; callers never ask which they got. Every ``post_*`` returns 0 or
the provider's errno and raises nothing for a refused post; the caller
undoes its book-keeping and raises.

Call order of a CQ driver: ``attach -> (on_readable | serve | take_event | req_notify
| drain | spin)* -> detach``, before pyverbs closes the CQ; likewise ``post_* -> detach``
for QP and SRQ drivers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

POLL_BATCH: Final = 16
"""Completions taken from the CQ per poll."""
ACK_BATCH: Final = 64
"""Channel events the pure driver acknowledges at once (the compiled one
acknowledges each as it takes it)."""


class Report(Protocol):
    """Told of a handler that raised (``exc``), or of a completion nobody registered."""

    def __call__(self, exc: Exception | None, wc: Any) -> None: ...


class CQDriver(Protocol):
    """Events, arming and draining of one completion queue."""

    compiled: bool
    """Whether C does this work (for ``aiordma info`` and the tests, never for branching)."""
    armed: bool
    """Whether the next completion raises a channel event (set by :meth:`req_notify`,
    cleared by each event taken: one event per arming)."""
    polling: bool
    """Set while the CQ's owner polls: :meth:`serve` then leaves the CQ unarmed."""
    received: int
    """Successful receive completions handed out so far."""
    arms: int
    """Times the CQ was armed so far."""
    completions: int
    """Completions handed out so far (failed ones included)."""
    wakeups: int
    """Channel events taken so far: each is one wake-up of the loop for this CQ."""

    def attach(
        self, handlers: dict[int, Any], report: Report, budget: int, more: Callable[[], None]
    ) -> None:
        """What :meth:`serve` uses: the handlers by ``wr_id``, the report,
        the completions handled per call, and what to call when they run out."""

    def on_readable(self) -> None:
        """The loop's reader callback for the channel's descriptor: ``serve(True)``."""

    def serve(self, event: bool) -> int:
        """One wake-up: take an event (if ``event``), drain until empty, arm
        if neither armed nor polling and drain again; ``more()`` instead once the budget is
        spent. How many completions were handled."""

    def take_event(self) -> bool:
        """Consume one channel event if one is pending; whether one was."""

    def req_notify(self) -> None:
        """Arm the CQ: the next completion raises a channel event."""

    def drain(self, handlers: dict[int, Any], budget: int, report: Report) -> tuple[int, bool]:
        """Hand each completion to ``handlers.pop(wr_id).complete(wc)`` until the CQ
        is empty or about ``budget`` are handled: ``(handled, empty)``."""

    def spin(self, seconds: float) -> bool:
        """Poll without running Python for up to ``seconds``; whether a completion came."""

    def detach(self) -> None:
        """Stop using the CQ (before pyverbs closes it)."""


class QPDriver(Protocol):
    """Posting on one queue pair."""

    compiled: bool
    sends: int
    """Send-queue work requests posted so far (sends, writes, reads, atomics)."""
    receives: int
    """Receives posted so far on the QP's own receive queue."""
    doorbells: int
    """Posts of one or more send-queue requests (one ``ibv_post_send`` each)."""

    def post_sends(self, requests: Sequence[tuple[Any, ...]]) -> int:
        """Post ``(wr_id, opcode, flags, imm, segments, remote_addr, rkey,
        compare_add, swap)`` requests as one linked list (``imm`` in host order)."""

    def post_table(
        self, first_id: int, ring: int, opcode: int, table: Any, start: int, count: int
    ) -> int:
        """Post records ``start .. start + count`` of a one-sided table
        (:mod:`aiordma.bulk_table`) as one linked list, only the last
        signalled; record ``r`` gets ``wr_id`` ``first_id + r % ring``."""

    def post_send(
        self,
        wr_id: int,
        opcode: int,
        flags: int,
        addr: int,
        length: int,
        lkey: int,
        imm: int = 0,
        remote_addr: int = 0,
        rkey: int = 0,
    ) -> int:
        """Post one request (not an atomic) with one buffer (``imm`` in host order)."""

    def post_send_list(
        self, ids: list[int], flags: list[int], addrs: list[int], lengths: list[int], lkey: int
    ) -> tuple[int, int]:
        """Post plain sends of one buffer each (all with ``lkey``) as one
        linked list, one doorbell: ``(errno, posted)``, 0 and their number,
        or the provider's errno and how many went before the one it refused."""

    def post_recv(self, wr_id: int, addr: int, length: int, lkey: int) -> int:
        """Post one receive into one buffer."""

    def post_recvs(self, requests: Sequence[tuple[int, Sequence[Any]]]) -> int:
        """Post ``(wr_id, segments)`` receives as one linked list."""

    def detach(self) -> None:
        """Stop using the QP (before pyverbs destroys it)."""


class SRQDriver(Protocol):
    """Posting on one shared receive queue."""

    compiled: bool
    receives: int
    """Receives posted so far."""

    def post_recv(self, wr_id: int, addr: int, length: int, lkey: int) -> int:
        """Post one receive into one buffer."""

    def detach(self) -> None:
        """Stop using the SRQ (before pyverbs destroys it)."""
