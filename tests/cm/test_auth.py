"""Peer authentication: the handshake's logic on the host, the handshake on rxe.

The lab tests play the attacker with the library's own pieces: a client
without ``auth`` sends chosen private data and a chosen first message,
and records what reached it (its receives are posted before the server
could send anything).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio

import aiordma
from aiordma import rpc
from aiordma.cm import auth
from aiordma.cm.auth import (
    Binding,
    ClientHandshake,
    PresharedKey,
    Refusal,
    Refused,
    ServerHandshake,
)
from tests.conftest import Lab

KEY = PresharedKey(b"k" * 32)
OTHER = PresharedKey(b"o" * 32)
CLIENT = ("192.0.2.2", 40001)
SERVER = ("192.0.2.1", 7471)


def _binding(client_qp: int = 17, server_qp: int = 18) -> Binding:
    return Binding(client_qp, server_qp, CLIENT, SERVER)


def _pad(data: bytes, size: int) -> bytes:
    """What rdma_cm delivers: private data zero-padded to the CM message's size."""
    return data.ljust(size, b"\0")


# -- the handshake's logic (host) ---------------------------------------------


def test_key_checks_and_hides_itself() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        PresharedKey(b"short")
    with pytest.raises(TypeError, match="bytes"):
        PresharedKey("text")  # type: ignore[arg-type]
    key = PresharedKey.generate()
    assert PresharedKey.fromhex(key.hex() + "\n") == key
    assert key != PresharedKey.generate()
    assert key.hex() not in repr(key)
    assert "32 bytes" in repr(key)
    with pytest.raises(ValueError, match="hex"):
        PresharedKey.fromhex("not hex")
    assert auth.as_key(b"x" * 16) == PresharedKey(b"x" * 16)
    assert auth.as_key(None) is None
    with pytest.raises(TypeError, match="PresharedKey or bytes"):
        auth.as_key("secret")  # type: ignore[arg-type]


def _run(
    client_key: PresharedKey = KEY,
    server_key: PresharedKey = KEY,
    client_side: Binding | None = None,
) -> tuple[ClientHandshake, ServerHandshake, bytes]:
    """A handshake up to the client's check of the server's accept."""
    client = ClientHandshake(client_key, b"hello")
    server = ServerHandshake(server_key, _pad(client.request(), 56))
    assert server.private_data == b"hello"
    accept = _pad(server.accept(b"welcome", _binding()), 196)
    assert client.check_accept(accept, client_side or _binding()) == b"welcome"
    return client, server, accept


def test_matching_keys_prove_both_ways() -> None:
    client, server, _ = _run()
    server.check_proof(client.proof())


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"server_key": OTHER}, id="other-key"),
        pytest.param({"client_side": _binding(client_qp=99)}, id="other-qp"),
        pytest.param(
            {"client_side": Binding(17, 18, ("192.0.2.3", 40001), SERVER)}, id="other-address"
        ),
    ],
)
def test_server_proof_fails_for_another_key_or_connection(change: dict[str, object]) -> None:
    with pytest.raises(Refused) as refused:
        _run(**change)  # type: ignore[arg-type]
    assert refused.value.reason == Refusal.BAD_PROOF


def test_addresses_compare_across_families() -> None:
    mapped = Binding(17, 18, ("::ffff:192.0.2.2", 40001), ("::ffff:192.0.2.1%2", 7471))
    _run(client_side=mapped)


def test_recorded_answers_are_refused_on_a_new_handshake() -> None:
    client, _, accept = _run()
    proof = client.proof()
    # The server's recorded accept, replayed to a new client (fresh nonce).
    fresh = ClientHandshake(KEY, b"hello")
    with pytest.raises(Refused) as refused:
        fresh.check_accept(accept, _binding())
    assert refused.value.reason == Refusal.BAD_PROOF
    # The client's recorded request and proof, replayed to the server.
    again = ServerHandshake(KEY, _pad(client.request(), 56))
    again.accept(b"welcome", _binding())
    with pytest.raises(Refused) as refused:
        again.check_proof(proof)
    assert refused.value.reason == Refusal.BAD_PROOF


def test_tampered_private_data_is_detected() -> None:
    client = ClientHandshake(KEY, b"hello")
    request = bytearray(_pad(client.request(), 56))
    request[-36 + 1] ^= 1  # the first byte of the client's own data
    server = ServerHandshake(KEY, bytes(request))
    with pytest.raises(Refused):
        client.check_accept(server.accept(b"", _binding()), _binding())


@pytest.mark.parametrize(
    ("request_data", "reason"),
    [
        (b"", Refusal.REQUIRED),
        (os.urandom(56).replace(b"aRA", b"xxx"), Refusal.REQUIRED),
        (b"aRA\x01" + b"n" * 8, Refusal.MALFORMED),
        (b"aRA\x02" + b"n" * 52, Refusal.VERSION),
        (_pad(b"aRA\x01" + b"n" * 16 + b"\xff", 56), Refusal.MALFORMED),
    ],
    ids=["empty", "garbage", "truncated", "version", "length"],
)
def test_malformed_requests_are_refused(request_data: bytes, reason: Refusal) -> None:
    with pytest.raises(Refused) as refused:
        ServerHandshake(KEY, request_data)
    assert refused.value.reason == reason


def test_malformed_proofs_are_refused() -> None:
    client, server, _ = _run()
    proof = client.proof()
    for bad in (proof[:20], proof + b"x", b"\0" * len(proof), proof[:-1] + bytes([proof[-1] ^ 1])):
        with pytest.raises(Refused):
            server.check_proof(bad)
    server.check_proof(proof)


def test_accept_without_handshake_means_none_offered() -> None:
    client = ClientHandshake(KEY, b"")
    with pytest.raises(Refused) as refused:
        client.check_accept(_pad(b"welcome", 196), _binding())
    assert refused.value.reason == Refusal.NONE_OFFERED


def test_refusals_round_trip_through_reject_data() -> None:
    for reason in Refusal:
        assert auth.refused(_pad(auth.refusal(reason), 148)) == reason
    assert auth.refused(_pad(b"not today", 148)) is None
    error = auth.failure("192.0.2.1:7471", Refusal.BAD_PROOF)
    assert isinstance(error, aiordma.AuthenticationError)
    assert isinstance(error, aiordma.ConnectionRejectedError)
    assert isinstance(error, ConnectionRefusedError)
    assert "192.0.2.1:7471" in str(error)


# -- on rxe -------------------------------------------------------------------


@dataclass
class Guarded:
    """A server with ``auth``: what ran for which client."""

    server: aiordma.Server
    port: int
    prepared: list[tuple[str, int]] = field(default_factory=list)
    served: list[bytes] = field(default_factory=list)


@pytest_asyncio.fixture
async def guarded(lab: Lab) -> AsyncIterator[Guarded]:
    """An echo server that requires KEY; records every prepare and handler run."""
    state: Guarded

    async def prepare(conn: aiordma.Connection) -> tuple[aiordma.MemoryRegion, object]:
        state.prepared.append(conn.peer_address)
        inbox = conn.alloc(256)
        (first,) = await conn.post_recv_batch([inbox])
        return inbox, first

    async def handle(conn: aiordma.Connection) -> None:
        state.served.append(conn.peer_private_data)
        inbox, pending = conn.prepared
        wc = await pending
        await conn.post_send(inbox[: wc.byte_len])
        await conn.wait_closed()

    def accept(request: aiordma.ConnectionRequest) -> bytes:
        return b"welcome " + request.private_data

    server = await aiordma.start_server(
        handle, lab.addr, 0, auth=KEY, accept=accept, prepare=prepare, handshake_timeout=3
    )
    async with server:
        state = Guarded(server, server.addresses[0][1])
        yield state


async def _echo_once(conn: aiordma.Connection, data: bytes) -> bytes:
    inbox, outbox = conn.alloc(256), conn.register(bytearray(data))
    (reply,) = await conn.post_recv_batch([inbox])
    await conn.post_send(outbox)
    wc = await asyncio.wait_for(reply, 10)
    return bytes(inbox.view()[: wc.byte_len])


@pytest.mark.asyncio
async def test_authenticated_echo(lab: Lab, guarded: Guarded) -> None:
    async with await aiordma.connect(lab.addr, guarded.port, auth=KEY, private_data=b"me") as conn:
        assert conn.peer_private_data == b"welcome me"  # the server's own data, exactly
        assert await _echo_once(conn, b"ping") == b"ping"
    assert guarded.served == [b"me"]
    assert guarded.prepared == [conn.local_address]


async def _refused(lab: Lab, port: int, **kwargs: object) -> aiordma.AuthenticationError:
    """The handshake's verdict: an AuthenticationError, never the 10 s
    ``timeout`` (a TimeoutError) of a handshake left hanging."""
    with pytest.raises(aiordma.AuthenticationError) as caught:
        await aiordma.connect(lab.addr, port, timeout=10, **kwargs)  # type: ignore[arg-type]
    return caught.value


async def _still_serving(lab: Lab, guarded: Guarded) -> None:
    before = len(guarded.served)
    async with await aiordma.connect(lab.addr, guarded.port, auth=KEY) as conn:
        assert await _echo_once(conn, b"still here") == b"still here"
    assert len(guarded.served) == before + 1


@pytest.mark.asyncio
async def test_wrong_key_and_no_key_are_refused(
    lab: Lab, guarded: Guarded, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "aiordma")
    wrong = await _refused(lab, guarded.port, auth=OTHER)
    assert "did not check" in str(wrong)
    missing = await _refused(lab, guarded.port)
    assert "requires authentication" in str(missing)
    assert missing.reason == 28  # consumer-defined rejection
    assert guarded.prepared == []
    assert guarded.served == []
    await _still_serving(lab, guarded)
    # Both refusals are logged, and the key appears nowhere.
    assert "requires authentication" in caplog.text
    assert "did not check" in caplog.text
    for secret in (KEY, OTHER):
        assert secret.hex() not in caplog.text
        assert secret._key.decode() not in caplog.text


@pytest.mark.asyncio
async def test_client_refuses_a_server_without_auth(lab: Lab) -> None:
    served: list[aiordma.Connection] = []
    async with await aiordma.start_server(served.append, lab.addr, 0) as plain:
        error = await _refused(lab, plain.addresses[0][1], auth=KEY)
        assert "offered none" in str(error)
    assert served == []


class Intruder:
    """A client without ``auth`` that sends chosen handshake bytes and records
    what the server sent it: receives are posted before it connects."""

    def __init__(self) -> None:
        self.arrived: list[bytes] = []
        self.receives: list[asyncio.Future[aiordma.WorkCompletion]] = []
        self.inbox: aiordma.MemoryRegion | None = None

    async def prepare(self, conn: aiordma.Connection) -> None:
        self.inbox = conn.alloc(8 * 256)
        self.receives = await conn.post_recv_batch([self.inbox[i * 256 : (i + 1) * 256]
                                                    for i in range(8)])  # fmt: skip

    async def attempt(self, lab: Lab, port: int, request: bytes, first: bytes | None) -> None:
        """Connect with ``request`` as private data, send ``first``, and wait for the end."""
        conn = await aiordma.connect(lab.addr, port, private_data=request, prepare=self.prepare)
        async with conn:
            if first is not None:
                with contextlib.suppress(aiordma.RdmaError):  # the server may be gone already
                    await conn.post_send(conn.register(bytearray(first)))
            await asyncio.wait_for(conn.wait_closed(), 10)  # the server drops us
        for i, receive in enumerate(self.receives):
            if receive.done() and not receive.exception():
                assert self.inbox is not None
                self.arrived.append(bytes(self.inbox.view()[i * 256 : i * 256 + 64]))


class Recording(ClientHandshake):
    """The genuine client's handshake, keeping a copy of what it sent and received."""

    log: dict[str, bytes] = {}  # noqa: RUF012  (one test's scratch)

    def request(self) -> bytes:
        data = super().request()
        Recording.log["request"] = data
        return data

    def check_accept(self, data: bytes, binding: Binding) -> bytes:
        Recording.log["accept"] = data
        return super().check_accept(data, binding)

    def proof(self) -> bytes:
        data = super().proof()
        Recording.log["proof"] = data
        return data


@pytest.mark.asyncio
async def test_replayed_handshake_is_refused_both_ways(
    lab: Lab, guarded: Guarded, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("aiordma.cm.connect.ClientHandshake", Recording)
    async with await aiordma.connect(lab.addr, guarded.port, auth=KEY) as conn:
        assert await _echo_once(conn, b"genuine") == b"genuine"
    record = dict(Recording.log)
    monkeypatch.undo()

    # To the server: the recorded request and proof on a new connection.
    intruder = Intruder()
    await intruder.attempt(lab, guarded.port, record["request"], record["proof"])
    assert intruder.arrived == []  # no message, no verdict, no rkey
    assert len(guarded.served) == 1
    assert len(guarded.prepared) == 1

    # To a client: a fake server answering with the recorded accept.
    async with await aiordma.start_server(
        lambda conn: None, lab.addr, 0, accept=lambda request: record["accept"]
    ) as fake:
        error = await _refused(lab, fake.addresses[0][1], auth=KEY)
        assert "did not check" in str(error)
    await _still_serving(lab, guarded)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "first",
    [None, b"aRA\x01" + b"short", os.urandom(36)],
    ids=["silent", "truncated", "garbage"],
)
async def test_unproven_clients_get_nothing(
    lab: Lab, guarded: Guarded, first: bytes | None
) -> None:
    """A well-formed request, then no proof, a truncated one or garbage."""
    request = b"aRA\x01" + os.urandom(16) + b"\0"
    intruder = Intruder()
    await intruder.attempt(lab, guarded.port, request, first)  # the server drops it
    # By its verdict, or (silent) by its handshake_timeout of 3 s: a failed set-up.
    counters = guarded.server.stats()["counters"]
    assert counters.get("auth_failed", 0) + counters.get("setup_failed", 0) == 1, counters
    assert intruder.arrived == []
    assert guarded.prepared == []
    assert guarded.served == []
    await _still_serving(lab, guarded)


@pytest.mark.asyncio
async def test_garbage_private_data_is_refused(lab: Lab, guarded: Guarded) -> None:
    for garbage in (os.urandom(56), b"aRA\x07" + os.urandom(52), b"aRA\x01" + b"\xff" * 52):
        error = await _refused(lab, guarded.port, private_data=garbage)
        assert error.reason == 28
    assert guarded.prepared == []
    assert guarded.served == []
    await _still_serving(lab, guarded)


@pytest.mark.asyncio
async def test_rpc_and_channels_with_auth(lab: Lab) -> None:
    service = rpc.Service()

    @service.method()
    async def double(data: bytes) -> bytes:
        return data * 2

    async with await rpc.start_server(service, lab.addr, 0, auth=KEY) as server:
        port = server.addresses[0][1]
        async with await rpc.connect(lab.addr, port, auth=KEY) as client:
            assert await client.call("double", b"ab") == b"abab"
        with pytest.raises(aiordma.AuthenticationError):
            await rpc.connect(lab.addr, port, auth=OTHER)
        with pytest.raises(aiordma.AuthenticationError):
            await rpc.connect(lab.addr, port)

    async def echo(channel: aiordma.MessageChannel) -> None:
        await channel.send_message(await channel.recv_message())

    async with await aiordma.start_channel_server(echo, lab.addr, 0, auth=KEY) as server:
        port = server.addresses[0][1]
        async with await aiordma.open_channel(lab.addr, port, auth=KEY) as channel:
            await channel.send_message(b"over a channel")
            assert await asyncio.wait_for(channel.recv_message(), 10) == b"over a channel"
        with pytest.raises(aiordma.AuthenticationError):
            await aiordma.open_channel(lab.addr, port)

    async def line(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        writer.close()

    async with await aiordma.start_stream_server(line, lab.addr, 0, auth=KEY) as server:
        port = server.addresses[0][1]
        reader, writer = await aiordma.open_connection(lab.addr, port, auth=KEY)
        writer.write(b"over a stream\n")
        assert await asyncio.wait_for(reader.read(), 10) == b"over a stream\n"
        writer.close()
        await writer.wait_closed()


def test_private_data_limits_shrink_with_auth() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="at most 35"):
            await aiordma.connect("192.0.2.1", 1, auth=KEY, private_data=b"x" * 36)

    asyncio.run(main())


@pytest.mark.asyncio
async def test_both_families_on_a_wildcard_server(lab: Lab) -> None:
    """The proofs bind addresses: a server on every address sees IPv4 clients
    as IPv4-mapped IPv6, and the client must still agree with it."""

    async def handle(conn: aiordma.Connection) -> None:
        await conn.wait_closed()

    async with await aiordma.start_server(handle, None, 0, auth=KEY) as server:
        port = server.addresses[0][1]
        for host in (lab.addr, lab.addr6 or lab.addr):
            async with await aiordma.connect(host, port, auth=KEY) as conn:
                assert conn.peer_address[1] == port
