"""The examples run as users run them, as separate programs on the lab device."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Lab, popen_python, run_python

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(lab: Lab, name: str) -> str:
    proc = run_python([str(EXAMPLES / name), lab.device], timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_loopback_send_recv(lab: Lab) -> None:
    out = _run(lab, "loopback_send_recv.py")
    assert "received 15 bytes: hello over RDMA" in out
    assert "imm=0xc0ffee and 5 bytes" in out


def test_write_read(lab: Lab) -> None:
    out = _run(lab, "write_read.py")
    assert "server memory now holds: RDMA write!" in out
    assert "client read back: from afar." in out
    assert "cmp_swap(15 -> 42): counter was 15, now 42" in out


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_no_resources_left_behind(lab: Lab, loop: str) -> None:
    """Opening, using and closing a device returns rdma's resource counts to where they were."""
    script = f"""
import asyncio, json, subprocess, sys
import aiordma

def counts():
    out = subprocess.run(["rdma", "-j", "resource", "show"], capture_output=True, text=True,
                         check=True).stdout
    row = next(r for r in json.loads(out) if r["ifname"] == {lab.device!r})
    return {{k: row[k] for k in ("pd", "cq", "qp", "mr")}}

async def cycle():
    async with aiordma.Device({lab.device!r}) as dev:
        a, b = await aiordma.connect_loopback_pair(dev)
        mr = dev.alloc(64)
        pending = await b.post_recv_batch([mr])      # left pending on purpose
        await a.post_send(dev.register(b"x" * 8))
        await pending[0]
        await b.post_recv_batch([mr])                # this one is still posted at close

before = counts()
for _ in range(5):
    if {loop!r} == "uvloop":
        import uvloop; uvloop.run(cycle())
    else:
        asyncio.run(cycle())
after = counts()
print(json.dumps([before, after]))
sys.exit(0 if before == after else 1)
"""
    proc = run_python(["-c", script], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _serve_and_run_client(
    lab: Lab, server_argv: list[str], client_argv: Callable[[str], list[str]]
) -> tuple[str, str]:
    """Start an example server (serving one client), run ``client_argv(port)`` against
    it, and return both outputs once both have exited cleanly."""
    server = popen_python(server_argv)
    try:
        assert server.stdout is not None
        ready = server.stdout.readline().split()
        assert ready[:3] == ["listening", "on", lab.addr], ready
        client = run_python(client_argv(ready[3]), timeout=300)
        assert client.returncode == 0, client.stderr
        out, err = server.communicate(timeout=60)
        assert server.returncode == 0, err
        return client.stdout, out
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()


def test_echo_server_and_client_as_two_programs(lab: Lab) -> None:
    out, server_out = _serve_and_run_client(
        lab,
        [str(EXAMPLES / "echo_server.py"), lab.addr, "0", "--max-clients", "1"],
        lambda port: [str(EXAMPLES / "echo_client.py"), lab.addr, port, "hi", "RDMA"],
    )
    assert out.splitlines()[1:] == ["echo: hi", "echo: RDMA"]
    assert "left after 2 messages" in server_out


def _serve_example(
    lab: Lab, script: str, server_args: list[str], client_args: list[str]
) -> tuple[str, str]:
    """``script serve`` and ``script client`` (the two-role examples)."""
    path = str(EXAMPLES / script)
    return _serve_and_run_client(
        lab,
        [path, "serve", lab.addr, "0", *server_args, "--max-clients", "1"],
        lambda port: [path, "client", lab.addr, port, *client_args],
    )


def test_rpc_kv_example(lab: Lab) -> None:
    out, _ = _serve_example(lab, "rpc_kv.py", [], [])
    lines = out.splitlines()
    for size in (11, 1024, 65536, 4194304):
        assert any(line.startswith(f"value-{size}: {size} bytes stored") for line in lines), out
    assert "keys: value-1024 value-11 value-4194304 value-65536" in lines
    assert "deleted value-11: True" in lines
    assert "get value-11: KeyError 'value-11'" in lines


def test_event_stream_example(lab: Lab) -> None:
    out, server_out = _serve_example(
        lab, "event_stream.py", [], ["--events", "3000", "--batch", "50"]
    )
    sent, summary, matches = out.splitlines()
    assert sent.startswith("sent 3000 events in 60 calls")
    assert summary.startswith("server: 3000 events in ")
    assert int(summary.split()[4]) < 3000  # many events a receive call
    assert matches == "digest matches: True"
    assert "left after 3000 events" in server_out


def test_bulk_transfer_example(lab: Lab) -> None:
    out, server_out = _serve_example(
        lab, "bulk_transfer.py", ["--size", "8"], ["--chunk", "256", "--depth", "4"]
    )
    sent = next(line.split()[-1] for line in out.splitlines() if line.startswith("sent sha256"))
    assert f"received {8 << 20} bytes, sha256 {sent}" in server_out
    assert "read back intact: True" in out


def test_kv_blocks_example(lab: Lab) -> None:
    out, server_out = _serve_example(lab, "kv_blocks.py", [], ["--blocks", "8"])
    assert out.splitlines() == [
        "8 blocks written and committed",
        "commit of a block never leased: PermissionError",
    ]
    assert "client left: 8 leases returned, 8 blocks committed" in server_out


def test_kv_transfer_example_as_two_programs(lab: Lab) -> None:
    path = str(EXAMPLES / "kv_transfer.py")
    decode = popen_python([path, "decode", lab.addr, "--blocks", "1000"])
    try:
        assert decode.stdout is not None
        agent = decode.stdout.readline().split()
        blocks = decode.stdout.readline().split()
        assert agent[0] == "agent", agent
        assert blocks[0] == "blocks", blocks
        prefill = run_python([path, "prefill", agent[1], blocks[1]], timeout=300)
        assert prefill.returncode == 0, prefill.stderr
        out, err = decode.communicate(timeout=60)
        assert decode.returncode == 0, err
    finally:
        if decode.poll() is None:
            decode.kill()
            decode.communicate()
    assert prefill.stdout.splitlines() == [
        f"wrote 1000 blocks ({1000 * 4096} bytes) in one transfer",
        "read back 8 blocks: same",
    ]
    assert "1000 blocks from agent" in out
    assert out.rstrip().endswith("1000 verified")
