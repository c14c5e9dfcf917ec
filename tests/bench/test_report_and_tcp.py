"""The bench's table, ratios, plot and TCP baseline protocol (no RDMA device)."""

from __future__ import annotations

import asyncio
import io
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiordma.bench import tcp
from aiordma.bench.command import pace, peer_size, sizes_for
from aiordma.bench.perftest import to_result
from aiordma.bench.report import Progress, ratio, row
from aiordma.bench.runner import Plan, _latencies, machine_busy
from aiordma.bench.stats import Latency, Result


def _lat(tool: str, p50: float, size: int = 64) -> Result:
    return Result(tool, "write_lat", size, 1, 100, 0.1, Latency(p50, p50 * 2, p50 * 3, p50))


def test_ratios_are_multiples_for_latency_and_shares_for_throughput() -> None:
    assert ratio(_lat("aiordma", 300), _lat("perftest", 100)) == "3.0x perftest"
    ours = Result("aiordma", "write_bw", 65536, 8, 100, 2.0)
    theirs = Result("perftest", "write_bw", 65536, 8, 100, 1.6)
    assert ratio(ours, theirs) == "80% of perftest"
    rate = Result("aiordma", "send_rate", 64, 64, 1000, 1.0)
    assert ratio(rate, Result("tcp", "send_rate", 64, 64, 4000, 1.0)) == "25% of tcp"


def test_rows_name_the_tool_and_append_every_reference() -> None:
    line = row(
        _lat("aiordma", 300), [_lat("perftest", 100), _lat("perftest-e", 150), _lat("tcp", 600)]
    )
    assert line.startswith("aiordma    write_lat")  # room for the longest tool, perftest-e
    assert row(_lat("perftest-e", 150)).startswith("perftest-e write_lat")
    assert "p50     300.0 us" in line
    assert line.endswith("(3.0x perftest, 2.0x perftest-e, 0.5x tcp)")
    assert "(" not in row(_lat("perftest", 100))
    bw = row(Result("tcp", "read_bw", 1 << 20, 8, 10, 1.0))
    assert "10.5 MB/s" in bw
    assert "10 ops/s" in bw
    stream = row(Result("aiordma", "msg_bw", 65536, 8, 10, 1.0,
                        extra={"credit_packets_per_message": 0.125}))  # fmt: skip
    assert stream.endswith("[0.12 credit-only packets/msg]")
    assert "credit" not in bw


def test_default_sizes_per_kind_of_mode() -> None:
    assert sizes_for("write_lat", None) == [64]
    assert sizes_for("rpc_bw", None) == [65536, 1 << 20]
    assert sizes_for("send_rate", None) == [64]
    assert sizes_for("read_bw", [4096]) == [4096]
    # `aiordma bench connect` alone once started its peer with no buffer, which failed
    assert peer_size({"connect": sizes_for("connect", None)}) == 1
    assert peer_size({"connect": [0], "msg_bw": [64, 1 << 20]}) == 1 << 20


def test_plan_counts_iterations_or_time() -> None:
    by_count = Plan(iterations=3, warmup=0, depth=1)
    assert by_count.more(2, 0.0)
    assert not by_count.more(3, 0.0)
    by_time = Plan(iterations=1, warmup=0, depth=1, duration=3600.0)
    assert by_time.more(10**9, time.perf_counter())
    assert not Plan(1, 0, 1, duration=0.0).more(0, time.perf_counter())


@pytest.mark.parametrize(("text", "seconds"), [("1ms", 1e-3), ("10ms", 1e-2), ("500us", 5e-4),
                                               ("0.25s", 0.25), ("2", 2.0)])  # fmt: skip
def test_a_pace_is_read_with_its_unit(text: str, seconds: float) -> None:
    assert pace(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "0ms", "-1ms", "fast", "infms"])
def test_a_pace_that_is_no_time_is_refused(text: str) -> None:
    with pytest.raises(Exception, match=f"not {text!r}"):
        pace(text)


@pytest.mark.asyncio
async def test_paced_latencies_keep_their_schedule_and_count_the_machine_cpu() -> None:
    ops = 0

    async def op() -> None:
        nonlocal ops
        ops += 1

    begin = time.perf_counter()
    samples = await _latencies(Plan(5, 1, 1, pace=0.02), op, None)
    assert len(samples) == 5
    assert ops == 6
    assert time.perf_counter() - begin >= 4 * 0.02  # four waits between five starts
    assert samples.cpu_per_op is not None
    assert samples.cpu_per_op >= 0
    assert machine_busy() is not None
    summary = Latency.of(samples)
    assert summary.cpu == pytest.approx(samples.cpu_per_op * 1e6)
    text = row(Result("aiordma", "send_lat", 64, 1, 5, sum(samples), summary))
    assert f"[machine CPU {summary.cpu:.0f} us/op]" in text


def test_progress_prints_one_line_per_step_off_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(2, out)
    progress.start("aiordma write_lat 64 B")
    progress.update(64)
    progress.start("tcp write_lat 64 B")
    progress.clear()
    assert out.getvalue().splitlines() == [
        "[1/2] aiordma write_lat 64 B ...",
        "[2/2] tcp write_lat 64 B ...",
    ]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from aiordma.bench.plot import _series, plot

    results = [
        _lat("aiordma", 700, 64),
        _lat("aiordma", 900, 4096),
        _lat("perftest", 25, 64),
        Result("aiordma", "write_bw", 65536, 8, 100, 0.2),
        Result("tcp", "write_bw", 65536, 8, 100, 0.1),
        Result("perftest", "write_bw", 65536, 8, 100, math.inf),  # measured nothing
    ]
    assert ("write_bw", "perftest") not in _series(results, latency=False)
    out = tmp_path / "bench.png"
    plot(results, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_plot_needs_matplotlib_only_when_asked(tmp_path: Path) -> None:
    code = "import sys; sys.modules['matplotlib'] = None; import aiordma.bench.plot"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_mode_has_a_tcp_pattern() -> None:
    from aiordma.bench.command import MODES

    # connect has no call: its TCP baseline opens a connection (runner.measure_tcp).
    assert set(tcp.PATTERN) == set(MODES) - {"connect"}
    assert tcp.request_for("read_bw", 4096) == ("source", b"4096")
    assert tcp.request_for("write_lat", 8) == ("sink", bytes(8))
    assert tcp.request_for("rpc_lat", 3) == ("echo", bytes(3))
    # A ping-pong or a stream is compared with plain framed TCP, not with the RPC.
    assert tcp.request_for("msg_lat", 64) == ("ping", bytes(64))
    assert tcp.request_for("msg_bw", 64) == ("stream", bytes(64))
    assert set(tcp.PATTERN.values()) <= {*tcp.METHODS, *tcp.PLAIN}


@pytest.mark.asyncio
async def test_tcp_baseline_answers_concurrent_calls() -> None:
    server = await tcp.start_server("127.0.0.1")
    port = server.sockets[0].getsockname()[1]
    try:
        async with await tcp.Client.connect("127.0.0.1", port) as client:
            echoed, sunk, sourced = await asyncio.gather(
                client.call("echo", b"abc"),
                client.call("sink", bytes(1000)),
                client.call("source", b"70000"),
            )
            assert (echoed, sunk, sourced) == (b"abc", b"", bytes(70000))
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
async def test_tcp_framed_ping_and_stream() -> None:
    server = await tcp.start_server("127.0.0.1")
    port = server.sockets[0].getsockname()[1]
    try:
        async with await tcp.Framed.connect("127.0.0.1", port, "ping") as ping:
            assert await ping.ping(b"abc") == b"abc"
            assert await ping.ping(bytes(70000)) == bytes(70000)
        async with await tcp.Framed.connect("127.0.0.1", port, "stream") as stream:
            for size in (1, 70000, 64):
                await stream.send(bytes(size))
            await asyncio.wait_for(stream.flush(), 10)  # answered only after the three frames
        with pytest.raises(ValueError, match="not a framed protocol"):
            await tcp.Framed.connect("127.0.0.1", port, "echo")
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
async def test_tcp_calls_fail_when_the_server_goes_away() -> None:
    accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result(writer)
        await reader.read(1)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, await tcp.Client.connect("127.0.0.1", port) as client:
        call = asyncio.ensure_future(client.call("echo", b"x"))
        writer = await asyncio.wait_for(accepted, 10)
        writer.close()
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(call, 10)
        with pytest.raises(ConnectionError):
            await client.call("echo", b"y")


def test_json_rows_round_trip() -> None:
    data = json.loads(json.dumps(_lat("aiordma", 5).to_json()))
    assert data["latency"]["p50"] == 5


def test_a_reference_that_measured_nothing_gives_no_ratio() -> None:
    ours = Result("aiordma", "read_bw", 64, 4, 40, 0.01)
    nothing = to_result("read_bw", ["64", "40", "0.00", "0.00", "0.000000"], 4)
    assert ratio(ours, nothing) == "no ratio: perftest reported 0"
    assert row(ours, [nothing]).endswith("(no ratio: perftest reported 0)")
    assert json.loads(json.dumps(nothing.to_json(), allow_nan=False))["seconds"] is None
    rate = Result("aiordma", "send_rate", 64, 4, 40, 0.01)
    assert (
        ratio(rate, Result("tcp", "send_rate", 64, 4, 40, math.inf)) == "no ratio: tcp reported 0"
    )
    assert ratio(_lat("aiordma", 300), _lat("perftest", 0)) == "no ratio: perftest reported 0"
