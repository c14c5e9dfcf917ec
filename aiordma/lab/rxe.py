"""Create and remove Soft-RoCE (rxe) devices on a host whose kernel has ``rdma_rxe``."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

from aiordma.exceptions import LabError
from aiordma.lab.vm import LAB_MTU


def _run(*argv: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise LabError(f"{argv[0]} is not installed (Debian: iproute2, kmod)") from exc
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise LabError(f"'{' '.join(argv)}' failed: {detail}")


def _netdev_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def rxe_up(netdev: str, name: str = "rxe0", dummy_address: str | None = None) -> None:
    """Load ``rdma_rxe`` and bind a Soft-RoCE device ``name`` to ``netdev``.

    With ``dummy_address`` (``ADDR/PREFIX``) a dummy interface called
    ``netdev`` is created first (at :data:`~aiordma.lab.vm.LAB_MTU`, as
    in the lab's guests) and given that address: a self-contained setup for
    learning and tests that needs no real NIC. Idempotent: an
    existing device of that name is left alone.
    """
    if Path("/sys/class/infiniband", name).exists():
        return
    try:
        _run("modprobe", "rdma_rxe")
    except LabError as exc:
        raise LabError(
            f"{exc}\nThis kernel has no Soft-RoCE module; run commands in the lab guest "
            "instead: 'aiordma lab -- CMD'"
        ) from exc
    if dummy_address is not None:
        iface = ipaddress.ip_interface(dummy_address)
        if not _netdev_exists(netdev):
            _run("ip", "link", "add", netdev, "type", "dummy", "mtu", str(LAB_MTU))
        _run("ip", "addr", "replace", str(iface), "dev", netdev)
        _run("ip", "link", "set", netdev, "up")
    elif not _netdev_exists(netdev):
        raise LabError(f"no network interface named {netdev!r}")
    _run("rdma", "link", "add", name, "type", "rxe", "netdev", netdev)


def rxe_down(name: str = "rxe0") -> None:
    """Remove the Soft-RoCE device ``name`` (a no-op when it does not exist)."""
    if Path("/sys/class/infiniband", name).exists():
        _run("rdma", "link", "delete", name)
