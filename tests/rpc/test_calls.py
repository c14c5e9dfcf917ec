"""RPC calls against a server in another process (lab device, asyncio and uvloop)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import signal
import weakref
from collections.abc import Iterator
from typing import Any

import numpy
import pytest

import aiordma
from aiordma import rpc
from aiordma.rpc.frames import PROTOCOL, Frame, FrameKind
from tests.channel.test_channel import exposures_ended
from tests.conftest import Lab, run_python, spawn_peer, start_peer_server
from tests.peer import blob

TIMEOUT = 60


@pytest.fixture(scope="module")
def rpc_port(lab: Lab) -> Iterator[int]:
    yield from start_peer_server(lab, "rpc")


@pytest.mark.asyncio
async def test_a_thousand_concurrent_calls_from_ten_clients(lab: Lab, rpc_port: int) -> None:
    clients = [await rpc.connect(lab.addr, rpc_port) for _ in range(10)]
    try:

        async def calls(client: rpc.Client, tag: int) -> list[bool]:
            payloads = [f"client {tag} call {i} ".encode() * (i % 7 + 1) for i in range(100)]
            replies = await asyncio.gather(*(client.call("digest", p) for p in payloads))
            return [r == hashlib.sha256(p).digest() for p, r in zip(payloads, replies, strict=True)]

        async with asyncio.timeout(TIMEOUT * 2):
            results = await asyncio.gather(*(calls(c, t) for t, c in enumerate(clients)))
    finally:
        for client in clients:
            client.close()
        await asyncio.gather(*(c.wait_closed() for c in clients))
    assert sum(len(r) for r in results) == 1000
    assert all(all(r) for r in results)


@pytest.mark.asyncio
async def test_handler_exception_reaches_the_caller(lab: Lab, rpc_port: int) -> None:
    async with await rpc.connect(lab.addr, rpc_port) as client:
        with pytest.raises(rpc.RemoteError) as info:
            await asyncio.wait_for(client.call("fail", b"42"), TIMEOUT)
        assert info.value.remote_type == "ValueError"
        assert info.value.remote_message == "bad input: 42"
        assert info.value.method == "fail"
        assert await asyncio.wait_for(client.call("echo", b"after"), TIMEOUT) == b"after"


@pytest.mark.asyncio
async def test_unknown_method_is_a_clear_error(lab: Lab, rpc_port: int) -> None:
    async with await rpc.connect(lab.addr, rpc_port) as client:
        with pytest.raises(rpc.UnknownMethodError, match="no method named 'nope'"):
            await asyncio.wait_for(client.call("nope"), TIMEOUT)


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_timeout_raises_and_the_late_reply_is_discarded(lab: Lab, rpc_port: int) -> None:
    async with await rpc.connect(lab.addr, rpc_port) as client:
        before = int(await asyncio.wait_for(client.call("cancelled"), TIMEOUT))
        with pytest.raises(TimeoutError):
            await client.call("wait", timeout=0.2)
        # The server was asked to cancel the handler; the next calls get their own replies.
        assert await asyncio.wait_for(client.call("echo", b"mine"), TIMEOUT) == b"mine"
        assert int(await asyncio.wait_for(client.call("cancelled"), TIMEOUT)) == before + 1
        assert not client._pending


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_cancelling_one_call_leaves_the_others_alone(lab: Lab, rpc_port: int) -> None:
    async with await rpc.connect(lab.addr, rpc_port) as client:
        waiting = asyncio.create_task(client.call("wait"))
        others = [asyncio.create_task(client.call("echo", b"%d" % i)) for i in range(20)]
        done, _ = await asyncio.wait(others, timeout=TIMEOUT)
        assert len(done) == 20
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert [t.result() for t in others] == [b"%d" % i for i in range(20)]
        assert await asyncio.wait_for(client.call("echo", b"still"), TIMEOUT) == b"still"


@pytest.mark.asyncio
async def test_bulk_payloads_travel_both_ways(lab: Lab, rpc_port: int) -> None:
    size = 16 << 20
    async with await rpc.connect(lab.addr, rpc_port) as client:
        data = blob(size)
        assert await asyncio.wait_for(client.call("digest", data), TIMEOUT) == (
            hashlib.sha256(data).digest()
        )
        result = await asyncio.wait_for(client.call("blob", b"%d" % size), TIMEOUT)
        assert isinstance(result, bytearray)
        assert result == data
        # Zero-copy into memory of the caller's choosing.
        region = client.conn.alloc(size)
        n = await asyncio.wait_for(client.call("blob", b"%d" % size, into=region), TIMEOUT)
        assert n == size
        assert region.view() == data
        small = await asyncio.wait_for(client.call("blob", b"100", into=region), TIMEOUT)
        assert bytes(region.view()[:small]) == blob(100)


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [100, 1 << 20], ids=["eager", "rendezvous"])
async def test_a_reply_lands_in_a_numpy_array(lab: Lab, rpc_port: int, size: int) -> None:
    """Issue 62: ``into=array`` was refused ("cannot receive into ndarray")."""
    import numpy as np

    async with await rpc.connect(lab.addr, rpc_port) as client:
        landed = np.zeros(size, dtype=np.uint8)
        # (numpy's stubs make an array a Buffer from Python 3.12 on)
        call = client.call("blob", b"%d" % size, into=landed)  # type: ignore[arg-type]
        assert await asyncio.wait_for(call, TIMEOUT) == size
        assert landed.tobytes() == blob(size)


@pytest.mark.asyncio
async def test_python_objects_are_refused_as_payloads_and_results(lab: Lab) -> None:
    """Issue 62: an object array's call returned this process's addresses."""
    import numpy as np

    service = rpc.Service()

    @service.method()
    async def echo(payload: bytes) -> bytes:
        return payload

    @service.method()
    async def objects(payload: bytes) -> object:
        return np.array([1, "a"], dtype=object)

    async with (
        await rpc.start_server(service, lab.addr, 0) as server,
        await rpc.connect(lab.addr, server.addresses[0][1]) as client,
    ):
        with pytest.raises(TypeError, match="holds Python objects"):
            await client.call("echo", np.array([1, "a"], dtype=object))
        with pytest.raises(rpc.RemoteError, match="holds Python objects"):
            await asyncio.wait_for(client.call("objects", b""), TIMEOUT)
        assert await asyncio.wait_for(client.call("echo", b"usable"), TIMEOUT) == b"usable"


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [100, 1 << 20], ids=["eager", "rendezvous"])
async def test_reply_larger_than_into_fails_only_that_call(
    lab: Lab, rpc_port: int, size: int
) -> None:
    async with await rpc.connect(lab.addr, rpc_port) as client:
        region = client.conn.alloc(size // 2)
        with pytest.raises(aiordma.BufferTooSmallError):
            await asyncio.wait_for(client.call("blob", b"%d" % size, into=region), TIMEOUT)
        assert await asyncio.wait_for(client.call("blob", b"%d" % size), TIMEOUT) == blob(size)


@pytest.mark.asyncio
async def test_codec_is_pluggable(lab: Lab) -> None:
    service = rpc.Service(codec=rpc.JsonCodec())

    @service.method()
    async def add(args: dict[str, int]) -> dict[str, int]:
        return {"sum": args["a"] + args["b"]}

    async with await rpc.start_server(service, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with await rpc.connect(lab.addr, port, codec=rpc.JsonCodec()) as client:
            assert await asyncio.wait_for(client.call("add", {"a": 2, "b": 3}), TIMEOUT) == {
                "sum": 5
            }
        server.close_clients()


@pytest.mark.asyncio
async def test_a_codec_mismatch_says_the_codecs_differ(lab: Lab) -> None:
    """Issue 81: it surfaced as "RemoteError: echo: JSONDecodeError: Expecting value"."""
    service = rpc.Service(codec=rpc.JsonCodec())

    @service.method()
    async def echo(value: object) -> object:
        return value

    async with await rpc.start_server(service, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with await rpc.connect(lab.addr, port) as raw:  # RawCodec: bytes as they are
            with pytest.raises(rpc.RemoteError, match=r"service's codec \(JsonCodec\) could not "
                               r"decode the request .*same codec") as info:  # fmt: skip
                await asyncio.wait_for(raw.call("echo", b"not json"), TIMEOUT)
        assert info.value.remote_type == "JSONDecodeError"
    plain = rpc.Service()

    @plain.method()
    async def hello(value: bytes) -> bytes:
        return b"not json"

    async with await rpc.start_server(plain, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with await rpc.connect(lab.addr, port, codec=rpc.JsonCodec()) as client:
            with pytest.raises(ValueError, match="Expecting value") as decoding:
                await asyncio.wait_for(client.call("hello", "x"), TIMEOUT)
    assert any("client's codec (JsonCodec)" in note for note in decoding.value.__notes__)


@pytest.mark.asyncio
async def test_server_shutdown_fails_calls_in_flight(lab: Lab) -> None:
    service = rpc.Service()
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @service.method()
    async def hang(payload: bytes) -> bytes:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return b""

    server = await rpc.start_server(service, lab.addr, 0)
    client = await rpc.connect(lab.addr, server.addresses[0][1])
    try:
        calls = [asyncio.create_task(client.call("hang")) for _ in range(5)]
        await asyncio.wait_for(started.wait(), TIMEOUT)
        server.close()
        server.close_clients()
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), TIMEOUT)
        await asyncio.wait_for(server.wait_closed(), TIMEOUT)
    finally:
        client.close()
        await client.wait_closed()
    assert all(isinstance(r, aiordma.ConnectionLostError) for r in results), results
    assert cancelled.is_set()
    with pytest.raises(aiordma.ConnectionLostError):
        await client.call("hang")


@pytest.mark.asyncio
async def test_a_large_request_lost_with_its_server_leaves_no_unretrieved_reply(
    lab: Lab,
) -> None:
    """Issue 81: a call whose send failed after the reader had failed its reply
    future left that future unretrieved ("Future exception was never
    retrieved" from the loop_errors fixture); both callers still fail."""
    service = rpc.Service(max_concurrency=1)  # one call at a time: the second waits unread
    started = asyncio.Event()

    @service.method()
    async def hang(payload: bytes) -> bytes:
        started.set()
        await asyncio.Event().wait()
        return b""

    server = await rpc.start_server(service, lab.addr, 0)
    client = await rpc.connect(lab.addr, server.addresses[0][1])
    try:
        first = asyncio.create_task(client.call("hang", blob(1 << 20)))
        await asyncio.wait_for(started.wait(), TIMEOUT)
        second = asyncio.create_task(client.call("hang", blob(1 << 20)))
        channel = client.conn.prepared
        async with asyncio.timeout(TIMEOUT):
            while channel.exposed_bytes < 1 << 20:  # noqa: ASYNC110  (no event marks it)
                await asyncio.sleep(0.01)  # until the second request is announced, unread
        await asyncio.wait_for(server.aclose(), TIMEOUT)
        results = await asyncio.wait_for(
            asyncio.gather(first, second, return_exceptions=True), TIMEOUT
        )
    finally:
        await asyncio.wait_for(client.aclose(), TIMEOUT)
    assert all(isinstance(r, ConnectionError) for r in results), results
    del first, second, results  # their tracebacks hold the calls' frames, and so the futures
    gc.collect()


@pytest.mark.asyncio
async def test_garbage_rpc_frame_closes_only_that_connection(
    lab: Lab, rpc_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with await rpc.connect(lab.addr, rpc_port) as good:
        async with await rpc.connect(lab.addr, rpc_port) as bad:
            # A well-formed channel message whose RPC frame is a reply: no client sends one.
            await bad._channel.send_message(b"", head=Frame(FrameKind.REPLY, 1).pack())
            await asyncio.wait_for(bad.conn.wait_closed(), TIMEOUT)
            with pytest.raises(aiordma.ConnectionLostError):
                await bad.call("echo", b"x")
        assert await asyncio.wait_for(good.call("echo", b"fine"), TIMEOUT) == b"fine"


def test_method_registration_errors() -> None:
    service = rpc.Service()

    @service.method("get")
    async def get(payload: bytes) -> bytes:
        return payload

    with pytest.raises(ValueError, match="already registered"):
        service.add("get", get)
    with pytest.raises(ValueError, match="1 to 255 bytes"):
        service.add("", get)
    with pytest.raises(TypeError, match="must be callable"):
        service.add("x", "not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be an async function"):
        service.add("sync", lambda payload: payload)
    with pytest.raises(TypeError, match="method name must be a str"):
        service.add(7, get)  # type: ignore[arg-type]

    @service.method  # without parentheses, as with many decorators
    async def bare(payload: bytes) -> bytes:
        return payload

    class Handler:
        async def __call__(self, payload: bytes) -> bytes:
            return payload

    service.add("object", Handler())
    assert service.methods == ["bare", "get", "object"]


@pytest.mark.asyncio
async def test_servers_refuse_what_cannot_serve_at_once(lab: Lab) -> None:
    with pytest.raises(TypeError, match=r"service must be an rpc\.Service, not str"):
        await rpc.start_server("not a service", lab.addr, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="client_connected_cb must be callable"):
        await aiordma.start_server(None, lab.addr, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="host must be a str"):
        await aiordma.connect(None, 7472)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="host must be a str"):
        await aiordma.connect(b"192.0.2.1", 7472)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_reply_too_large_to_send_fails_the_call_promptly_and_is_logged(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    service = rpc.Service()

    @service.method()
    async def huge(payload: bytes) -> bytes:
        return bytes(2 << 20)

    @service.method()
    async def small(payload: bytes) -> bytes:
        return b"fine"

    caplog.set_level(logging.WARNING, logger="aiordma.rpc.server")
    async with await rpc.start_server(service, lab.addr, 0, max_message=1 << 20) as server:
        port = server.addresses[0][1]
        async with await rpc.connect(lab.addr, port) as client:
            with pytest.raises(rpc.RemoteError) as info:
                await asyncio.wait_for(client.call("huge"), TIMEOUT)
            assert info.value.remote_type == "MessageTooLargeError"
            assert "max_message" in info.value.remote_message
            assert await asyncio.wait_for(client.call("small"), TIMEOUT) == b"fine"
    assert any(r.levelno == logging.WARNING and "huge" in r.getMessage() for r in caplog.records), (
        caplog.records
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [100, 1 << 20], ids=["eager", "rendezvous"])
async def test_an_unusable_into_fails_that_call_alone_before_sending(
    lab: Lab, rpc_port: int, size: int
) -> None:
    async with await rpc.connect(lab.addr, rpc_port) as client:
        closed = client.conn.alloc(size)
        closed.close()
        for into, error in (
            (bytes(size), TypeError),
            ("text", TypeError),
            (closed, ValueError),
            (memoryview(bytes(size)), TypeError),
        ):
            with pytest.raises(error):
                await asyncio.wait_for(
                    client.call("blob", b"%d" % size, into=into),  # type: ignore[arg-type]
                    TIMEOUT,
                )
        assert not client._pending
        assert await asyncio.wait_for(client.call("blob", b"%d" % size), TIMEOUT) == blob(size)
        target = bytearray(size)
        assert await asyncio.wait_for(client.call("blob", b"%d" % size, into=target), TIMEOUT) == (
            size
        )
        assert target == blob(size)


@pytest.mark.asyncio
async def test_an_empty_method_name_is_refused_locally(lab: Lab, rpc_port: int) -> None:
    async with await rpc.connect(lab.addr, rpc_port) as client:
        with pytest.raises(ValueError, match="non-empty"):
            await client.call("")
        with pytest.raises(TypeError, match="method must be a str, not int"):
            await client.call(123)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="timeout must be a number of seconds"):
            await client.call("echo", b"x", timeout="5")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="255"):
            await client.call("x" * 256)
        assert await asyncio.wait_for(client.call("echo", b"alive"), TIMEOUT) == b"alive"


@pytest.mark.asyncio
async def test_a_timeout_names_the_method_and_the_seconds(lab: Lab, rpc_port: int) -> None:
    async with await rpc.connect(lab.addr, rpc_port) as client:
        with pytest.raises(TimeoutError, match=r"call 'wait' got no reply within 0.2 s"):
            await client.call("wait", timeout=0.2)
        # As asyncio.timeout(): a timeout of 0 or less has expired (it was a ValueError).
        for expired in (0, -1, -0.5):
            with pytest.raises(TimeoutError, match=r"call 'echo' was not sent: its timeout"):
                await client.call("echo", b"x", timeout=expired)
        assert await asyncio.wait_for(client.call("echo", b"alive"), TIMEOUT) == b"alive"


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_client_close_is_awaitable_like_a_connection(lab: Lab, rpc_port: int) -> None:
    client = await rpc.connect(lab.addr, rpc_port)
    await asyncio.wait_for(client.close(), TIMEOUT)
    assert client.conn.closed
    with pytest.raises(aiordma.ResourceClosedError):
        await client.call("echo", b"too late")
    await asyncio.wait_for(client.close(), TIMEOUT)  # idempotent


@pytest.mark.asyncio
async def test_private_data_reaches_accept_and_prepare_runs_on_both_sides(lab: Lab) -> None:
    service = rpc.Service()

    @service.method()
    async def echo(payload: bytes) -> bytes:
        return payload

    seen: list[bytes] = []
    prepared: list[str] = []

    def accept(request: aiordma.ConnectionRequest) -> bytes:
        seen.append(request.private_data.rstrip(b"\0"))
        return b""

    async def server_prepare(conn: aiordma.Connection) -> None:
        prepared.append(f"server {type(conn.prepared).__name__}")

    def client_prepare(conn: aiordma.Connection) -> None:
        prepared.append(f"client {type(conn.prepared).__name__}")

    async with await rpc.start_server(
        service, lab.addr, 0, accept=accept, prepare=server_prepare
    ) as server:
        port = server.addresses[0][1]
        async with await rpc.connect(
            lab.addr, port, private_data=b"tenant-7", prepare=client_prepare
        ) as client:
            assert await asyncio.wait_for(client.call("echo", b"x"), TIMEOUT) == b"x"
    assert seen == [b"tenant-7"]
    assert sorted(prepared) == ["client MessageChannel", "server MessageChannel"]


async def _server_keeping_channels(
    service: rpc.Service, lab: Lab, **options: Any
) -> tuple[aiordma.Server, list[aiordma.MessageChannel]]:
    """An RPC server on the lab device, and the list its connections'
    channels are put in as they are prepared (before they are accepted)."""
    channels: list[aiordma.MessageChannel] = []
    server = await rpc.start_server(
        service, lab.addr, 0, prepare=lambda conn: channels.append(conn.prepared), **options
    )
    return server, channels


async def _replies_revoked(channel: aiordma.MessageChannel, count: int, seconds: float) -> None:
    """Wait until ``count`` replies have arrived on a raw client ``channel``
    and every one was revoked (its sender's exposure_timeout passed)."""
    async with asyncio.timeout(seconds):
        inbox = channel._inbox
        while inbox.queued() < count or not all(map(inbox.withdrawn, inbox.ready)):
            await channel._changed()


@pytest.mark.asyncio
async def test_a_client_that_never_reads_large_replies_cannot_pin_server_memory(
    lab: Lab,
) -> None:
    size, bound = 64 << 10, 2 * (64 << 10)
    service = rpc.Service()

    @service.method()
    async def big(payload: bytes) -> bytes:
        return bytes(size)

    server, channels = await _server_keeping_channels(
        service,
        lab,
        max_exposed=bound,
        max_message=bound,
        exposure_timeout=1.0,
        medium_limit=0,  # replies by rendezvous, not copied in pieces
    )
    async with server:
        port = server.addresses[0][1]
        # A hostile client: raw channel, requests five large replies, reads none of them.
        async with await aiordma.open_channel(lab.addr, port, protocol=PROTOCOL) as channel:
            (server_channel,) = channels  # prepared before the connection was accepted
            peaks: list[int] = []
            server_channel.watch_exposures(lambda _: peaks.append(server_channel.exposed_bytes))
            for call_id in range(1, 6):
                await channel.send_message(
                    b"", head=Frame(FrameKind.REQUEST, call_id, "big").pack()
                )
            # Every reply is announced, then revoked once its deadline passed.
            await _replies_revoked(channel, 5, TIMEOUT)
            revoked: list[int] = []
            for _ in range(5):
                with pytest.raises(aiordma.MessageRevokedError) as info:
                    await channel.recv_message_with_head()
                revoked.append(Frame.unpack(info.value.head).call_id)
            assert sorted(revoked) == [1, 2, 3, 4, 5]
            assert len(peaks) == 5
            assert max(peaks) <= bound
            await exposures_ended(server_channel)  # each REVOKE answered


@pytest.mark.asyncio
async def test_a_client_that_floods_large_requests_makes_the_server_hold_at_most_max_held(
    lab: Lab,
) -> None:
    # Issue 41: a client sent 24 large requests and read no reply; the server
    # read them all (its concurrency allowed 256 calls) and held 24x what the
    # client had committed. Here: 12 requests of 1 MiB, each answered with a
    # copy (2 MiB held per call), against max_held = 4 MiB.
    size, max_held, count = 1 << 20, 4 << 20, 12
    service = rpc.Service(max_held=max_held)
    started: list[int] = []

    @service.method()
    async def copy(payload: bytes) -> bytes:
        started.append(len(payload))
        return bytes(payload)

    server, channels = await _server_keeping_channels(
        service,
        lab,
        exposure_timeout=1.0,  # unread replies are revoked, and their calls end
        medium_limit=0,
    )
    async with server:
        port = server.addresses[0][1]
        async with await aiordma.open_channel(
            lab.addr,
            port,
            medium_limit=0,
            max_exposed=4 << 20,
            max_message=4 << 20,
            protocol=PROTOCOL,  # a raw client that speaks RPC frames says so
        ) as channel:
            (server_channel,) = channels

            def held() -> tuple[int, int]:
                gauges = server_channel.conn.stats()["gauges"]
                return gauges["requests_held_bytes"], gauges["results_held_bytes"]

            peaks: list[tuple[int, int, int]] = []  # (requests, results, calls started)
            server_channel.watch_exposures(lambda _: peaks.append((*held(), len(started))))
            body = bytes(size)

            async def post_all() -> None:  # posting waits for the client's exposure room
                for call_id in range(1, count + 1):
                    head = Frame(FrameKind.REQUEST, call_id, "copy").pack()
                    await channel.post_message(body, head=head)

            poster = asyncio.create_task(post_all())
            # Every request is served in the end: its reply announced, then revoked.
            await _replies_revoked(channel, count, TIMEOUT * 2)
            await poster
            assert started == [size] * count
            # Requests were read only while the calls held less than max_held:
            # four at most (before fix: all twelve, as soon as they came).
            assert peaks[0][2] <= max_held // size, peaks
            assert max(requests for requests, _, _ in peaks) <= max_held, peaks
            assert max(results for _, results, _ in peaks) <= max_held, peaks


@pytest.mark.asyncio
async def test_replies_a_frozen_client_never_took_count_against_max_held(lab: Lab) -> None:
    # Issue 50: a reply revoked for its exposure_timeout stays readable until
    # the client answers, and a frozen client never does. Its call used to end
    # at the revocation, so the server read further requests while revoked
    # replies still held their memory (12x what the client committed).
    size, max_held, count = 256 << 10, 1 << 20, 6
    service = rpc.Service(max_held=max_held)
    started: list[int] = []
    all_started = asyncio.Event()

    @service.method()
    async def copy(payload: bytes) -> bytes:
        started.append(len(payload))
        if len(started) == count:
            all_started.set()
        return bytes(payload)  # a request and a result held per call

    server, channels = await _server_keeping_channels(
        service, lab, exposure_timeout=1.0, medium_limit=0
    )
    async with server:
        port = server.addresses[0][1]
        client = await spawn_peer("requests", lab.addr, str(port), "copy", str(count), str(size))
        try:
            assert client.stdout is not None
            line = await asyncio.wait_for(client.stdout.readline(), TIMEOUT)
            assert line == b"posted\n"
            client.send_signal(signal.SIGSTOP)  # frozen: it answers no revocation
            (server_channel,) = channels

            def held() -> tuple[int, int, int]:
                gauges = server_channel.conn.stats()["gauges"]
                exposed = server_channel.exposed_bytes
                return exposed, gauges["requests_held_bytes"], gauges["results_held_bytes"]

            seen: list[tuple[int, int, int]] = [held()]
            server_channel.watch_exposures(lambda _: seen.append(held()))
            await asyncio.wait_for(all_started.wait(), TIMEOUT * 2)
        finally:
            client.kill()
            await client.wait()
        assert started == [size] * count
        for exposed, requests, results in seen:
            assert requests <= max_held, seen  # results come on top (Service.max_held)
            assert results <= max_held, seen
            # every exposed byte is a running call's result, counted above
            # (before: 1.25 MiB exposed, 0.5 MiB of it by calls still running)
            assert exposed <= results, seen


@pytest.mark.asyncio
async def test_a_reply_its_client_left_unread_is_freed_when_the_client_goes(lab: Lab) -> None:
    # Issue 50: the reply's exposure failed with the channel, and the error,
    # raised from the future that kept it, held the sender's frame (and the
    # reply's bytes) in a cycle: the server's memory stayed up after its
    # clients left, until a full collection.
    service = rpc.Service()
    replies: list[weakref.ref[object]] = []
    returned = asyncio.Event()

    @service.method()
    async def big(payload: bytes) -> Any:
        array = numpy.ones(2 << 20, dtype=numpy.uint8)
        replies.append(weakref.ref(array))
        returned.set()
        return array

    server, channels = await _server_keeping_channels(service, lab, medium_limit=0)
    gc.collect()
    gc.disable()
    try:
        async with server:
            port = server.addresses[0][1]
            async with await aiordma.open_channel(lab.addr, port, protocol=PROTOCOL) as channel:
                await channel.send_message(b"", head=Frame(FrameKind.REQUEST, 1, "big").pack())
                await asyncio.wait_for(returned.wait(), TIMEOUT)
                (server_channel,) = channels
                async with asyncio.timeout(TIMEOUT):
                    while not server_channel.exposed_bytes:  # the reply is exposed, unread
                        await server_channel._changed()
            await asyncio.wait_for(server_channel.wait_closed(), TIMEOUT)
            del server_channel
            channels.clear()
            server.close_clients()
            server.close()
            await server.wait_closed()
        assert replies
        assert replies[0]() is None, "the unread reply outlived its connection"
    finally:
        gc.enable()


BIG = 8 << 20


@pytest.mark.asyncio
@pytest.mark.parametrize("seconds", [0.05, 0.3, 1.0])
@pytest.mark.both_loops("cancellation")
async def test_large_calls_that_time_out_leave_the_connection_usable(
    lab: Lab, rpc_port: int, seconds: float
) -> None:
    """The peer may be reading a large request or result when its call times
    out: the exposure is withdrawn once the peer answers, never under its read."""
    payload = blob(BIG)
    async with await rpc.connect(lab.addr, rpc_port) as client:
        for method, argument in (("digest", payload), ("blob", b"%d" % BIG)):
            # The read may also finish in time: either way the connection must live.
            with contextlib.suppress(TimeoutError):
                await client.call(method, argument, timeout=seconds)
            assert await asyncio.wait_for(client.call("echo", b"alive"), TIMEOUT) == b"alive"
        digest = await asyncio.wait_for(client.call("digest", payload), TIMEOUT)
        assert digest == hashlib.sha256(payload).digest()
        assert not client.conn.is_closing()
        errors = {k for k in client.conn.stats()["counters"] if k.startswith("errors:")}
        assert not errors


_SECOND_RUN = """
import asyncio, gc, sys, warnings
import aiordma
from aiordma import rpc
warnings.simplefilter("always")
caught = []
warnings.showwarning = lambda message, category, *rest, **kw: caught.append(
    category.__name__ + " " + str(message))
made = {}

async def first():
    server = await rpc.start_server(rpc.Service(), sys.argv[1], 0)
    made["server"] = server
    made["client"] = await rpc.connect(sys.argv[1], server.addresses[0][1])

async def second():
    for name, use in (("call", lambda: made["client"].call("echo", b"x")),
                      ("close", lambda: made["server"].close()),
                      ("close_clients", lambda: made["server"].close_clients()),
                      ("wait_closed", lambda: made["server"].wait_closed())):
        try:
            result = use()
            if asyncio.iscoroutine(result):
                await result
            print(name, "no error")
        except Exception as exc:
            print(name, type(exc).__name__)

asyncio.run(first())
asyncio.run(second())
try:  # closing once its loop has closed releases it (issue 41: RuntimeError)
    made["client"].close()
    print("client.close() after its loop closed: no error")
except Exception as exc:
    print("client.close() after its loop closed:", repr(exc))
gc.collect()
print("\\n".join(w for w in caught if "_reap_handlers" in w or "never awaited" in w))
"""


def test_objects_used_from_a_second_asyncio_run_raise_wrong_loop_error(lab: Lab) -> None:
    proc = run_python(["-c", _SECOND_RUN, lab.addr], timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines == [
        "call WrongLoopError",
        "close WrongLoopError",
        "close_clients WrongLoopError",
        "wait_closed WrongLoopError",
        "client.close() after its loop closed: no error",
    ], proc.stdout + proc.stderr  # and no warning of a coroutine never awaited
    assert "_reap_handlers" not in proc.stderr


_DIES_ON_A_REMOTE_ERROR = """
import asyncio, sys
from aiordma import rpc

async def main():
    client = await rpc.connect(sys.argv[1], int(sys.argv[2]))
    await client.call("fail", b"42")  # uncaught: the program dies, leaving all open

asyncio.run(main())
"""


@pytest.mark.parametrize("flags", [[], ["-X", "dev"]], ids=["plain", "dev-mode"])
def test_a_program_that_dies_on_a_remote_error_exits_cleanly(
    lab: Lab, rpc_port: int, flags: list[str]
) -> None:
    """Issue 50: the device's memory, PD and CQ were left to interpreter
    teardown (closing them at exit stopped at a queue pair whose loop had
    closed), which printed "Error in sys.excepthook:" five times."""
    # -X dev needs an interpreter started with it: run_python starts one afresh
    proc = run_python([*flags, "-c", _DIES_ON_A_REMOTE_ERROR, lab.addr, str(rpc_port)], timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line and not line.startswith(" ")]
    lines = [line for line in lines if not line.startswith("Executing <")]  # dev mode: slow steps
    assert lines == [
        "Traceback (most recent call last):",
        "aiordma.rpc.errors.RemoteError: fail: ValueError: bad input: 42",
    ], proc.stderr


def test_current_connection_outside_a_handler_says_so() -> None:
    with pytest.raises(LookupError, match="outside a handler"):
        rpc.current_connection()


@pytest.mark.asyncio
async def test_a_handler_knows_the_connection_it_serves(lab: Lab) -> None:
    service = rpc.Service()

    @service.method
    async def whoami(payload: bytes) -> bytes:
        conn = rpc.current_connection()
        await asyncio.sleep(0)  # still known after suspending (the call's own task)
        assert rpc.current_connection() is conn
        return "{}:{}".format(*conn.peer_address).encode()

    async with await rpc.start_server(service, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with (
            await rpc.connect(lab.addr, port) as first,
            await rpc.connect(lab.addr, port) as second,
        ):
            for client in (first, second):
                mine = "{}:{}".format(*client.conn.local_address).encode()
                assert await asyncio.wait_for(client.call("whoami"), TIMEOUT) == mine
