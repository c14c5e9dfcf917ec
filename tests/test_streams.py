"""asyncio streams over a message channel (lab device, asyncio and uvloop).

The edge cases are checked against what asyncio's own streams do (the
reader *is* an ``asyncio.StreamReader``; what is ours is the transport
under it), and a third-party protocol implementation, h11's HTTP/1.1, runs
over it unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import h11
import numpy as np
import pytest

import aiordma
from tests.conftest import Lab

pytestmark = pytest.mark.both_loops("streams")  # the adapter is a transport on the loop

TIMEOUT = 60
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serving(lab: Lab, handler: Handler, **kwargs: object) -> AsyncIterator[int]:
    server = await aiordma.start_stream_server(handler, lab.addr, 0, **kwargs)  # type: ignore[arg-type]
    try:
        yield server.addresses[0][1]
    finally:
        server.close()
        server.close_clients()
        await asyncio.wait_for(server.wait_closed(), TIMEOUT)


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


@pytest.mark.asyncio
async def test_lines_exact_reads_and_partial_reads(lab: Lab) -> None:
    async with serving(lab, echo) as port:
        reader, writer = await aiordma.open_connection(lab.addr, port)
        assert isinstance(reader, asyncio.StreamReader)
        assert isinstance(writer, asyncio.StreamWriter)
        assert writer.get_extra_info("peername") == (lab.addr, port)
        writer.write(b"first line\nsecond")
        writer.writelines([b" line\n", b"0123456789"])
        await writer.drain()
        assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"first line\n"
        assert await reader.readuntil(b"\n") == b"second line\n"
        assert await reader.readexactly(4) == b"0123"
        partial = await reader.read(100)  # what has arrived, at most 100 bytes
        assert b"0123456789"[4:].startswith(partial)
        assert partial
        # Issue 62: bytes of Python objects were taken and sent.
        with pytest.raises(TypeError, match="holds Python objects"):
            writer.write(np.array([object()], dtype=object))  # type: ignore[arg-type]
        assert writer.transport.get_write_buffer_size() == 0
        writer.close()
        await writer.wait_closed()
        assert writer.is_closing()


@pytest.mark.asyncio
async def test_eof_when_the_peer_closes_after_everything_it_wrote(lab: Lab) -> None:
    async def talk_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"x" * 100_000 + b"bye")
        writer.close()  # without drain: what was written still goes first
        await writer.wait_closed()

    async with serving(lab, talk_and_close) as port:
        reader, writer = await aiordma.open_connection(lab.addr, port)
        data = await asyncio.wait_for(reader.read(), TIMEOUT)  # until EOF
        assert data == b"x" * 100_000 + b"bye"
        assert reader.at_eof()
        assert await reader.read(10) == b""
        with pytest.raises(asyncio.IncompleteReadError) as caught:
            await reader.readexactly(1)
        assert caught.value.partial == b""
        writer.close()
        await writer.wait_closed()


@pytest.mark.asyncio
async def test_write_eof_half_closes_and_the_answer_still_comes_back(lab: Lab) -> None:
    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # until the client's EOF
        writer.write(str(len(data)).encode())
        writer.close()
        await writer.wait_closed()

    async with serving(lab, count) as port:
        reader, writer = await aiordma.open_connection(lab.addr, port)
        assert writer.can_write_eof()
        writer.write(b"y" * 12345)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b"12345"
        with pytest.raises(RuntimeError):
            writer.write(b"after eof")
        writer.close()
        await writer.wait_closed()


@pytest.mark.asyncio
async def test_incomplete_read_and_limit_overrun_as_asyncio_streams_raise_them(lab: Lab) -> None:
    async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"a" * 300 + b"\n" + b"tail")
        writer.close()
        await writer.wait_closed()

    async with serving(lab, send) as port:
        reader, writer = await aiordma.open_connection(lab.addr, port, limit=100)
        with pytest.raises(asyncio.LimitOverrunError) as overrun:
            await asyncio.wait_for(reader.readuntil(b"\n"), TIMEOUT)
        assert overrun.value.consumed >= 100
        assert await reader.readexactly(301) == b"a" * 300 + b"\n"
        with pytest.raises(asyncio.IncompleteReadError) as caught:
            await asyncio.wait_for(reader.readexactly(10), TIMEOUT)
        assert caught.value.partial == b"tail"
        assert caught.value.expected == 10
        writer.close()
        await writer.wait_closed()


@pytest.mark.asyncio
async def test_megabytes_each_way_arrive_intact(lab: Lab) -> None:
    payload = hashlib.sha256(b"seed").digest() * (8 * 32768)  # 8 MiB
    async with serving(lab, echo) as port:
        reader, writer = await aiordma.open_connection(lab.addr, port)

        async def send() -> None:
            for start in range(0, len(payload), 1_000_003):
                writer.write(payload[start : start + 1_000_003])
                await writer.drain()
            writer.write_eof()

        sending = asyncio.create_task(send())
        back = await asyncio.wait_for(reader.read(), TIMEOUT * 2)
        await sending
        assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()
        writer.close()
        await writer.wait_closed()


@pytest.mark.asyncio
async def test_a_slow_reader_makes_drain_wait_and_nothing_is_lost(lab: Lab) -> None:
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        data = await reader.read()
        writer.write(hashlib.sha256(data).digest())
        writer.close()
        await writer.wait_closed()

    chunk = b"z" * (1 << 20)
    async with serving(lab, slow, limit=1 << 16) as port:
        reader, writer = await aiordma.open_connection(lab.addr, port)
        for _ in range(4):
            writer.write(chunk)
        writer.write(chunk * 4)
        draining = asyncio.ensure_future(writer.drain())
        # The server reads nothing: the channel's credits and the reader's
        # pause leave 8 MiB with nowhere to go, so drain() must wait.
        done, _ = await asyncio.wait([draining], timeout=2)
        assert not done
        assert writer.transport.get_write_buffer_size() > 0
        release.set()
        await asyncio.wait_for(draining, TIMEOUT)
        writer.write_eof()
        digest = await asyncio.wait_for(reader.read(), TIMEOUT)
        assert digest == hashlib.sha256(chunk * 8).digest()
        writer.close()
        await writer.wait_closed()


@pytest.mark.asyncio
async def test_a_lost_connection_is_an_error_not_eof(lab: Lab) -> None:
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(writer)

    async with serving(lab, keep) as port:
        reader, writer = await aiordma.open_connection(lab.addr, port)
        server_writer = await asyncio.wait_for(accepted.get(), TIMEOUT)
        server_writer.transport.abort()  # no EOF sent: as a reset socket
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(reader.read(), TIMEOUT)
        writer.write(b"x")  # dropped, as on a reset socket
        with pytest.raises(ConnectionError):
            await writer.drain()
        writer.close()
        with pytest.raises(ConnectionError):  # as asyncio's, after a reset
            await writer.wait_closed()


# -- a protocol nobody here wrote: h11's HTTP/1.1 ----------------------------


async def next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(1 << 16))
            continue
        return event


async def http_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    conn = h11.Connection(h11.SERVER)
    while True:
        request = await next_event(conn, reader)
        if not isinstance(request, h11.Request):
            break
        body = b""
        while isinstance(event := await next_event(conn, reader), h11.Data):
            body += event.data
        assert isinstance(event, h11.EndOfMessage)
        reply = hashlib.sha256(body).hexdigest().encode() + b" " + request.target
        writer.write(conn.send(h11.Response(status_code=200, headers=[
            ("content-length", str(len(reply))), ("server", "h11-over-rdma")]))
            or b"")  # fmt: skip
        writer.write(conn.send(h11.Data(data=reply)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()
        if conn.our_state is h11.MUST_CLOSE:
            break
        conn.start_next_cycle()
    writer.close()
    await writer.wait_closed()


@pytest.mark.asyncio
async def test_h11_http_requests_and_responses_over_rdma_streams(lab: Lab) -> None:
    async with serving(lab, http_server) as port:
        reader, writer = await aiordma.open_connection(lab.addr, port)
        conn = h11.Connection(h11.CLIENT)
        for n, size in enumerate([0, 10, 70_000, 3_000_000]):
            body = bytes(range(256)) * (size // 256) + b"!" * (size % 256)
            headers = [("host", "lab"), ("content-length", str(len(body)))]
            writer.write(conn.send(h11.Request(method="POST", target=f"/{n}", headers=headers))
                         or b"")  # fmt: skip
            writer.write(conn.send(h11.Data(data=body)) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
            response = await asyncio.wait_for(next_event(conn, reader), TIMEOUT)
            assert isinstance(response, h11.Response)
            assert response.status_code == 200
            assert (b"server", b"h11-over-rdma") in response.headers
            got = b""
            while isinstance(event := await next_event(conn, reader), h11.Data):
                got += event.data
            assert isinstance(event, h11.EndOfMessage)
            assert got == hashlib.sha256(body).hexdigest().encode() + f" /{n}".encode()
            conn.start_next_cycle()
        writer.close()
        await writer.wait_closed()
