"""Which local address an ``rdma://`` listener is reached at.

A RoCE device is reached at the IP address of the network interface it is
bound to, and only there: not at ``127.0.0.1``, and not necessarily at the
address distributed would pick for TCP (the one routed to the Internet).
"""

from __future__ import annotations

import socket

from aiordma.channel import find_roce_endpoint


def rdma_host(family: int = 4) -> str:
    """The IP address of this host's first active RoCE port (IPv4 first).

    Raises ``OSError`` naming the problem when this host has none.
    """
    for fam in (family, 10 - family):  # 4 then 6, or 6 then 4
        found = find_roce_endpoint(family=fam)
        if found is not None:
            return str(found.address)
    raise OSError("this host has no active RoCE port with an IP address: rdma:// cannot listen")


def local_host_for(host: str) -> str:
    """The local address the kernel routes to ``host`` from: for RoCE that is
    the address of the RDMA port that reaches it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((host, 9))  # UDP: nothing is sent
        except OSError:
            return rdma_host(6 if family == socket.AF_INET6 else 4)
        local: str = sock.getsockname()[0]
        return local
