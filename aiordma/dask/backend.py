"""The ``rdma`` comm backend, as distributed looks it up by entry point."""

from __future__ import annotations

from typing import Any

from distributed.comm.addressing import parse_host_port, unparse_host_port
from distributed.comm.registry import Backend
from distributed.utils import ensure_ip

from aiordma.dask.addresses import local_host_for
from aiordma.dask.comm import Handler, RdmaConnector, RdmaListener


class RdmaBackend(Backend):
    """``rdma://host:port`` addresses: rdma_cm connections carrying Dask messages.

    Registered under the ``distributed.comm.backends`` entry point, so
    installing ``aiordma[dask]`` is enough for distributed to accept
    ``rdma://`` addresses anywhere it accepts ``tcp://``.
    """

    def get_connector(self) -> RdmaConnector:
        """A connector for ``rdma://`` addresses."""
        return RdmaConnector()

    def get_listener(
        self, loc: str, handle_comm: Handler, deserialize: bool, **connection_args: Any
    ) -> RdmaListener:
        """A listener on ``loc`` (``host:port``) handing comms to ``handle_comm``."""
        return RdmaListener(loc, handle_comm, deserialize, **connection_args)

    def get_address_host(self, loc: str) -> str:
        """The host part of ``loc``."""
        return parse_host_port(loc)[0]

    def get_address_host_port(self, loc: str) -> tuple[str, int]:
        """``loc`` as ``(host, port)``; ``ValueError`` if it has no port."""
        return parse_host_port(loc)

    def resolve_address(self, loc: str) -> str:
        """``loc`` with its host name resolved to an IP address."""
        host, port = parse_host_port(loc)
        return unparse_host_port(ensure_ip(host), port)

    def get_local_address_for(self, loc: str) -> str:
        """The local address (of the RDMA port) that reaches ``loc``."""
        host, _ = parse_host_port(loc)
        return unparse_host_port(local_host_for(ensure_ip(host)), None)
