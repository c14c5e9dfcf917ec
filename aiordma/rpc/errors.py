"""Exceptions an RPC caller can meet."""

from __future__ import annotations

from aiordma.exceptions import RdmaError


class RpcError(RdmaError):
    """Base of the errors the RPC layer raises itself."""


class RemoteError(RpcError):
    """The handler raised: ``remote_type`` and ``remote_message`` describe it."""

    def __init__(self, method: str, remote_type: str, remote_message: str) -> None:
        super().__init__(f"{method}: {remote_type}: {remote_message}")
        self.method = method
        self.remote_type = remote_type
        self.remote_message = remote_message


class UnknownMethodError(RemoteError):
    """The server has no handler of that name."""
