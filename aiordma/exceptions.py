"""Exception hierarchy shared by every aiordma layer.

Everything aiordma raises on its own account derives from :class:`RdmaError`.
Where asyncio users expect a builtin (``ConnectionRefusedError``,
``TimeoutError``, ``ValueError`` for bad arguments), the aiordma class also
derives from that builtin so either ``except`` works.
"""

from __future__ import annotations

import copy
from types import TracebackType
from typing import Any


class RdmaError(Exception):
    """Base class of every error aiordma raises on its own account.

    Its subclasses copy and pickle whole (their own attributes included),
    whatever their constructors take: errors cross processes in Dask and Ray.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(
    cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]
) -> BaseException:
    """An error of ``cls`` with ``args`` and attributes ``state``, made without
    its constructor (whose parameters need not be its ``args``)."""
    error = cls.__new__(cls, *args)
    (OSError if issubclass(cls, OSError) else BaseException).__init__(error, *args)
    error.__dict__.update(state)
    return error


def again(error: BaseException, tb: TracebackType | None) -> BaseException:
    """A copy of ``error``, with traceback ``tb``, to raise once more.

    An object that fails keeps its error and raises it at every later use:
    raising the one instance each time would hang on it every frame it
    passed through (and the objects those frames hold, the failed object
    among them), a reference cycle only the collector breaks.
    """
    try:
        fresh = copy.copy(error)
    except Exception:  # an error that cannot be copied is raised itself
        return error.with_traceback(tb)
    fresh.__cause__ = error.__cause__
    fresh.__context__ = error.__context__
    fresh.__suppress_context__ = error.__suppress_context__
    return fresh.with_traceback(tb)


class LabError(RdmaError):
    """The lab could not provide a real RDMA device."""


class DeviceError(RdmaError, OSError):
    """A verbs call on a device failed; ``errno`` says why."""


class MemoryLimitError(DeviceError, MemoryError):
    """Memory could not be registered (pinned): the usual cause is the
    locked-memory limit (``ulimit -l``) of a process without ``CAP_IPC_LOCK``.

    ``requested`` is the size of the registration that failed, ``registered``
    what the device already had registered by this process, and ``limit`` the
    process's locked-memory limit in bytes (None: unlimited or unknown).
    """

    def __init__(self, message: str, requested: int, registered: int, limit: int | None) -> None:
        super().__init__(12, message)  # ENOMEM
        self.requested = requested
        self.registered = registered
        self.limit = limit


class WrongLoopError(RdmaError, RuntimeError):
    """An object bound to one event loop was used from another."""


class ResourceClosedError(RdmaError):
    """The device, queue pair or memory region has been closed."""


class NotPreparedError(RdmaError, AttributeError):
    """``Connection.prepared`` was read on a connection made without a ``prepare`` hook."""


class ResourceBusyError(RdmaError):
    """The resource still has work requests in flight that use it."""


class CompletionError(RdmaError):
    """A work request completed with an error status.

    ``status`` is the ``ibv_wc_status`` number and ``status_name`` its name
    (``"IBV_WC_REM_ACCESS_ERR"``...), ``vendor_err`` the adapter's own code,
    ``opcode`` the work request's kind and ``wr_id`` its identifier.
    """

    def __init__(
        self, status: int, status_name: str, vendor_err: int, opcode: str, wr_id: int
    ) -> None:
        self.status = status
        self.status_name = status_name
        self.vendor_err = vendor_err
        self.opcode = opcode
        self.wr_id = wr_id
        message = f"{opcode} failed: {status_name} (status {status}, vendor error {vendor_err:#x})"
        hint = _HINTS.get(status_name)
        super().__init__(f"{message}: {hint}" if hint else message)

    @property
    def flushed(self) -> bool:
        """True when the request never ran because its queue pair was in the error state."""
        return self.status_name == "IBV_WC_WR_FLUSH_ERR"


_HINTS = {
    "IBV_WC_RNR_RETRY_EXC_ERR": (
        "the peer had no receive posted for this send, retry after retry: did both sides "
        "set up a message channel (prepare=aiordma.prepare_channel on both, or "
        "open_channel / start_channel_server), or post receives in their prepare hook?"
    ),
    "IBV_WC_REM_ACCESS_ERR": (
        "the peer refused the access. Usual causes: its region was registered without "
        "the remote access flag this needs (Access.REMOTE_READ, REMOTE_WRITE or "
        "REMOTE_ATOMIC); the rkey is stale (the region was deregistered, or the exposure "
        "revoked) or belongs to another device or protection domain; or the range "
        "falls outside the region"
    ),
    "IBV_WC_RETRY_EXC_ERR": (
        "the peer never acknowledged: it is gone (process, machine or link), or its "
        "queue pair is no longer connected"
    ),
    "IBV_WC_LOC_PROT_ERR": (
        "a local buffer's registration does not allow this: receives and RDMA read "
        "targets need Access.LOCAL_WRITE, and the memory must be registered on this "
        "queue pair's device"
    ),
}


class RemoteAccessError(CompletionError):
    """The peer refused a one-sided access: bad rkey, out of bounds, or missing permission."""


class QueuePairError(RdmaError):
    """The queue pair entered the error state; its pending work was flushed."""


class ConnectionRejectedError(RdmaError, ConnectionRefusedError):
    """The server turned the connection request down.

    Raised when the server's ``accept`` callback raised
    :class:`~aiordma.RejectConnection` (``reason`` 28, "consumer defined"),
    or when the peer's connection manager refused for another reason
    (``reason`` is then the IB CM reject reason code). ``private_data`` is
    what the server sent with its rejection, zero-padded by rdma_cm to the
    transport's fixed size (148 bytes over RoCE). Nothing listening is
    :class:`NoListenerError` instead.
    """

    def __init__(self, message: str, private_data: bytes = b"", reason: int = 0) -> None:
        super().__init__(111, message)  # ECONNREFUSED
        self.private_data = private_data
        self.reason = reason


class AuthenticationError(ConnectionRejectedError):
    """Peer authentication failed, so the connection was refused.

    Raised by ``connect(..., auth=)`` when the server did not prove it holds
    the key (another key, no ``auth=`` on the server, or a forged or replayed
    answer), and when the server refused this client (no ``auth=`` here, or
    a malformed request). Servers log it for clients they refuse. The message
    says which side's check failed; it never contains the key.
    """


class NoListenerError(RdmaError, ConnectionRefusedError):
    """Nothing listens on the address and port connected to (CM reject reason 8,
    "invalid service ID"); ``reason`` is that code."""

    def __init__(self, message: str, reason: int = 8) -> None:
        super().__init__(111, message)  # ECONNREFUSED
        self.reason = reason


class ConnectionLostError(RdmaError, ConnectionResetError):
    """The connection ended under pending work: the peer disconnected or died,
    or the device was removed."""

    def __init__(self, message: str) -> None:
        super().__init__(104, message)  # ECONNRESET


# -- messages ------------------------------------------------------------------


class ProtocolError(RdmaError):
    """The peer sent something the message protocol does not allow."""


class ProtocolMismatchError(ProtocolError):
    """The peer's message channel speaks another protocol (an RPC client that
    reached a stream server, say); ``ours`` and ``theirs`` name both (``""``
    is plain messages)."""

    def __init__(self, ours: str, theirs: str, peer: str) -> None:
        super().__init__(
            f"{peer} speaks {_protocol_name(theirs)} on its message channel, and this side "
            f"{_protocol_name(ours)}: check the host and port, or that both sides use the "
            "same layer (aiordma.rpc, aiordma.streams, plain channels)"
        )
        self.ours = ours
        self.theirs = theirs


def _protocol_name(protocol: str) -> str:
    return repr(protocol) if protocol else "plain messages"


class MessageTooLargeError(RdmaError, ValueError):
    """A message exceeds the channel's ``max_message``."""


class BufferTooSmallError(RdmaError, ValueError):
    """The buffer given to receive into is shorter than the next message.

    ``needed`` is the message's length, ``given`` the buffer's. The message
    is not consumed; receive it again with a large enough buffer.
    """

    def __init__(self, needed: int, given: int) -> None:
        super().__init__(f"the next message has {needed} bytes; the buffer holds {given}")
        self.needed = needed
        self.given = given


class MessageRevokedError(RdmaError):
    """A large message was withdrawn before the receiver read it.

    The sender revokes a message's exposure when its send is cancelled or
    when the receiver did not read it within the sender's
    ``exposure_timeout``. The receiver's receive of that message raises
    this (the message is consumed; the next receive gets the next one);
    ``head`` is the message's head (for RPC, its frame).
    """

    def __init__(self, message: str, head: bytes = b"") -> None:
        super().__init__(message)
        self.head = head


class ExposureTimeoutError(MessageRevokedError, TimeoutError):
    """The sender's side of :class:`MessageRevokedError`: the peer did not read
    a large message within ``exposure_timeout`` seconds, so it was revoked."""


class TransferError(RdmaError):
    """A transfer of descriptor lists failed on the device.

    ``index`` is the first descriptor whose data did not move (None when
    the transfer failed before its first), and the cause (``__cause__``) is
    what the device reported: a :class:`RemoteAccessError` when the peer
    revoked (unregistered) the memory or never allowed that access, a
    :class:`QueuePairError` or :class:`ConnectionLostError` when the
    connection failed. Nothing of the transfer is in flight any more.
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index
