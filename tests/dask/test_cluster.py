"""A real Dask cluster on ``rdma://``: a scheduler and two workers (each
spawned by its nanny) as separate processes, checked against ``tcp://``.

The cluster and its client run in ``aiordma bench study dask_cluster``, as
subprocesses of this test, which holds nothing of Dask's itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import ROOT, Lab

MIB = 1 << 20
ROWS = 8192
"""The workload's array: 512 MiB (the study's default is 768 MiB)."""


def _study(lab: Lab, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "aiordma.bench.studies.dask_cluster", "--json", "--host", lab.addr,
         "--rounds", "1", "--tiny", "100", "--rows", str(ROWS), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-5000:]
    row: dict[str, Any] = json.loads(proc.stdout)
    return row


# 9 min alone in the lab; a loaded runner may take twice that.
@pytest.mark.timeout(2500)
def test_a_dask_array_workload_on_rdma_matches_tcp_and_moves_hundreds_of_mib(lab: Lab) -> None:
    # rdma:// as users start it (each worker behind its nanny); tcp://, the
    # reference for the result, without nannies (they take minutes to start
    # in the lab).
    rdma = _study(lab, "--protocol", "rdma")
    tcp = _study(lab, "--protocol", "tcp", "--no-nanny")
    assert rdma["protocol"] == "rdma"
    assert rdma["nanny"] is True
    assert tcp["protocol"] == "tcp"
    assert rdma["address"].startswith(f"rdma://{lab.addr}:")
    assert len(rdma["workers"]) == 2
    assert all(w.startswith("rdma://") for w in rdma["workers"])
    assert rdma["column_sums_sha"] == tcp["column_sums_sha"]
    assert rdma["column_sums_total"] == tcp["column_sums_total"]
    assert rdma["moved_bytes"] >= 256 * MIB, rdma
    assert rdma["transfer_s"] > 0
    assert rdma["tiny_tasks"] == 100
    assert rdma["tiny_s"] > 0  # and the tiny tasks' sum was checked in the study
