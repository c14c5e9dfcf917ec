"""Completion queues on the loop (lab device, asyncio and uvloop)."""

from __future__ import annotations

import asyncio

import pytest

import aiordma
from tests.conftest import Lab, rdma_counts


@pytest.mark.asyncio
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
