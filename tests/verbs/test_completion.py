"""Completion queues on the loop (lab device, asyncio and uvloop)."""

from __future__ import annotations

import asyncio

import pytest

import aiordma
from tests.conftest import Lab, rdma_counts, run_python


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_completion_queues_no_queue_pair_uses_are_released(
    device: aiordma.Device, lab: Lab
) -> None:
    # Deep queues fill a CQ with few queue pairs, so several CQs are needed.
    deep = aiordma.QueuePairOptions(send_depth=4096, recv_depth=4096)
    before = rdma_counts(lab.device)["cq"]
    qps = [device.create_qp(deep) for _ in range(10)]
    busiest = rdma_counts(lab.device)["cq"]
    for qp in qps:
        qp.close()
        await asyncio.wait_for(qp.wait_closed(), 30)
    await asyncio.sleep(0)  # unused CQs are closed on the next loop iteration
    after = rdma_counts(lab.device)["cq"]
    assert busiest >= before + 3, "the test needs queue pairs enough to fill several CQs"
    assert after == before + 1  # the loop's first CQ is kept for the next queue pair


ABANDON = """
import asyncio, gc, sys, warnings
import aiordma

async def main() -> None:
    device = aiordma.Device(sys.argv[1])
    a, b = await aiordma.connect_loopback_pair(device)
    await b.post_recv_batch([device.alloc(64) for _ in range(4)])  # left posted, never closed

warnings.simplefilter("ignore", ResourceWarning)
asyncio.run(main())
gc.collect()  # the device, its CQ and QPs are one unreachable cycle now
asyncio.run(asyncio.sleep(0))
print("survived")
"""


def test_resources_dropped_unclosed_are_collected_without_a_crash(lab: Lab) -> None:
    """The collector tears an unreachable cycle down in no set order; a
    completion channel destroyed before its CQ would crash the process."""
    done = run_python(["-c", ABANDON, lab.device], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "survived"
