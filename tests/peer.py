"""The other process of the connection tests: ``python -m tests.peer MODE ADDR PORT``.

``serve``: an echo server that rejects requests whose private data starts
with ``b"reject"`` (reject data ``b"not today"``) and accepts the others with
a RemoteBuffer of 4 KiB of its memory (readable and writable, starting with
``b"server memory"``) as its private data. It prints ``listening PORT`` and
runs until SIGTERM.

``stream``: connects and RDMA-writes into the server's buffer without end,
printing ``streaming`` once the first write completed; for killing mid-transfer.

``clients N M``: N clients connect at once, each echoes M messages through the
server and checks them; prints ``ok N``.

``try DATA``: one connect with DATA as private data; prints ``accepted REPLY``
or ``rejected DATA`` (trailing zero padding stripped).

``checksums``: a message-channel server answering every message with its
SHA-256 digest; prints ``listening PORT`` and runs until SIGTERM.

``rpc``: the RPC service of :func:`rpc_service`; prints ``listening PORT``
and runs until SIGTERM.

``region SIZE``: a server exposing SIZE bytes of its memory (:func:`blob`
of SIZE at first, readable and writable) to every client as its accept
private data, and answering every message with the SHA-256 of that memory
as it is now; prints ``listening PORT`` and runs until SIGTERM.

``digests SIZE...``: a client sending one message of each SIZE (:func:`blob`
bytes) to a ``checksums`` server and checking each digest; prints ``ok``.

``hold KEEPALIVE``: a client (keepalive KEEPALIVE seconds) that waits for a
first message (printing ``holding`` once it came), then echoes every
further message until a receive fails, and prints ``failed NAME SECONDS``:
the exception that ended it and how long after the last message it came.

``calls METHOD COUNT``: an RPC client making COUNT calls to METHOD one
after another, each with a 64-byte payload it checks comes back; prints ``ok``.

``requests METHOD COUNT SIZE``: a raw RPC client posting COUNT requests of
SIZE bytes (its own memory, read by the server) to METHOD without reading a
reply; prints ``posted`` once all are announced, then waits to be stopped
(a frozen client: stopped with SIGSTOP, it answers nothing).
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import sys
import time
from collections.abc import Callable, Coroutine

import aiordma
from aiordma import Access, rpc
from aiordma.channel.channel import MessageChannel
from aiordma.channel.open import prepare_channel

SIZE = 4096


async def prepare_inbox(conn: aiordma.Connection) -> tuple[aiordma.MemoryRegion, object]:
    """A ``prepare`` hook: one receive posted before the client can send."""
    inbox = conn.alloc(SIZE)
    (first,) = await conn.post_recv_batch([inbox])
    return inbox, first


async def echo(conn: aiordma.Connection) -> aiordma.ConnectionLostError:
    """Echo every message (after :func:`prepare_inbox`) until the connection is lost."""
    inbox, pending = conn.prepared
    outbox = conn.alloc(SIZE)
    try:
        while True:
            wc = await pending
            outbox.view()[: wc.byte_len] = inbox.view()[: wc.byte_len]
            (pending,) = await conn.post_recv_batch([inbox])
            await conn.post_send(outbox[: wc.byte_len])
    except aiordma.ConnectionLostError as exc:
        return exc


async def serve(addr: str, port: int) -> None:
    dev = aiordma.Device.shared()
    exposed = dev.alloc(SIZE, Access.REMOTE_READ | Access.REMOTE_WRITE)
    exposed.view()[:13] = b"server memory"

    def accept(request: aiordma.ConnectionRequest) -> bytes:
        if request.private_data.startswith(b"reject"):
            raise aiordma.RejectConnection(b"not today")
        return exposed.remote().to_bytes()

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    server = await aiordma.start_server(
        echo, addr, port, accept=accept, prepare=prepare_inbox, device=dev
    )
    async with server:
        print(f"listening {server.addresses[0][1]}", flush=True)
        await stop.wait()


async def stream(addr: str, port: int) -> None:
    conn = await aiordma.connect(addr, port)
    remote = aiordma.RemoteBuffer.from_bytes(conn.peer_private_data[: aiordma.RemoteBuffer.SIZE])
    data = conn.alloc(SIZE)
    await conn.rdma_write(data, remote)
    print("streaming", flush=True)
    while True:
        await conn.rdma_write(data, remote)


async def echo_client(addr: str, port: int, messages: int, tag: int) -> None:
    async with await aiordma.connect(addr, port) as conn:
        inbox, outbox = conn.alloc(SIZE), conn.alloc(SIZE)
        for i in range(messages):
            data = f"client {tag} message {i}".encode() * (i + 1)
            (reply,) = await conn.post_recv_batch([inbox])
            outbox.view()[: len(data)] = data
            await conn.post_send(outbox[: len(data)])
            wc = await reply
            assert bytes(inbox.view()[: wc.byte_len]) == data, (tag, i)


async def clients(addr: str, port: int, count: str, messages: str) -> None:
    n = int(count)
    await asyncio.gather(*(echo_client(addr, port, int(messages), tag) for tag in range(n)))
    print(f"ok {n}", flush=True)


async def attempt(addr: str, port: int, data: str) -> None:
    try:
        conn = await aiordma.connect(addr, port, private_data=data.encode())
    except aiordma.ConnectionRejectedError as exc:
        print("rejected", exc.private_data.rstrip(b"\0").decode(), flush=True)
        return
    async with conn:
        print("accepted", conn.peer_private_data.rstrip(b"\0").decode(), flush=True)


async def _serve_until_sigterm(server: aiordma.Server) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        print(f"listening {server.addresses[0][1]}", flush=True)
        await stop.wait()
        server.close_clients()


async def digest_each(conn: aiordma.Connection) -> None:
    channel: MessageChannel = conn.prepared
    async for message in channel:
        await channel.send_message(hashlib.sha256(message).digest())


async def checksums(addr: str, port: int) -> None:
    await _serve_until_sigterm(
        await aiordma.start_server(digest_each, addr, port, prepare=prepare_channel)
    )


def blob(size: int) -> bytes:
    """``size`` deterministic bytes (the ``blob`` method's result)."""
    block = hashlib.sha256(str(size).encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def rpc_service() -> rpc.Service:
    """``echo``, ``fail`` (raises ValueError), ``wait`` (until cancelled),
    ``cancelled`` (how many ``wait`` calls were cancelled), ``blob`` (payload:
    a size in ASCII; returns :func:`blob` of it from a region registered once
    for remote reading, as a server's buffer pool would be) and
    ``digest`` (SHA-256 of the payload)."""
    service = rpc.Service()
    cancelled = 0

    @service.method()
    async def echo(payload: bytes) -> bytes:
        return payload

    @service.method()
    async def fail(payload: bytes) -> bytes:
        raise ValueError(f"bad input: {bytes(payload).decode()}")

    @service.method()
    async def wait(payload: bytes) -> bytes:
        nonlocal cancelled
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled += 1
            raise
        return b""

    @service.method("cancelled")
    async def cancelled_count(payload: bytes) -> bytes:
        return str(cancelled).encode()

    regions: dict[int, aiordma.MemoryRegion] = {}

    @service.method("blob")
    async def blob_method(payload: bytes) -> aiordma.MemoryRegion:
        size = int(payload)
        if size not in regions:
            regions[size] = aiordma.Device.shared().register(
                bytearray(blob(size)), Access.REMOTE_READ
            )
        return regions[size]

    @service.method()
    async def digest(payload: bytes) -> bytes:
        return hashlib.sha256(payload).digest()

    return service


async def rpc_server(addr: str, port: int) -> None:
    await _serve_until_sigterm(await rpc.start_server(rpc_service(), addr, port))


async def region(addr: str, port: int, size: str) -> None:
    dev = aiordma.Device.shared()
    exposed = dev.register(bytearray(blob(int(size))), Access.REMOTE_READ | Access.REMOTE_WRITE)

    async def digest_region(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        async for _ in channel:
            await channel.send_message(hashlib.sha256(exposed.view()).digest())

    server = await aiordma.start_server(
        digest_region, addr, port, device=dev, prepare=prepare_channel,
        accept=lambda request: exposed.remote().to_bytes(),
    )  # fmt: skip
    await _serve_until_sigterm(server)


async def digests(addr: str, port: int, *sizes: str) -> None:
    channel = await aiordma.open_channel(addr, port, max_message=max(map(int, sizes)))
    async with channel:
        for size in map(int, sizes):
            data = blob(size)
            await channel.send_message(data)
            assert await channel.recv_message() == hashlib.sha256(data).digest(), size
    print("ok", flush=True)


async def calls(addr: str, port: int, method: str, count: str) -> None:
    payload = bytes(range(64))
    async with await rpc.connect(addr, port) as client:
        for _ in range(int(count)):
            assert await client.call(method, payload) == payload
    print("ok", flush=True)


async def hold(addr: str, port: int, keepalive: str) -> None:
    options = aiordma.QueuePairOptions(keepalive=float(keepalive))
    channel = await aiordma.open_channel(addr, port, options=options)
    await channel.recv_message()
    print("holding", flush=True)
    start = time.monotonic()
    try:
        while True:
            message = await channel.recv_message()
            start = time.monotonic()
            await channel.send_message(message)
    except Exception as exc:  # reported to the test, which judges it
        print(f"failed {type(exc).__name__} {time.monotonic() - start:.2f}", flush=True)
    await channel.close()


async def raw_requests(addr: str, port: int, method: str, count: str, size: str) -> None:
    from aiordma.rpc.frames import PROTOCOL, Frame, FrameKind

    total = int(count) * int(size)
    channel = await aiordma.open_channel(
        addr, port, protocol=PROTOCOL, medium_limit=0, max_exposed=total, max_message=total
    )
    body = blob(int(size))
    posted = []
    for call_id in range(1, int(count) + 1):
        head = Frame(FrameKind.REQUEST, call_id, method).pack()
        posted.append(await channel.post_message(body, head=head))
    print("posted", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    mode, host, port_text, *rest = sys.argv[1:]
    modes: dict[str, Callable[..., Coroutine[None, None, None]]] = {
        "serve": serve,
        "stream": stream,
        "clients": clients,
        "try": attempt,
        "checksums": checksums,
        "rpc": rpc_server,
        "region": region,
        "digests": digests,
        "calls": calls,
        "hold": hold,
        "requests": raw_requests,
    }
    asyncio.run(modes[mode](host, int(port_text), *rest))
