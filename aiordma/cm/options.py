"""How a connection is set up: one typed value each side, checked when made.

:class:`ConnectOptions` holds what the active side needs (the device,
queue-pair options, authentication, a shared receive queue, private data
and a timeout), :class:`ServeOptions` what a server needs (the same first
four for every connection it accepts, then its accept hook, backlog,
handshake timeout and shutdown grace). Both are frozen and checked in
``__init__``, so a bad setting is a ``TypeError`` or ``ValueError`` naming
it before anything connects; every layer passes the value whole.

The public functions (:func:`aiordma.connect`, :func:`aiordma.open_channel`,
:func:`aiordma.rpc.connect`, the servers, streams and transfer agents) take
the same settings as keyword arguments, typed by :class:`ConnectKeywords`
and :class:`ServeKeywords`, and build the value once: ``take`` takes a
function's keywords apart into the value and the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Self, TypedDict

from aiordma._checks import check_int, check_seconds, check_type
from aiordma._help import fields_in_help
from aiordma.cm import _rdmacm
from aiordma.cm._setup import check_private_data, check_shared_receive
from aiordma.cm.auth import REQUEST_SIZE, PresharedKey, as_key
from aiordma.verbs.device import Device
from aiordma.verbs.options import QueuePairOptions

if TYPE_CHECKING:
    from aiordma.verbs.srq import SharedReceiveRing

DEFAULT_CONNECT_TIMEOUT: Final = 10.0
"""Seconds :func:`aiordma.connect` waits for the whole set-up, by default."""
DEFAULT_BACKLOG: Final = 128
"""Connection requests a listener queues before rdma_cm refuses more."""
DEFAULT_HANDSHAKE_TIMEOUT: Final = 10.0
"""Seconds an accepted request may take to become established, by default."""
DEFAULT_SHUTDOWN_GRACE: Final = 5.0
"""Seconds a connection handler may keep running after ``close_clients()``
closed its connection, before it is cancelled."""


@dataclass(frozen=True, slots=True)
class ConnectionRequest:
    """What a server's ``accept`` callback decides on."""

    peer_address: tuple[str, int]
    local_address: tuple[str, int]
    private_data: bytes
    """The client's private data, zero-padded by rdma_cm to 56 bytes."""


Accept = Callable[[ConnectionRequest], "bytes | Awaitable[bytes | None] | None"]
"""Returns the private data to accept with (``None``: none) or raises
:class:`~aiordma.RejectConnection`."""


@fields_in_help
@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointOptions:
    """What every connection of one side is made with (the fields both
    :class:`ConnectOptions` and :class:`ServeOptions` have)."""

    device: Device | None = None
    """The device to use (it must be the one the route goes through); None:
    :meth:`~aiordma.Device.shared` of the route's device."""
    options: QueuePairOptions | None = None
    """The queue pair's sizes and attributes (None: the defaults)."""
    auth: PresharedKey | bytes | None = None
    """A pre-shared key (or its bytes) both peers must prove they hold
    before anything is sent (see the security guide); kept as a
    :class:`~aiordma.PresharedKey`."""
    shared_receive: SharedReceiveRing | None = None
    """A :class:`~aiordma.SharedReceiveQueue` every queue pair receives from,
    on its device (a message channel then draws its buffers from it)."""

    def __post_init__(self) -> None:
        if self.device is not None:
            check_type("device", self.device, Device, "an aiordma.Device (or None)")
        if self.options is not None:
            check_type("options", self.options, QueuePairOptions,
                       "aiordma.QueuePairOptions (or None)")  # fmt: skip
        object.__setattr__(self, "auth", as_key(self.auth))
        check_shared_receive(self.shared_receive, self.device)

    @property
    def key(self) -> PresharedKey | None:
        """:attr:`auth` as the key it was made into."""
        assert not isinstance(self.auth, bytes)  # __post_init__ made it a key
        return self.auth

    @classmethod
    def take(cls, keywords: Mapping[str, Any]) -> tuple[Self, dict[str, Any]]:
        """This class's fields taken out of a function's ``keywords``, as the
        value (checked), and the keywords left for the layer above."""
        names = _FIELDS[cls]
        mine = {name: value for name, value in keywords.items() if name in names}
        rest = {name: value for name, value in keywords.items() if name not in names}
        return cls(**mine), rest

    @classmethod
    def of(cls, keywords: Mapping[str, Any], caller: str) -> Self:
        """The value made of a public function's ``keywords``, every one of them
        a field of this class (``caller`` names that function in the
        TypeError for any other, which says where each belongs)."""
        unknown = sorted(set(keywords) - _FIELDS[cls])
        if unknown:
            raise unexpected_keywords(cls, unknown, caller)
        return cls(**keywords)


@fields_in_help
@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectOptions(EndpointOptions):
    """How the active side connects (see :func:`aiordma.connect`)."""

    private_data: bytes = b""
    """Bytes the server's ``accept`` sees: at most 56, 35 with ``auth``."""
    timeout: float | None = DEFAULT_CONNECT_TIMEOUT
    """Seconds for the whole set-up (None or infinity: no bound; 0 or less:
    expired already)."""

    def __post_init__(self) -> None:
        super(ConnectOptions, self).__post_init__()
        limit = _rdmacm.MAX_CONNECT_DATA - (REQUEST_SIZE if self.auth is not None else 0)
        data = check_private_data(self.private_data, limit, "connect")
        object.__setattr__(self, "private_data", data)
        object.__setattr__(self, "timeout", check_seconds("timeout", self.timeout, expired=True))


@fields_in_help
@dataclass(frozen=True, slots=True, kw_only=True)
class ServeOptions(EndpointOptions):
    """How a server accepts (see :func:`aiordma.start_server`); the first
    four fields apply to every connection it accepts."""

    accept: Accept | None = None
    """``accept(request)`` decides on each :class:`ConnectionRequest`: return
    private data (or None) to accept, raise
    :class:`~aiordma.RejectConnection` to refuse."""
    backlog: int = DEFAULT_BACKLOG
    """Connection requests queued before rdma_cm refuses more (1 to
    2**31 - 1). As for a socket, the kernel caps it: rdma_ucm at its
    ``max_backlog`` (``/proc/sys/net/rdma_ucm/max_backlog``, 1024 by default)."""
    handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT
    """Seconds an accepted client has to confirm (and, with ``auth``, to
    prove its key); None or infinity: no bound."""
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    """Seconds a handler may run on after ``close_clients()`` closed its
    connection, before it is cancelled."""

    def __post_init__(self) -> None:
        super(ServeOptions, self).__post_init__()
        if self.accept is not None and not callable(self.accept):
            raise TypeError(f"accept must be callable (or None), not {self.accept!r}")
        check_int("backlog", self.backlog, 1, _MAX_C_INT)
        handshake = check_seconds("handshake_timeout", self.handshake_timeout, zero=False)
        object.__setattr__(self, "handshake_timeout", handshake)
        check_seconds("shutdown_grace", self.shutdown_grace, bound=False)


_MAX_C_INT: Final = 2**31 - 1


_FIELDS: Final = {
    cls: frozenset(field.name for field in dataclasses.fields(cls))
    for cls in (EndpointOptions, ConnectOptions, ServeOptions)
}


_QP_FIELDS: Final = frozenset(field.name for field in dataclasses.fields(QueuePairOptions))


def unexpected_keywords(
    kind: type[EndpointOptions], names: list[str], caller: str, *,
    also: frozenset[str] = frozenset(), elsewhere: Mapping[str, str] | None = None,
) -> TypeError:  # fmt: skip
    """The TypeError for ``names``, keywords that ``caller`` (taking ``kind``'s
    fields and ``also``) does not take: each is said to be the other side's
    setting, a queue pair's, what ``elsewhere`` says of it, or none of these."""
    other = ServeOptions if kind is ConnectOptions else ConnectOptions
    side = "a server's" if other is ServeOptions else "a client's"
    mine = "a client's" if kind is ConnectOptions else "a server's"
    hints = []
    for name in names:
        said = []
        if elsewhere and name in elsewhere:
            said.append(elsewhere[name])
        if name in _FIELDS[other]:
            said.append(f"{side} setting ({other.__name__}), not {mine}")
        if name in _QP_FIELDS:
            said.append(f"a queue pair setting: pass options=aiordma.QueuePairOptions({name}=...)")
        hints.append(f"{name} is {'; or '.join(said)}" if said else f"{name} is unknown")
    known = ", ".join(sorted(_FIELDS[kind] | also))
    return TypeError(
        f"{caller}() got unexpected keyword argument(s): {'; '.join(hints)} (it takes {known})"
    )


class EndpointKeywords(TypedDict, total=False):  # (a TypedDict cannot be made from a dataclass)
    """:class:`EndpointOptions`' fields as keyword arguments (for typing ``**``;
    ``tests/cm/test_options.py`` holds the two equal)."""

    device: Device | None
    options: QueuePairOptions | None
    auth: PresharedKey | bytes | None
    shared_receive: SharedReceiveRing | None


class ConnectKeywords(EndpointKeywords, total=False):
    """:class:`ConnectOptions`' fields as keyword arguments."""

    private_data: bytes
    timeout: float | None


class ServeKeywords(EndpointKeywords, total=False):
    """:class:`ServeOptions`' fields as keyword arguments."""

    accept: Accept | None
    backlog: int
    handshake_timeout: float | None
    shutdown_grace: float


__all__ = [
    "DEFAULT_BACKLOG",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_SHUTDOWN_GRACE",
    "Accept",
    "ConnectKeywords",
    "ConnectOptions",
    "ConnectionRequest",
    "EndpointKeywords",
    "EndpointOptions",
    "ServeKeywords",
    "ServeOptions",
    "unexpected_keywords",
]
