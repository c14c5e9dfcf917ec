"""Benchmark summaries and perftest output parsing (no device)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from aiordma.bench import perftest
from aiordma.bench.stats import Latency, Result, percentile

# perftest's tables, with their column spacing shortened.
LAT_OUTPUT = """
---------------------------------------------------------------------------------------
                    RDMA_Write Latency Test
 #bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] t_stdev[usec]
   99% percentile[usec] 99.9% percentile[usec]
 64 500 9.95 486.91 12.25 14.30 20.11 90.35 243.45
---------------------------------------------------------------------------------------
"""

BW_OUTPUT = """
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 1048576    1000             45.70              45.68                0.000044
"""


def test_percentiles_use_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 0.999) == 100
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)


def test_result_rates() -> None:
    r = Result("aiordma", "write_bw", 1 << 20, 8, 100, 2.0)
    assert r.mb_per_s == pytest.approx(52.4288)
    assert r.gbit_per_s == pytest.approx(0.4194304)
    assert r.ops_per_s == 50
    assert r.to_json()["mb_per_s"] == pytest.approx(52.4288)
    lat = Latency.of([0.001, 0.002, 0.003])
    assert lat.p50 == pytest.approx(2000)
    assert lat.mean == pytest.approx(2000)


def test_perftest_latency_rows_become_round_trips() -> None:
    row = perftest.parse_row(LAT_OUTPUT)
    assert row is not None
    result = perftest.to_result("write_lat", row, 1)
    assert (result.size, result.iterations) == (64, 500)
    assert result.latency is not None
    assert result.latency.p50 == pytest.approx(24.5)  # twice the one-way typical
    assert result.latency.p99 == pytest.approx(180.7)
    assert result.extra["one_way_typical_us"] == pytest.approx(12.25)


def test_perftest_bandwidth_rows() -> None:
    row = perftest.parse_row(BW_OUTPUT)
    assert row is not None
    result = perftest.to_result("write_bw", row, 8)
    assert result.mb_per_s == pytest.approx(45.68)
    assert perftest.parse_row("no table here") is None


def test_perftest_time_comes_from_its_six_decimal_message_rate() -> None:
    # 0.00 MB/s average but 0.000500 Mpps: 40 messages took 80 ms.
    result = perftest.to_result("read_bw", ["64", "40", "0.01", "0.00", "0.000500"], 4)
    assert result.seconds == pytest.approx(0.08)
    assert result.mb_per_s == pytest.approx(0.032)
    old_style = perftest.to_result("write_bw", ["65536", "100", "50.0", "40.0", "0.0"], 8)
    assert old_style.seconds == pytest.approx(65536 * 100 / 40e6)


def test_perftest_events_run_passes_e_and_names_its_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path
    calls = bin_dir / "calls"
    fake = bin_dir / "ib_send_lat"
    (bin_dir / "table").write_text(LAT_OUTPUT)
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncat {bin_dir / "table"}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    servers: list[list[str]] = []

    def start_server(argv: list[str]) -> Callable[[], None]:
        servers.append(argv)
        return lambda: None

    busy = perftest.run("msg_lat", "rxe0", "192.0.2.1", 64, 10, 1, start_server)
    events = perftest.run("msg_lat", "rxe0", "192.0.2.1", 64, 10, 1, start_server, events=True)
    assert busy is not None
    assert events is not None
    assert (busy.tool, events.tool) == ("perftest", perftest.EVENTS_TOOL)
    assert ["-e" in argv for argv in servers] == [False, True]
    client_args = [line.split() for line in calls.read_text().splitlines()]
    assert ["-e" in args for args in client_args] == [False, True]
    # Only modes timed by ib_send_lat have an events reference.
    assert perftest.run("write_lat", "rxe0", "192.0.2.1", 64, 10, 1, start_server, True) is None


ZERO_OUTPUT = """
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 64         20000            0.00               0.00                 0.000000
"""


def test_a_perftest_row_of_zeros_is_retried_and_never_a_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 62: ``ib_send_bw`` once printed 0.00 MB/s at exit 0, and the
    bench showed it as a figure ("no ratio: perftest reported 0")."""
    fake = tmp_path / "ib_send_bw"
    runs = tmp_path / "runs"
    # The first two runs measure nothing, the third a figure.
    fake.write_text(
        f"#!/bin/sh\necho run >> {runs}\n"
        f'if [ "$(wc -l < {runs})" -lt 3 ]; then cat {tmp_path / "zero"}; '
        f"else cat {tmp_path / 'table'}; fi\n"
    )
    (tmp_path / "zero").write_text(ZERO_OUTPUT)
    (tmp_path / "table").write_text(BW_OUTPUT)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    result = perftest.run("send_rate", "rxe0", "192.0.2.1", 64, 20000, 1, lambda argv: lambda: None)
    assert result is not None
    assert result.mb_per_s > 0
    err = capsys.readouterr().err
    assert err.count("ib_send_bw gave no result: it exited 0 but measured nothing") == 2
    assert "0.00 0.00 0.000000" in err
    (tmp_path / "table").write_text(ZERO_OUTPUT)
    runs.unlink()
    assert perftest.run("send_rate", "rxe0", "192.0.2.1", 64, 20000, 1,
                        lambda argv: lambda: None) is None  # fmt: skip
