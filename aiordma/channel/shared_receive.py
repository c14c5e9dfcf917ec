"""Receive buffers that the message channels of many connections share.

Without it, every message channel posts its own receive buffers, sized for
its busiest moment: 40 buffers of 8 KiB per connection by default, most of
them idle at any time. A :class:`SharedReceiveQueue` is one pool of
buffers on a verbs shared receive queue
(:class:`~aiordma.verbs.srq.SharedReceiveRing`); the queue pairs of
connections made with it take their receives from there.

Flow control stays credit-based (see :class:`aiordma.verbs.srq.ReceivePool`):
each channel owns a few buffers for as long as it lives (``base_credits``
for data, plus its control window), borrows free buffers while its peer
uses every credit it has, and gives them back as the peer slows down or
when another channel needs them. A channel never grants a credit without a
buffer behind it, so a sender never meets an empty receive queue (no
receiver-not-ready retries), and a slow reader still holds its own sender
back: what it has not read keeps its buffers, and nothing more is granted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from aiordma.channel.credits import CONTROL_BASE, SharedDataCredits
from aiordma.channel.wire import HEADER_SIZE
from aiordma.verbs.srq import DEFAULT_BUFFER_SIZE, DEFAULT_BUFFERS, RingArrived, SharedReceiveRing

if TYPE_CHECKING:
    from aiordma.verbs.device import Device
    from aiordma.verbs.queue_pair import QueuePair

DEFAULT_BASE_CREDITS: Final = 2
"""Data credits each channel keeps for as long as it lives, whatever the others do."""


class SharedReceiveQueue(SharedReceiveRing):
    """A pool of ``buffers`` receive buffers of ``buffer_size`` bytes on one
    shared receive queue, for the message channels of many connections.

    Pass it as ``shared_receive=`` to :func:`aiordma.start_channel_server`,
    :func:`aiordma.open_channel` (or, lower down, to
    :func:`aiordma.start_server`/:func:`aiordma.connect` with a channel made
    in ``prepare``): those connections' queue pairs receive from it, and
    their channels use it. Each channel needs ``base_credits`` plus its
    control window (4) buffers while it lives; a connection arriving when
    the pool cannot give them is refused (:class:`ResourceBusyError`).

    Create it on the loop that runs the connections, on their device (the
    shared default device by default). Close it after them: ``close()``
    refuses new connections at once and releases everything once the last
    queue pair using it is gone (await :meth:`wait_closed`); :meth:`aclose`
    and ``async with`` close those queue pairs too.
    """

    def __init__(
        self,
        device: Device | None = None,
        *,
        buffers: int = DEFAULT_BUFFERS,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        base_credits: int = DEFAULT_BASE_CREDITS,
    ) -> None:
        if buffer_size <= HEADER_SIZE:
            raise ValueError(f"buffer_size must exceed the {HEADER_SIZE}-byte message header")
        if base_credits < 1:
            raise ValueError("base_credits must be at least 1")
        self.base_credits = base_credits
        super().__init__(
            device, buffers=buffers, buffer_size=buffer_size, least=base_credits + CONTROL_BASE
        )

    def join(
        self, qp: QueuePair, arrived: RingArrived, failed: Callable[[BaseException], None],
        window: int, control_window: int,
    ) -> SharedDataCredits:  # fmt: skip
        """Let the channel on ``qp`` draw on the pool: its packets go to
        ``arrived``, and ``failed`` is told when its queue pair closes.

        Takes its base and control buffers (ResourceBusyError if the pool has
        not that many free); returns the credits it grants its peer.
        """
        base = self.base_credits
        credits = SharedDataCredits(max(window, base), pool=self.credits, base=base)
        self.attach(
            qp, arrived, failed, base + control_window, lambda: credits.leave() + control_window
        )
        return credits
