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
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine

import aiordma
from aiordma import Access

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


if __name__ == "__main__":
    mode, host, port_text, *rest = sys.argv[1:]
    modes: dict[str, Callable[..., Coroutine[None, None, None]]] = {
        "serve": serve,
        "stream": stream,
        "clients": clients,
        "try": attempt,
    }
    asyncio.run(modes[mode](host, int(port_text), *rest))
