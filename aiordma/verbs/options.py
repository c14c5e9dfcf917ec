"""A queue pair's settings and the work requests it takes, as values.

:class:`QueuePairOptions` (sizes and transport parameters, checked when
made) and the records of :meth:`QueuePair.post_batch
<aiordma.QueuePair.post_batch>`: :class:`Send`, :class:`Write`,
:class:`Read`. Each layer keeps its settings in one ``options.py``
(:mod:`aiordma.cm.options`, :mod:`aiordma.channel.options`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aiordma._checks import check_int
from aiordma._help import fields_in_help
from aiordma.verbs.memory import Local, RemoteBuffer

__all__ = ["DEFAULT_KEEPALIVE", "QueuePairOptions", "Read", "Send", "SendOp", "Write"]

DEFAULT_KEEPALIVE = 10.0
"""Seconds between a connection's probes of its peer (see ``keepalive``)."""


_RNR_TIMER_MS: Final = (655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32,
                        0.48, 0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36,
                        20.48, 30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68,
                        491.52)  # fmt: skip
"""Milliseconds of each ``min_rnr_timer`` code (the InfiniBand specification's table)."""


@fields_in_help
@dataclass(frozen=True, slots=True)
class QueuePairOptions:
    """Sizes and transport parameters of a queue pair; the defaults suit most uses.

    Each field is checked when the value is made (``TypeError`` or
    ``ValueError`` naming it): the integer fields against what their verbs
    attribute can hold, the depths again against the device when a queue
    pair is created.
    """

    send_depth: int = 128
    """Work requests the send queue holds (at most the device's ``max_qp_wr``)."""
    recv_depth: int = 128
    """Receives the receive queue holds (unused with a shared receive queue)."""
    max_send_sge: int = 4
    """Scatter/gather entries per send, write or read (at most the device's ``max_sge``)."""
    max_recv_sge: int = 4
    """Scatter/gather entries per receive."""
    max_inline: int = 64
    """Sends and writes up to this many bytes are copied into the WQE (no DMA read)."""
    port: int = 1
    """The device's port (1-255)."""
    gid_index: int | None = None
    """Source GID; by default the port's RoCE v2 IPv4 GID."""
    path_mtu: int | None = None
    """``ibv_mtu`` enum value (1=256 ... 5=4096); by default the port's active MTU."""
    max_rd_atomic: int = 16
    """Outstanding RDMA reads/atomics, each way (clamped to the device's limits)."""
    timeout: int = 14
    """Local ACK timeout exponent: 4.096 us * 2**timeout (14 is about 67 ms)."""
    retry_cnt: int = 6
    """Transport retries of an unacknowledged packet before the work fails
    with ``IBV_WC_RETRY_EXC_ERR`` (see :attr:`retry_bound`). Not 7: rxe
    treats 7 as "retry forever", so work on a dead peer would never fail."""
    rnr_retry: int = 6
    """Receiver-not-ready retries before failing (7 would retry forever)."""
    min_rnr_timer: int = 31
    """How long a sender facing our empty receive queue waits per retry, as
    the ``ibv_qp_attr`` code (31, the longest, is about 0.49 s; see
    :attr:`rnr_bound`). A loaded server may post its first receives late."""
    keepalive: float | None = DEFAULT_KEEPALIVE
    """Seconds between a connection's probes of its peer
    (:meth:`~aiordma.QueuePair.post_probe`); a probe the transport gives up on fails
    the connection with :class:`~aiordma.ConnectionLostError`. None: never
    probe (a dead peer is then noticed only by work posted to it)."""

    @property
    def retry_bound(self) -> float:
        """Seconds the transport keeps resending unacknowledged work before
        failing it: ``(retry_cnt + 1) * 4.096 us * 2**timeout`` (about 0.47 s
        for the defaults). A link out for less loses nothing; for longer,
        work in flight fails about this long after the link went, and an
        idle connection within ``keepalive + retry_bound``."""
        return float((self.retry_cnt + 1) * 4.096e-6 * 2**self.timeout)

    @property
    def rnr_bound(self) -> float:
        """Seconds a peer's send waits for us to post a receive before it fails
        with ``IBV_WC_RNR_RETRY_EXC_ERR``: ``rnr_retry`` waits of ``min_rnr_timer``
        (about 2.9 s for the defaults, enough for a loaded server's handler
        to post its first receive; a forgotten receive still fails)."""
        return self.rnr_retry * _RNR_TIMER_MS[self.min_rnr_timer] / 1000

    def __post_init__(self) -> None:
        for name, low, high in _RANGES:
            value = getattr(self, name)
            if value is not None or name not in _OPTIONAL:
                check_int(name, value, low, high)
        if self.keepalive is not None:
            if not isinstance(self.keepalive, int | float) or isinstance(self.keepalive, bool):
                raise TypeError(f"keepalive must be a positive number of seconds or None, "
                                f"not {type(self.keepalive).__name__}")  # fmt: skip
            if not self.keepalive > 0:
                raise ValueError(f"keepalive must be a positive number of seconds or None, "
                                 f"not {self.keepalive!r}")  # fmt: skip


_RANGES: Final = (
    ("send_depth", 1, None), ("recv_depth", 1, None),  # and at most the device's max_qp_wr
    ("max_send_sge", 1, None), ("max_recv_sge", 1, None),  # and at most its max_sge
    ("max_inline", 0, None), ("port", 1, 255), ("gid_index", 0, 255), ("path_mtu", 1, 5),
    ("max_rd_atomic", 1, 255), ("timeout", 0, 31), ("retry_cnt", 0, 7), ("rnr_retry", 0, 7),
    ("min_rnr_timer", 0, 31),
)  # fmt: skip
"""Each integer field's range: what the verbs attribute's bits can hold."""
_OPTIONAL: Final = frozenset({"gid_index", "path_mtu"})


@dataclass(frozen=True, slots=True)
class Send:
    """A send (optionally with 32-bit immediate data) for :meth:`~aiordma.QueuePair.post_batch`.

    ``signaled=False`` asks for no completion entry of its own (selective
    signalling): its future resolves when a later signalled request on the
    same queue pair completes, which saves the adapter a completion and the
    event loop a wake-up. It still fails at once if it fails. See
    :meth:`~aiordma.QueuePair.flush_sends`.
    """

    local: Local
    imm: int | None = None
    inline: bool | None = None
    signaled: bool = True


@dataclass(frozen=True, slots=True)
class Write:
    """An RDMA write (optionally with immediate data) for :meth:`~aiordma.QueuePair.post_batch`.

    ``signaled`` works as for :class:`Send`.
    """

    local: Local
    remote: RemoteBuffer
    imm: int | None = None
    inline: bool | None = None
    signaled: bool = True


@dataclass(frozen=True, slots=True)
class Read:
    """An RDMA read into ``local`` for :meth:`~aiordma.QueuePair.post_batch`."""

    local: Local
    remote: RemoteBuffer


SendOp = Send | Write | Read
"""What :meth:`~aiordma.QueuePair.post_batch` accepts: a :class:`Send`,
:class:`Write` or :class:`Read`."""


def check_imm(imm: int | None) -> None:
    """ValueError unless ``imm`` (a send's or write's immediate data) is None or fits 32 bits."""
    if imm is not None and not 0 <= imm < 1 << 32:
        raise ValueError("immediate data must fit in 32 bits (0 <= imm < 2**32)")


def atomic_word(value: int, name: str) -> int:
    """An atomic operand as the 64-bit word the adapter takes (a negative one
    in two's complement, so ``atomic_fetch_add(r, -1)`` subtracts)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not -(1 << 63) <= value < 1 << 64:
        raise ValueError(f"{name} ({value}) does not fit the 64-bit word atomics work on")
    return value & ((1 << 64) - 1)
