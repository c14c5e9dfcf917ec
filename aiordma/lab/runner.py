"""Run a command where a real RDMA device exists: natively, or in a lab guest."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from aiordma.lab.vm import GuestConfig, run_in_guest
from aiordma.verbs.discovery import find_roce_endpoint


def native_environment() -> dict[str, str] | None:
    """Lab variables describing this host's own RoCE device, or None if it has none."""
    ep4 = find_roce_endpoint(device=os.environ.get("AIORDMA_DEVICE"))
    if ep4 is None:
        return None
    env = {"AIORDMA_LAB": "1", "AIORDMA_DEVICE": ep4.device, "AIORDMA_ADDR": str(ep4.address)}
    ep6 = find_roce_endpoint(device=ep4.device, family=6)
    if ep6 is not None:
        env["AIORDMA_ADDR6"] = str(ep6.address)
    return env


def run_in_lab(
    cmd: list[str],
    cfg: GuestConfig,
    *,
    force_guest: bool = False,
    timeout: float | None = None,
) -> int:
    """Run ``cmd`` with a real RDMA device and return its exit status.

    A host with an active RoCE device runs ``cmd`` directly; any other boots
    a guest. Either way ``cmd`` finds the device in ``AIORDMA_DEVICE`` and
    its addresses in ``AIORDMA_ADDR`` / ``AIORDMA_ADDR6``.
    """
    env = None if force_guest else native_environment()
    if env is None:
        return run_in_guest(cmd, cfg, cwd=Path.cwd(), timeout=timeout)
    return subprocess.run(cmd, env=os.environ | env, check=False, timeout=timeout).returncode
