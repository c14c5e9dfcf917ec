"""A real Dask cluster on ``rdma://``: a scheduler and two workers as
separate processes, started with the ``dask`` command line.

The cluster and its client run in ``python -m benchmarks dask_cluster``, as
subprocesses of this test, which holds nothing of Dask's itself. The default
run checks a small workload against the same computation done in one
process; the slow run (``--slow``) is the study at size: hundreds of MiB
moved, checked against ``tcp://``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import ROOT, Lab, run_python

MIB = 1 << 20


def _study(lab: Lab, *args: str) -> dict[str, Any]:
    proc = run_python(
        ["-m", "benchmarks.studies.dask_cluster", "--json", "--host", lab.addr,
         "--rounds", "1", *args],
        cwd=ROOT, timeout=2400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-5000:]
    row: dict[str, Any] = json.loads(proc.stdout)
    return row


def _check_cluster(lab: Lab, row: dict[str, Any]) -> None:
    assert row["protocol"] == "rdma"
    assert row["address"].startswith(f"rdma://{lab.addr}:")
    assert len(row["workers"]) == 2
    assert all(w.startswith("rdma://") for w in row["workers"])
    assert row["transfer_s"] > 0
    assert row["tiny_s"] > 0  # and the tiny tasks' sum was checked in the study


@pytest.mark.timeout(900)
def test_a_small_dask_array_workload_on_rdma_crosses_workers_and_computes_right(
    lab: Lab,
) -> None:
    """Each worker behind its nanny, as users start them. 512 x 8,192
    integers in four row slabs, rechunked to columns: every column needs a
    slice of every slab, so slices cross between the workers."""
    row = _study(lab, "--protocol", "rdma", "--rows", "512", "--tiny", "20",
                 "--transfer", str(4 * MIB), "--reference")  # fmt: skip
    _check_cluster(lab, row)
    assert row["nanny"] is True
    assert row["column_sums_sha"] == row["reference_sha"]
    assert row["moved_bytes"] > 0, row
    assert row["transfer_bytes"] == 4 * MIB
    assert row["tiny_tasks"] == 20


@pytest.mark.slow  # 10 min alone in the lab; a loaded runner may take twice that
@pytest.mark.timeout(2500)
def test_a_dask_array_workload_on_rdma_matches_tcp_and_moves_hundreds_of_mib(lab: Lab) -> None:
    # rdma:// as users start it (each worker behind its nanny); tcp://, the
    # reference for the result, without nannies (they take minutes to start
    # in the lab).
    study = ["--tiny", "100", "--rows", "8192"]  # a 512 MiB array
    rdma = _study(lab, "--protocol", "rdma", *study)
    tcp = _study(lab, "--protocol", "tcp", "--no-nanny", *study)
    _check_cluster(lab, rdma)
    assert rdma["nanny"] is True
    assert tcp["protocol"] == "tcp"
    assert rdma["column_sums_sha"] == tcp["column_sums_sha"]
    assert rdma["column_sums_total"] == tcp["column_sums_total"]
    assert rdma["moved_bytes"] >= 256 * MIB, rdma
    assert rdma["tiny_tasks"] == 100
