"""The passive side: a server in the test's loop, clients in other processes (lab device)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import aiordma
from aiordma import Access
from tests.conftest import Lab, read_line, run_peer, spawn_peer, stop_peer
from tests.peer import echo, prepare_inbox

SIZE = 4096


class EchoService:
    """Echoes every message; records how each connection ended."""

    def __init__(self) -> None:
        self.served = 0
        self.endings: list[BaseException] = []
        self.lost = asyncio.Event()

    async def __call__(self, conn: aiordma.Connection) -> None:
        self.served += 1
        self.endings.append(await echo(conn))
        self.lost.set()


@pytest_asyncio.fixture
async def echo_server(lab: Lab) -> AsyncIterator[tuple[aiordma.Server, EchoService]]:
    service = EchoService()
    async with await aiordma.start_server(service, lab.addr, 0, prepare=prepare_inbox) as server:
        yield server, service


@pytest.mark.asyncio
async def test_hundred_clients_at_once(
    lab: Lab, echo_server: tuple[aiordma.Server, EchoService]
) -> None:
    server, service = echo_server
    port = server.addresses[0][1]
    out = await run_peer("clients", lab.addr, str(port), "100", "3")
    assert out.split() == ["ok", "100"]
    assert service.served == 100
    async with asyncio.timeout(60):
        while len(service.endings) < 100:
            await service.lost.wait()
            service.lost.clear()
    assert not server.connections


@pytest.mark.asyncio
async def test_accept_and_reject_by_private_data_and_address(lab: Lab) -> None:
    requests: list[aiordma.ConnectionRequest] = []

    async def decide(request: aiordma.ConnectionRequest) -> bytes:
        requests.append(request)
        if request.peer_address[0] != lab.addr:
            raise aiordma.RejectConnection(b"wrong network")
        if not request.private_data.startswith(b"token:"):
            raise aiordma.RejectConnection(b"missing token")
        return b"welcome " + request.private_data.rstrip(b"\0")[6:]

    async with await aiordma.start_server(lambda conn: None, lab.addr, 0, accept=decide) as srv:
        port = str(srv.addresses[0][1])
        assert (
            await run_peer("try", lab.addr, port, "token:alice")
        ).strip() == "accepted welcome alice"
        assert (
            await run_peer("try", lab.addr, port, "no token")
        ).strip() == "rejected missing token"
    assert [r.private_data.rstrip(b"\0") for r in requests] == [b"token:alice", b"no token"]
    assert all(len(r.private_data) == 56 for r in requests)


@pytest.mark.asyncio
@pytest.mark.both_loops("subprocess")
async def test_client_killed_mid_transfer(lab: Lab) -> None:
    service = EchoService()
    exposed: list[aiordma.MemoryRegion] = []

    def hand_out_memory(request: aiordma.ConnectionRequest) -> bytes:
        mr = aiordma.Device.shared(lab.device).alloc(SIZE, Access.REMOTE_WRITE)
        exposed.append(mr)
        return mr.remote().to_bytes()

    async with await aiordma.start_server(
        service, lab.addr, 0, accept=hand_out_memory, prepare=prepare_inbox
    ) as server:
        port = str(server.addresses[0][1])
        proc = await spawn_peer("stream", lab.addr, port)
        try:
            assert await read_line(proc) == "streaming"
            proc.send_signal(signal.SIGKILL)
            async with asyncio.timeout(20):
                await service.lost.wait()
        finally:
            await stop_peer(proc)
        assert isinstance(service.endings[0], aiordma.ConnectionLostError)
        # ... and the server goes on serving new clients.
        out = await run_peer("clients", lab.addr, port, "2", "2")
        assert out.split() == ["ok", "2"]
    for mr in exposed:
        mr.close()


@pytest.mark.asyncio
async def test_wildcard_listener_serves_ipv4_and_ipv6(lab: Lab) -> None:
    if lab.addr6 is None:
        pytest.fail("the lab provides an IPv6 address; this device has none", pytrace=False)
    peers: list[tuple[str, int]] = []

    async def note(conn: aiordma.Connection) -> None:
        peers.append(conn.peer_address)

    async with await aiordma.start_server(note, None, 0) as server:
        host, port = server.addresses[0]
        assert host == "::"
        assert port > 0
        for addr in (lab.addr, lab.addr6):
            async with await aiordma.connect(addr, port) as conn:
                assert conn.peer_address[1] == port
                await conn.wait_closed()  # the server closes it when `note` returns
    assert {p[0].removeprefix("::ffff:") for p in peers} == {lab.addr, lab.addr6}


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_closing_the_server_disconnects_its_clients(
    lab: Lab, echo_server: tuple[aiordma.Server, EchoService]
) -> None:
    server, _ = echo_server
    conn = await aiordma.connect(lab.addr, server.addresses[0][1])
    (pending,) = await conn.post_recv_batch([conn.alloc(64)])
    assert server.is_serving()
    server.close()
    assert not server.is_serving()
    server.close_clients()
    await asyncio.wait_for(server.wait_closed(), 30)
    with pytest.raises(aiordma.ConnectionLostError):
        await asyncio.wait_for(pending, 20)
    await asyncio.wait_for(conn.wait_closed(), 20)


@pytest.mark.asyncio
@pytest.mark.both_loops("exception handler")
async def test_failing_handler_is_logged_and_closes_only_its_connection(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(conn: aiordma.Connection) -> None:
        raise RuntimeError("handler bug")

    async with await aiordma.start_server(broken, lab.addr, 0) as server:
        port = server.addresses[0][1]
        for _ in range(2):
            conn = await aiordma.connect(lab.addr, port)
            await asyncio.wait_for(conn.wait_closed(), 20)
    assert sum("handler bug" in r.exc_text for r in caplog.records if r.exc_text) == 2


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_serve_forever_closes_when_cancelled_and_refuses_a_closed_server(lab: Lab) -> None:
    server = await aiordma.start_server(lambda conn: None, lab.addr, 0)
    port = server.addresses[0][1]
    task = asyncio.create_task(server.serve_forever())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="already awaited"):  # as asyncio's (issue 81)
        await server.serve_forever()
    assert not task.done()
    assert server.is_serving()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not server.is_serving()
    await server.wait_closed()
    assert server.addresses == []  # as asyncio's Server.sockets once closed (issue 81)
    assert repr(server).endswith(" closed>")
    assert f":{port}" in repr(server)  # the repr still says where
    with pytest.raises(RuntimeError, match="is closed"):  # as asyncio's servers (issue 41)
        await server.serve_forever()


@pytest.mark.asyncio
async def test_the_other_family_of_a_listener_is_nothing_listening(lab: Lab) -> None:
    """Issue 81: the kernel's refusal (CM reason 28, no data) of a request to
    the IPv6 address at an IPv4 listener's port read as the application's."""
    assert lab.addr6 is not None, "the lab provides an IPv6 address"
    async with await aiordma.start_server(lambda conn: None, lab.addr, 0) as server:
        with pytest.raises(aiordma.NoListenerError, match="other address family") as info:
            await aiordma.connect(lab.addr6, server.addresses[0][1])
    assert info.value.reason == 28

    def turn_down(request: aiordma.ConnectionRequest) -> None:
        raise aiordma.RejectConnection()  # no data: still the application's rejection

    async with await aiordma.start_server(lambda conn: None, lab.addr, 0, accept=turn_down) as s:
        with pytest.raises(aiordma.ConnectionRejectedError, match="rejected the connection") as no:
            await aiordma.connect(lab.addr, s.addresses[0][1])
    assert (no.value.reason, no.value.private_data) == (28, b"")


@pytest.mark.asyncio
async def test_oversized_accept_data_rejects_the_request(lab: Lab) -> None:
    """Issue 81: the client saw only "rejected the connection"; it is told the
    server's accept callback failed, and of what kind."""
    async with await aiordma.start_server(
        lambda conn: None, lab.addr, 0, accept=lambda request: bytes(197)
    ) as server:
        with pytest.raises(
            aiordma.ConnectionRejectedError,
            match=r"could not set the connection up on its side: ValueError: its accept "
            r"callback failed",
        ):
            await aiordma.connect(lab.addr, server.addresses[0][1])
    with pytest.raises(ValueError, match="at most 148"):
        aiordma.RejectConnection(bytes(149))


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_shutdown_cancels_handlers_that_await_something_else(lab: Lab) -> None:
    started, outcome = asyncio.Event(), []

    async def stuck(conn: aiordma.Connection) -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # never looks at its connection
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    server = await aiordma.start_server(stuck, lab.addr, 0, shutdown_grace=0.2)
    port = server.addresses[0][1]
    conn = await aiordma.connect(lab.addr, port)
    await asyncio.wait_for(started.wait(), 60)
    async with asyncio.timeout(60):
        async with server:
            pass
    assert outcome == ["cancelled"]
    assert not server.connections
    await asyncio.wait_for(conn.wait_closed(), 60)


@pytest.mark.asyncio
async def test_ports_outside_the_valid_range_are_refused(lab: Lab) -> None:
    for port in (65536, 65536 + 7471, 70000, -1):
        with pytest.raises(ValueError, match="outside 1-65535"):
            await aiordma.connect(lab.addr, port)
        with pytest.raises(ValueError, match="outside 0-65535"):
            await aiordma.start_server(lambda conn: None, lab.addr, port)
    with pytest.raises(ValueError, match="outside 1-65535"):
        await aiordma.connect(lab.addr, 0)
    with pytest.raises(TypeError, match="int"):
        await aiordma.connect(lab.addr, "7471")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_listening_on_an_address_of_no_rdma_device_names_the_ones_that_are(
    lab: Lab,
) -> None:
    with pytest.raises(OSError, match=r"127\.0\.0\.1 is on no RDMA device") as info:
        await aiordma.start_server(lambda conn: None, "127.0.0.1", 0)
    assert lab.addr in str(info.value)


@pytest.mark.asyncio
async def test_private_data_must_be_bytes(lab: Lab) -> None:
    for bad in (5, [1, 2, 3], "text"):
        with pytest.raises(TypeError, match="private data must be bytes"):
            await aiordma.connect(lab.addr, 7471, private_data=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="private data must be bytes"):
        aiordma.RejectConnection(7)  # type: ignore[arg-type]


@pytest.mark.asyncio
@pytest.mark.both_loops("exception handler")
async def test_a_peer_fault_is_one_warning_line_naming_the_peer(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    ended = asyncio.Event()

    async def serve(conn: aiordma.Connection) -> None:
        try:
            await conn.prepared.recv_message()  # the peer has no channel: the HELLO fails
        finally:
            ended.set()

    caplog.set_level(logging.DEBUG)
    async with await aiordma.start_server(
        serve, lab.addr, 0, prepare=aiordma.prepare_channel
    ) as server:
        port = server.addresses[0][1]
        async with await aiordma.connect(lab.addr, port):
            await asyncio.wait_for(ended.wait(), 60)
    gc.collect()  # an unretrieved future exception would be logged now
    server_lines = [r for r in caplog.records if r.name == "aiordma.cm.server"]
    assert [r.levelno for r in server_lines] == [logging.WARNING], server_lines
    assert server_lines[0].exc_info is None
    assert lab.addr in server_lines[0].getMessage()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_connects_cancelled_at_any_moment_are_no_warning_on_the_server(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 41: a cancelled connect made the server log a warning,
    # OSError(22, 'rdma_init_qp_attr: Invalid argument'). A client giving
    # up is its own business: the server says so at INFO, as ConnectionLostError.
    # Where the cancel lands is a race; the sweep makes it land at each step.
    caplog.set_level(logging.INFO, logger="aiordma.cm.server")
    server = await aiordma.start_server(lambda conn: conn.wait_closed(), lab.addr, 0)
    port = server.addresses[0][1]
    for step in range(40):
        task = asyncio.create_task(aiordma.connect(lab.addr, port))
        await asyncio.sleep(step * 0.002)  # the moment of the cancel is what varies
        task.cancel()
        try:
            conn = await task
        except asyncio.CancelledError:
            continue
        await conn.close()
    server.close()
    server.close_clients()
    await asyncio.wait_for(server.wait_closed(), 60)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warnings, [r.getMessage() for r in warnings]


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_closing_many_channel_connections_is_quiet(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    async def idle(conn: aiordma.Connection) -> None:
        await conn.wait_closed()

    caplog.set_level(logging.DEBUG, logger="aiordma")
    async with await aiordma.start_server(
        idle, lab.addr, 0, prepare=aiordma.prepare_channel
    ) as server:
        port = server.addresses[0][1]
        conns = [
            await aiordma.connect(lab.addr, port, prepare=aiordma.prepare_channel)
            for _ in range(40)
        ]
        await asyncio.wait_for(asyncio.gather(*(c.close() for c in conns)), 120)
        server.close()
        server.close_clients()
        await asyncio.wait_for(server.wait_closed(), 120)
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not noisy, noisy[:5]


LATE = 1.0
"""Seconds a busy server's handler takes to post its first receive (four
times the patience the old RNR defaults gave a sender)."""


@pytest.mark.asyncio
async def test_a_send_right_after_connect_waits_for_a_late_first_receive(lab: Lab) -> None:
    """Under load a handler posts its first receive late; the client's first
    send, made as soon as connect() returns, must wait for it, not fail."""
    assert aiordma.QueuePairOptions().rnr_bound > 2 * LATE
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def late_handler(conn: aiordma.Connection) -> None:
        await asyncio.sleep(LATE)  # the load being simulated, not a wait for an event
        inbox = conn.alloc(SIZE)
        completion = await conn.post_recv(inbox)
        got.set_result(bytes(inbox.view()[: completion.byte_len]))

    async with await aiordma.start_server(late_handler, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with await aiordma.connect(lab.addr, port) as conn:
            await conn.post_send(conn.register(b"first"))
            assert await asyncio.wait_for(got, 10) == b"first"


@pytest.mark.asyncio
async def test_a_request_the_server_cannot_set_up_is_rejected_saying_why(lab: Lab) -> None:
    async def out_of_memory(conn: aiordma.Connection) -> None:
        # What registering the connection's buffers raises past 'ulimit -l'.
        raise aiordma.MemoryLimitError("cannot register 655360 bytes", 655360, 1 << 30, 1 << 30)

    async with await aiordma.start_server(
        lambda conn: None, lab.addr, 0, prepare=out_of_memory
    ) as server:
        port = server.addresses[0][1]
        with pytest.raises(aiordma.ConnectionRejectedError) as info:
            await asyncio.wait_for(aiordma.connect(lab.addr, port), 30)
    message = str(info.value)
    assert "could not set the connection up on its side" in message
    assert "MemoryLimitError: it is out of lockable memory" in message
    assert "655360" not in message  # the server's own figures stay in its log
