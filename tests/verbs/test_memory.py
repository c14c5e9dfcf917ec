"""Memory registration on the lab device, and RemoteBuffer encoding."""

from __future__ import annotations

import asyncio
import mmap
import subprocess
import sys

import pytest

import aiordma
from aiordma import Access, RemoteBuffer
from tests.conftest import Lab


def test_remote_buffer_round_trips_and_narrows() -> None:
    rb = RemoteBuffer(addr=0x7F00_0000_1000, length=4096, rkey=0x1234)
    wire = rb.to_bytes()
    assert len(wire) == RemoteBuffer.SIZE
    assert RemoteBuffer.from_bytes(wire) == rb
    part = rb[100:200]
    assert (part.addr, part.length, part.rkey) == (rb.addr + 100, 100, rb.rkey)
    assert rb[4000:].length == rb[-96:].length == 96
    for past in (slice(4000, 9000), slice(5000, None), slice(-5000, 10)):
        with pytest.raises(IndexError, match=r"reaches past the 4096 bytes"):
            rb[past]  # issue 81: clipped once, so a write moved fewer bytes than asked
    with pytest.raises(ValueError, match="contiguous"):
        rb[::2]
    with pytest.raises(ValueError, match="20 bytes"):
        RemoteBuffer.from_bytes(wire[:-1])
    with pytest.raises(ValueError, match="32 bits"):
        RemoteBuffer(0, 1, 1 << 32)


@pytest.mark.asyncio
async def test_register_without_copy_and_default_access(device: aiordma.Device) -> None:
    buf = bytearray(b"x" * 64)
    with device.register(buf) as mr:
        assert mr.length == 64
        assert mr.access == Access.LOCAL_WRITE
        assert mr.lkey
        assert mr.rkey is not None
        buf[0:5] = b"hello"
        assert bytes(mr.view()[:5]) == b"hello"  # same memory, no copy
        with pytest.raises(BufferError):
            buf.extend(b"more")  # registered memory cannot move
    buf.extend(b"more")  # released on close


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "make",
    [
        lambda: bytearray(100),
        lambda: memoryview(bytearray(300))[100:200],
        lambda: mmap.mmap(-1, 100),
    ],
    ids=["bytearray", "memoryview-slice", "mmap"],
)
async def test_register_buffer_kinds(device: aiordma.Device, make: object) -> None:
    obj = make()  # type: ignore[operator]
    mr = device.register(obj, Access.REMOTE_READ)
    assert mr.length == 100
    assert mr.access == Access.REMOTE_READ
    seg = mr[10:30]
    assert (seg.addr, seg.length, seg.lkey) == (mr.addr + 10, 20, mr.lkey)
    assert mr.remote(10, 20) == RemoteBuffer(mr.addr + 10, 20, mr.rkey)
    mr.close()
    mr.close()  # idempotent
    assert mr.closed


@pytest.mark.asyncio
async def test_read_only_memory_is_source_only(device: aiordma.Device) -> None:
    mr = device.register(b"constant data")
    assert mr.access == Access.NONE
    mr.close()
    mr = device.register(b"constant data", Access.REMOTE_READ)
    assert mr.remote().length == 13
    mr.close()
    for access in (Access.LOCAL_WRITE, Access.REMOTE_WRITE, Access.REMOTE_ATOMIC):
        with pytest.raises(ValueError, match="read-only bytes"):
            device.register(b"constant data", access)


@pytest.mark.asyncio
async def test_remote_write_implies_local_write(device: aiordma.Device) -> None:
    with device.alloc(64, Access.REMOTE_WRITE) as mr:
        assert mr.access == Access.REMOTE_WRITE | Access.LOCAL_WRITE


@pytest.mark.asyncio
async def test_bad_buffers_raise_clear_errors(device: aiordma.Device) -> None:
    with pytest.raises(ValueError, match="empty buffer"):
        device.register(bytearray())
    with pytest.raises(TypeError, match="C-contiguous"):
        device.register(memoryview(bytearray(10))[::2])
    with pytest.raises(TypeError, match="buffer protocol"):
        device.register(12345)
    with pytest.raises(ValueError, match="size must be at least 1"):
        device.alloc(0)
    # Issue 62: a bare OSError, naming no size.
    with pytest.raises(aiordma.MemoryLimitError, match=f"cannot allocate {1 << 50} bytes"):
        device.alloc(1 << 50)
    with pytest.raises(aiordma.MemoryLimitError, match=f"cannot allocate {1 << 70} bytes"):
        device.alloc(1 << 70)


@pytest.mark.asyncio
async def test_local_only_region_cannot_be_shared(device: aiordma.Device) -> None:
    with device.alloc(64) as mr, pytest.raises(ValueError, match="local access only"):
        mr.remote()


@pytest.mark.asyncio
async def test_segments_and_bounds(device: aiordma.Device) -> None:
    with device.alloc(100) as mr:
        seg = mr[10:50][5:10]
        assert (seg.offset, seg.length) == (15, 5)
        seg.view()[:] = b"abcde"
        assert bytes(mr.view()[15:20]) == b"abcde"
        with pytest.raises(ValueError, match="outside the region"):
            mr.segment(90, 20)
        with pytest.raises(IndexError, match=r"slice \[50:500\] reaches past the 100 bytes"):
            mr[50:500]  # as segment() refuses it; it was clipped to 50 bytes (issue 81)
        with pytest.raises(IndexError, match=r"reaches past the 40 bytes"):
            mr[10:50][0:41]
        assert len(mr[50:100]) == 50
    with pytest.raises(aiordma.ResourceClosedError):
        mr.view()


_PINNED_BEYOND_THE_LIMIT = """
import sys
import aiordma
device = aiordma.Device(sys.argv[1])
keep = device.alloc(512 << 10)  # fits under the 1 MiB limit
try:
    device.alloc(4 << 20)
except aiordma.MemoryLimitError as exc:
    print(type(exc).__name__, isinstance(exc, aiordma.DeviceError), exc.errno,
          exc.requested, exc.registered, exc.limit)
    print(exc)
"""


def test_registration_beyond_the_memlock_limit_is_a_typed_error_that_says_why(lab: Lab) -> None:
    # Without CAP_IPC_LOCK, pinned memory is bounded by RLIMIT_MEMLOCK, as for
    # any non-root user; root's capability is dropped for this one process.
    limit = 1 << 20
    proc = subprocess.run(
        ["prlimit", f"--memlock={limit}:{limit}", "setpriv", "--bounding-set=-ipc_lock",
         "--inh-caps=-ipc_lock", sys.executable, "-c", _PINNED_BEYOND_THE_LIMIT, lab.device],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    first, message = proc.stdout.splitlines()[:2]
    assert first.split() == [
        "MemoryLimitError", "True", "12", str(4 << 20), str(512 << 10), str(limit)
    ]  # fmt: skip
    assert "ulimit -l" in message
    assert "1024 KiB" in message


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_regions_and_devices_have_wait_closed(lab: Lab) -> None:
    device = aiordma.Device(lab.device)
    region = device.alloc(4096)
    waiting = [
        asyncio.ensure_future(region.wait_closed()),
        asyncio.ensure_future(device.wait_closed()),
    ]
    await asyncio.sleep(0)  # both are parked now
    assert not any(w.done() for w in waiting)
    region.close()
    await asyncio.wait_for(waiting[0], 10)
    assert not waiting[1].done()
    await device.aclose()
    await asyncio.wait_for(waiting[1], 10)
    await asyncio.wait_for(region.wait_closed(), 10)  # already closed: returns at once
    await asyncio.wait_for(device.wait_closed(), 10)
