"""Enumerate RDMA devices, ports and GIDs from sysfs.

sysfs is read instead of opening every device through verbs so that listing
works without pyverbs and never disturbs a device in use. Reading every
port's GID table takes seconds on a loaded machine, so lookups use one scan
per process (:func:`known_devices`), made again only when a lookup misses
or a device was removed; :func:`list_devices` always reads afresh.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

SYSFS_ROOT = Path("/sys/class/infiniband")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_T = TypeVar("_T")


@dataclass(frozen=True)
class GidInfo:
    """One populated entry of a port's GID table."""

    index: int
    gid: str
    type: str
    netdev: str | None

    @property
    def ip(self) -> IPAddress | None:
        """The IP address a RoCE GID stands for (None for InfiniBand GIDs)."""
        return gid_to_ip(self.gid) if self.type.startswith("RoCE") else None


@dataclass(frozen=True)
class PortInfo:
    """One port of an RDMA device."""

    number: int
    state: str
    phys_state: str
    link_layer: str
    gids: tuple[GidInfo, ...]

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


@dataclass(frozen=True)
class DeviceInfo:
    """An RDMA device (an HCA, a RoCE NIC or a Soft-RoCE ``rxe`` device)."""

    name: str
    node_type: str
    ports: tuple[PortInfo, ...]


@dataclass(frozen=True)
class RoceEndpoint:
    """A usable (device, port, GID) triple with the IP address rdma_cm will use."""

    device: str
    port: int
    gid_index: int
    address: IPAddress


def gid_to_ip(gid: str) -> IPAddress | None:
    """Map a GID (``fe80:0000:...`` form) to the IP address it encodes.

    IPv4-mapped GIDs (``::ffff:a.b.c.d``) give the IPv4 address; an all-zero
    GID gives None; anything else is taken as the IPv6 address it spells.
    """
    try:
        addr = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    if addr == ipaddress.IPv6Address(0):
        return None
    return addr.ipv4_mapped or addr


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _state_name(raw: str | None) -> str:
    # sysfs spells states as "4: ACTIVE" / "5: LinkUp".
    if not raw:
        return "UNKNOWN"
    return raw.split(":", 1)[-1].strip()


def _read_gids(port_dir: Path) -> tuple[GidInfo, ...]:
    gids_dir = port_dir / "gids"
    try:
        names = os.listdir(gids_dir)
    except OSError:
        return ()
    gids = []
    for name in sorted(names, key=int):
        index = int(name)
        gid = _read(gids_dir / name)
        if gid is None or gid_to_ip(gid) is None:
            continue
        gid_type = _read(port_dir / "gid_attrs" / "types" / name)
        if gid_type is None:
            # Unpopulated entries raise EINVAL on their type attribute.
            continue
        netdev = _read(port_dir / "gid_attrs" / "ndevs" / name)
        gids.append(GidInfo(index=index, gid=gid, type=gid_type, netdev=netdev or None))
    return tuple(gids)


def list_devices(root: Path = SYSFS_ROOT) -> list[DeviceInfo]:
    """Every RDMA device the kernel knows, with ports and populated GIDs."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    devices = []
    for name in names:
        dev_dir = root / name
        ports = []
        try:
            port_names = sorted(os.listdir(dev_dir / "ports"), key=int)
        except OSError:
            port_names = []
        for pname in port_names:
            pdir = dev_dir / "ports" / pname
            ports.append(
                PortInfo(
                    number=int(pname),
                    state=_state_name(_read(pdir / "state")),
                    phys_state=_state_name(_read(pdir / "phys_state")),
                    link_layer=_read(pdir / "link_layer") or "UNKNOWN",
                    gids=_read_gids(pdir),
                )
            )
        node_type = _state_name(_read(dev_dir / "node_type"))
        devices.append(DeviceInfo(name=name, node_type=node_type, ports=tuple(ports)))
    return devices


_known: list[DeviceInfo] | None = None


def known_devices(*, refresh: bool = False) -> list[DeviceInfo]:
    """The devices as this process last scanned them (scanned on first use,
    and again with ``refresh``)."""
    global _known
    if _known is None or refresh:
        _known = list_devices()
    return _known


def forget_devices() -> None:
    """Drop the process's scan (a device was added or removed): the next lookup reads sysfs."""
    global _known
    _known = None


def lookup(find: Callable[[list[DeviceInfo]], _T | None]) -> _T | None:
    """``find`` applied to the known devices, and once more to a fresh scan if it found nothing."""
    if _known is not None:
        found = find(_known)
        if found is not None:
            return found
    return find(known_devices(refresh=True))


def find_roce_endpoint(
    devices: list[DeviceInfo] | None = None,
    *,
    device: str | None = None,
    port: int | None = None,
    family: int = 4,
) -> RoceEndpoint | None:
    """The first active RoCE v2 GID with an IP address of ``family`` (4 or 6).

    Link-local IPv6 GIDs are skipped: rdma_cm cannot route to them without a
    scope. ``device`` and ``port`` restrict the search. Without ``devices``
    it searches the process's scan (see :func:`lookup`).
    """
    if devices is None:
        find = functools.partial(find_roce_endpoint, device=device, port=port, family=family)
        return lookup(find)
    for dev in devices:
        if device is not None and dev.name != device:
            continue
        for p in dev.ports:
            if not p.active or (port is not None and p.number != port):
                continue
            for gid in p.gids:
                ip = gid.ip
                if gid.type != "RoCE v2" or ip is None or ip.version != family:
                    continue
                if ip.is_link_local:
                    continue
                return RoceEndpoint(dev.name, p.number, gid.index, ip)
    return None


def format_devices(devices: list[DeviceInfo]) -> str:
    """A human-readable table of devices, ports and GIDs."""
    if not devices:
        return "no RDMA devices (try 'aiordma rxe up' or 'aiordma lab -- aiordma devices')"
    lines = []
    for dev in devices:
        lines.append(f"{dev.name}  ({dev.node_type})")
        for port in dev.ports:
            lines.append(
                f"  port {port.number}: {port.state} / {port.phys_state}, {port.link_layer}"
            )
            for gid in port.gids:
                ip = gid.ip
                where = f" -> {ip}" if ip is not None else ""
                via = f" on {gid.netdev}" if gid.netdev else ""
                lines.append(f"    gid[{gid.index}] {gid.gid}  {gid.type}{via}{where}")
    return "\n".join(lines)
