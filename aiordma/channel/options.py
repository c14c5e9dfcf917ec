"""A message channel's options, checked when made and again before anything connects.

:class:`ChannelOptions` holds :class:`~aiordma.MessageChannel`'s keyword
arguments, each checked when the value is made (``TypeError`` or
``ValueError`` naming it); :meth:`ChannelOptions.layout` checks them
against the queue pair's sizes (or a shared receive queue) and resolves
the defaults that depend on those. :func:`~aiordma.open_channel`,
:func:`~aiordma.start_channel_server` and the layers above them call it
before connecting, so a bad option never makes a connection that fails
during set-up; the channel calls it again with its queue pair's actual
sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict

from aiordma._checks import check_int, check_seconds
from aiordma._help import fields_in_help
from aiordma.channel.credits import CONTROL_BASE
from aiordma.channel.registrations import DEFAULT_CAPACITY
from aiordma.channel.ring import check_size
from aiordma.channel.sizing import MIN_READ_PIECE
from aiordma.channel.wire import MIN_BUFFER, Hello

DEFAULT_WINDOW = 32
MIN_WINDOW = 2
"""Data receive buffers a channel needs at least: one may wait for the
application while the other takes the credit update that frees it."""
DEFAULT_CONTROL_WINDOW = 8
DEFAULT_BUFFER = 8192
MAX_BUFFER = 1 << 30
"""The largest receive buffer (and send slot) a channel may have: larger
packets would only delay the first byte (large bodies go by rendezvous)."""
SHARED_SEND_SLOTS = 8
"""Send slots of a channel receiving from a shared queue, by default: few,
since such a channel is one of many (a channel of its own has one per
receive buffer)."""
DEFAULT_MAX_MESSAGE = 64 << 20
DEFAULT_MEDIUM_LIMIT = 256 << 10
"""Bodies up to this size (above the eager limit) are copied through the
registered slots in pieces, by default; larger ones go by rendezvous
(docs/decisions/0006)."""
DEFAULT_RING = 0
"""Bytes of receive ring a channel of its own exposes to its peer, by
default (and as much staging for its own records): none yet. Records cost
one work request and one completion per side, but until their path is
compiled they cost more time than the pieces they replace
(``docs/decisions/0029-one-write-per-message.md``)."""
RING_SIZE = 512 << 10
"""The ring the record measured (``ring_size=RING_SIZE``): medium messages
up to 128 KiB less a header as one RDMA write each."""
DEFAULT_READ_AHEAD = 16 << 20
"""The largest message read before it is asked for, by default (the next
one queued, while the application takes large messages as new objects;
``docs/decisions/0028-large-read-ahead.md``)."""
DEFAULT_REGISTRATION_CACHE = DEFAULT_CAPACITY
"""Bytes of plain buffers a channel keeps registered each way
(:mod:`aiordma.channel.registrations`)."""
DEFAULT_MAX_EXPOSED = 256 << 20
"""Bytes of large messages a channel holds exposed at once, by default
(raised to ``max_message`` when that is larger)."""
DEFAULT_EXPOSURE_TIMEOUT = 60.0
"""Seconds a large message stays readable for the peer, by default; unread
by then, it is revoked and the send fails with :class:`ExposureTimeoutError`."""


class Layout(NamedTuple):
    """The options resolved for one queue pair: what the channel allocates."""

    buffer_size: int
    window: int
    control_window: int
    send_slots: int
    max_exposed: int
    hello: Hello
    """Our HELLO's head: the buffer size and protocol name (the ring is
    added once it is bound)."""
    ring: int
    """Bytes of receive ring, and of staging for this side's records (0: none)."""


@fields_in_help
@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelOptions:
    """How a :class:`~aiordma.MessageChannel` is sized and what it carries.

    Every field may also be given to the channel (and to the functions
    that make one) as a keyword argument; :meth:`of` checks their names.
    The values are checked when made (``dataclasses.replace`` included),
    those that depend on the queue pair again by :meth:`layout`.
    """

    window: int = DEFAULT_WINDOW
    """Data receive buffers posted (at least 2); each is a credit the peer
    spends. On a :class:`~aiordma.SharedReceiveQueue`, what the channel may
    borrow from the pool."""
    control_window: int | None = None
    """Receive buffers for control packets (at least 4; 8 by default, 4 on
    a shared queue)."""
    buffer_size: int | None = None
    """Bytes of each receive buffer and send slot (at least 128; 8 KiB by
    default; a shared queue's own). Each side announces it in its HELLO,
    and neither sends a packet larger than the other's, so the two need
    not match."""
    max_message: int = DEFAULT_MAX_MESSAGE
    """The largest message this side accepts, announced to the peer:
    larger sends raise :class:`~aiordma.MessageTooLargeError` on its side."""
    max_exposed: int | None = None
    """Bytes of large messages held exposed to the peer at once (further
    large sends wait); 256 MiB or ``max_message`` if larger by default."""
    exposure_timeout: float | None = DEFAULT_EXPOSURE_TIMEOUT
    """Seconds a large message stays readable for the peer (None or
    infinity: until read); unread by then it is revoked."""
    send_slots: int | None = None
    """Packets in flight: as many as receive buffers by default, 8 on a
    shared queue."""
    protocol: str = ""
    """What the channel carries (``""``: plain messages, any peer). Both
    sides announce it; when both name one and they differ, the channel
    fails on both sides with :class:`~aiordma.ProtocolMismatchError`."""
    medium_limit: int = DEFAULT_MEDIUM_LIMIT
    """Bodies larger than one packet and at most this size (0: none),
    registered memory included, are copied, not exposed: as one RECORD
    written into the peer's ring when it holds it (see ``ring_size``), else
    through the registered slots in several packets, against the same
    credits; larger ones go by rendezvous."""
    ring_size: int = DEFAULT_RING
    """Bytes of receive ring this side exposes to its peer alone, for
    writing only (0: none, as on a shared receive queue), and of staging
    for its own records: a message up to a quarter of the peer's ring (and
    ``medium_limit``) is one RDMA write into it. A multiple of 64 from 256
    bytes to 4 MiB less 64; none by default for now (``RING_SIZE``, 512 KiB,
    is the one measured)."""
    registration_cache: int = DEFAULT_REGISTRATION_CACHE
    """Bytes of plain buffers each way whose registration is kept for the
    next large message (0: none; least recently used evicted first; see
    ``MessageChannel.forget_buffer``)."""
    read_piece: int | None = None
    """Large messages are read in RDMA reads of this many bytes (at least
    4096), four at a time; None: by the path, 1 MiB from a peer on the same
    device, 64 KiB across a wire (where larger reads lose more to a lossy link)."""
    read_ahead: int = DEFAULT_READ_AHEAD
    """While the application takes large messages as new objects
    (``recv_message``), the next one queued is read before it is asked for
    if it is at most this many bytes (16 MiB by default; 0: never)."""

    def __post_init__(self) -> None:
        timeout = check_seconds("exposure_timeout", self.exposure_timeout, zero=False)
        object.__setattr__(self, "exposure_timeout", timeout)
        self.layout(None, None, None)

    @classmethod
    def of(cls, options: Mapping[str, Any], base: ChannelOptions | None = None) -> ChannelOptions:
        """The options given as keywords (over ``base``'s); TypeError for an unknown one."""
        unknown = sorted(set(options) - _NAMES)
        if unknown:
            raise TypeError(f"unknown MessageChannel option(s): {', '.join(unknown)}")
        return cls(**options) if base is None else dataclasses.replace(base, **options)

    def layout(
        self, recv_depth: int | None, send_depth: int | None, shared_buffer_size: int | None
    ) -> Layout:
        """Check every option; resolve the defaults that depend on the queue pair.

        ``recv_depth``/``send_depth`` are the queue pair's (None: not known
        yet, not checked); ``shared_buffer_size`` is the shared receive
        queue's buffer size when the channel draws on one. ValueError (or
        TypeError) names the first option that cannot work.
        """
        for name in (
            "window",
            "max_message",
            "medium_limit",
            "registration_cache",
            "read_ahead",
            "ring_size",
        ):
            check_int(name, getattr(self, name))
        if self.ring_size:
            try:
                check_size(self.ring_size)
            except ValueError as exc:
                raise ValueError(f"ring_size: {exc}") from None
        for name in ("control_window", "buffer_size", "max_exposed", "send_slots", "read_piece"):
            value = getattr(self, name)
            if value is not None:
                check_int(name, value)
        if not isinstance(self.protocol, str):
            raise TypeError(f"protocol must be a str, not {type(self.protocol).__name__}")
        max_exposed = check_limits(self.max_message, self.max_exposed, self.exposure_timeout)
        if self.medium_limit < 0:
            raise ValueError(f"medium_limit must not be negative, not {self.medium_limit}")
        if self.registration_cache < 0:
            raise ValueError(
                f"registration_cache must not be negative, not {self.registration_cache}"
            )
        if self.read_ahead < 0:
            raise ValueError(f"read_ahead must not be negative, not {self.read_ahead}")
        if self.read_piece is not None and self.read_piece < MIN_READ_PIECE:
            raise ValueError(
                f"read_piece must be at least {MIN_READ_PIECE} bytes, not {self.read_piece}"
            )
        if self.window < MIN_WINDOW:
            raise ValueError(f"window must be at least {MIN_WINDOW} buffers, not {self.window}")
        if shared_buffer_size is not None:
            if self.buffer_size is not None and self.buffer_size != shared_buffer_size:
                raise ValueError(
                    f"buffer_size ({self.buffer_size}) must be that of the shared receive "
                    f"queue the connection receives from ({shared_buffer_size}), or left out"
                )
            buffer_size = shared_buffer_size
            control_window = CONTROL_BASE if self.control_window is None else self.control_window
            slots: int | None = SHARED_SEND_SLOTS if self.send_slots is None else self.send_slots
        else:
            buffer_size = DEFAULT_BUFFER if self.buffer_size is None else self.buffer_size
            control_window = (
                DEFAULT_CONTROL_WINDOW if self.control_window is None else self.control_window
            )
            slots = self.send_slots
        check_int("buffer_size", buffer_size, MIN_BUFFER, MAX_BUFFER)
        if control_window < CONTROL_BASE:
            raise ValueError(
                f"control_window must be at least {CONTROL_BASE} buffers, not {control_window}"
            )
        hello = Hello(buffer_size, self.protocol)
        hello.pack()  # a name too long fails here
        buffers = self.window + control_window
        send_slots = buffers if slots is None else slots
        if send_slots < 1:
            raise ValueError(f"send_slots must be at least 1, not {send_slots}")
        if shared_buffer_size is None and recv_depth is not None and buffers > recv_depth:
            raise ValueError(
                f"window + control_window ({buffers}) exceeds the queue pair's "
                f"receive depth ({recv_depth})"
            )
        if send_depth is not None and send_slots > send_depth:
            raise ValueError(
                f"send_slots ({send_slots}, by default window + control_window) exceeds "
                f"the queue pair's send depth ({send_depth})"
            )
        ring = self.ring_size if shared_buffer_size is None else 0
        return Layout(
            buffer_size, self.window, control_window, send_slots, max_exposed, hello, ring
        )


_NAMES = frozenset(field.name for field in dataclasses.fields(ChannelOptions))


class TuningKeywords(TypedDict, total=False):  # (a TypedDict cannot be made from a dataclass)
    """:class:`ChannelOptions`' fields but ``protocol``, as keyword arguments
    (for typing ``**``): what a layer that sets the protocol itself lets its
    callers tune."""

    window: int
    control_window: int | None
    buffer_size: int | None
    max_message: int
    max_exposed: int | None
    exposure_timeout: float | None
    send_slots: int | None
    medium_limit: int
    ring_size: int
    registration_cache: int
    read_piece: int | None
    read_ahead: int


class ChannelKeywords(TuningKeywords, total=False):
    """:class:`ChannelOptions`' fields as keyword arguments (for typing ``**``)."""

    protocol: str


def check_limits(max_message: int, max_exposed: int | None, exposure_timeout: float | None) -> int:
    """The effective ``max_exposed``; ValueError for limits that cannot work together."""
    if max_message < 1:
        raise ValueError(f"max_message must be at least 1 (byte), not {max_message}")
    if exposure_timeout is not None and exposure_timeout <= 0:
        raise ValueError("exposure_timeout must be positive (or None)")
    if max_exposed is None:
        return max(DEFAULT_MAX_EXPOSED, max_message)
    if max_exposed < max_message:
        raise ValueError(
            f"max_exposed ({max_exposed}) must be at least max_message ({max_message}), "
            "or a message of max_message bytes could never be sent"
        )
    return max_exposed
