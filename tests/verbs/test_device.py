"""Devices: attributes, closing, and what they release (lab device)."""

from __future__ import annotations

import gc
import warnings
from typing import Any

import pytest

import aiordma
from tests.conftest import Lab, run_python


@pytest.mark.asyncio
async def test_device_reports_attributes_and_gids(device: aiordma.Device) -> None:
    attrs = device.attributes
    assert attrs.max_qp_wr > 0
    assert attrs.max_sge >= 1
    assert attrs.atomic
    assert any(p.active for p in device.ports)
    assert device.gid_index() >= 0


_LEAK = """
import asyncio, gc, sys, warnings
import aiordma
caught = []
warnings.simplefilter("always")
def show(message, category, *rest, **kw):
    caught.append(category.__name__ + " " + str(message))
warnings.showwarning = show
async def main():
    device = aiordma.Device(sys.argv[1])
    qp = device.create_qp()
    del qp, device
    gc.collect()
    # Its buffers posted, a shared receive queue is kept alive by its
    # completion queue's reader on the loop, as a server is: it is
    # collected (and warns) once the loop is closed.
    pool = aiordma.SharedReceiveQueue(aiordma.Device(sys.argv[1]), buffers=8)
    del pool
asyncio.run(main())
gc.collect()
print("\\n".join(sorted(caught)))
"""


def test_a_device_queue_pair_and_shared_receive_queue_collected_unclosed_warn(lab: Lab) -> None:
    proc = run_python(["-c", _LEAK, lab.device], timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(" <")[0] for line in lines] == ["ResourceWarning unclosed"] * 4, proc.stdout
    assert "<Device" in lines[0]
    assert "<Device" in lines[1]
    assert "<QueuePair" in lines[2]
    assert "<SharedReceiveQueue" in lines[3]


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_a_closed_device_says_so_and_does_not_warn(lab: Lab) -> None:
    device = aiordma.Device(lab.device)
    assert not device.is_closing()
    await device.aclose()
    assert device.is_closing()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del device
        gc.collect()


@pytest.mark.asyncio
async def test_lookups_use_one_scan_of_sysfs(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading every GID table takes seconds on a loaded machine: the shared
    device, a default device and a failing listen use the process's scan."""
    from aiordma.verbs import discovery

    aiordma.Device.shared()  # the process's first lookup may scan
    scans: list[object] = []
    real = discovery.list_devices

    def counted(*args: Any) -> list[discovery.DeviceInfo]:
        scans.append(args)
        return real(*args)

    monkeypatch.setattr(discovery, "list_devices", counted)
    shared = aiordma.Device.shared()
    assert aiordma.Device.shared() is shared
    with pytest.raises(ValueError, match="size"):
        shared.alloc(-1)
    async with aiordma.Device() as fresh:
        assert fresh.name == shared.name
        assert fresh.gid_index() >= 0
    with pytest.raises(OSError, match="no RDMA device"):
        await aiordma.start_server(lambda conn: None, "127.0.0.1", 0)
    assert scans == []
