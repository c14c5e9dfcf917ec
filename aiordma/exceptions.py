"""Exception hierarchy shared by every aiordma layer.

Everything aiordma raises on its own account derives from :class:`RdmaError`.
Where asyncio users expect a builtin (``ConnectionRefusedError``,
``TimeoutError``, ``ValueError`` for bad arguments), the aiordma class also
derives from that builtin so either ``except`` works.
"""

from __future__ import annotations


class RdmaError(Exception):
    """Base class of every error aiordma raises on its own account."""


class LabError(RdmaError):
    """The lab could not provide a real RDMA device."""


class DeviceError(RdmaError, OSError):
    """A verbs call on a device failed; ``errno`` says why."""


class WrongLoopError(RdmaError, RuntimeError):
    """An object bound to one event loop was used from another."""


class ResourceClosedError(RdmaError):
    """The device, queue pair or memory region has been closed."""


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
        super().__init__(
            f"{opcode} failed: {status_name} (status {status}, vendor error {vendor_err:#x})"
        )

    @property
    def flushed(self) -> bool:
        """True when the request never ran because its queue pair was in the error state."""
        return self.status_name == "IBV_WC_WR_FLUSH_ERR"


class RemoteAccessError(CompletionError):
    """The peer refused a one-sided access: bad rkey, out of bounds, or missing permission."""


class QueuePairError(RdmaError):
    """The queue pair entered the error state; its pending work was flushed."""


class ConnectionRejectedError(RdmaError, ConnectionRefusedError):
    """The server turned the connection request down.

    ``private_data`` is what the server sent with its rejection, zero-padded
    by rdma_cm to the transport's fixed size (148 bytes over RoCE);
    ``reason`` is the CM reject reason code.
    """

    def __init__(self, message: str, private_data: bytes = b"", reason: int = 0) -> None:
        super().__init__(111, message)  # ECONNREFUSED
        self.private_data = private_data
        self.reason = reason


class ConnectionLostError(RdmaError, ConnectionResetError):
    """The connection ended under pending work: the peer disconnected or died,
    or the device was removed."""

    def __init__(self, message: str) -> None:
        super().__init__(104, message)  # ECONNRESET
