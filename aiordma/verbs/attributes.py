"""What a device can do: the limits that shape what can be posted."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Final

from aiordma import _ibv


@dataclass(frozen=True, slots=True)
class DeviceAttributes:
    """The limits of a device that shape what can be posted (from ``ibv_query_device``)."""

    max_qp_wr: int
    max_sge: int
    max_sge_rd: int
    max_cqe: int
    max_mr_size: int
    max_qp_rd_atom: int
    max_qp_init_rd_atom: int
    atomic: bool
    """Whether the device supports atomic operations."""
    phys_port_cnt: int
    fw_version: str
    vendor_id: int
    vendor_part_id: int
    memory_windows: int = 0
    """The memory window type :meth:`QueuePair.bind_window` uses: 2 where the
    device supports type 2 windows, 1 where only type 1, 0 without windows."""
    bounded_windows: bool = False
    """Whether the device confines a window's rkey to the window's bytes.
    False on rxe, whose responder checks an access against the whole
    underlying region (revocation and type 2's tie to one queue pair hold)."""

    @classmethod
    def of(cls, attr: Any) -> DeviceAttributes:
        """From pyverbs' ``DeviceAttr`` (what ``Context.query_device()``
        returns): the fields named as ``ibv_device_attr`` names them are
        copied, the others derived."""
        derived = {
            "atomic": attr.atomic_caps != _ibv.ATOMIC_NONE,
            "fw_version": str(attr.fw_version),
            "memory_windows": _window_type(attr.device_cap_flags, attr.max_mw),
            "bounded_windows": attr.vendor_id != _RXE_VENDOR_ID,
        }
        copied = {f.name: getattr(attr, f.name) for f in fields(cls) if f.name not in derived}
        return cls(**copied, **derived)


_RXE_VENDOR_ID: Final = 0xFFFFFF
"""Soft-RoCE's vendor id (``RXE_VENDOR_ID`` in the kernel)."""


def _window_type(flags: int, max_mw: int) -> int:
    """The best memory window type a device offers (0: none)."""
    if not max_mw or not flags & _ibv.DEVICE_MEM_WINDOW:
        return 0
    if flags & (_ibv.DEVICE_MEM_WINDOW_TYPE_2A | _ibv.DEVICE_MEM_WINDOW_TYPE_2B):
        return _ibv.MW_TYPE_2
    return _ibv.MW_TYPE_1
