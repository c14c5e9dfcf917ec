"""A key-value service over RDMA RPC, and a client that uses it.

    python examples/rpc_kv.py serve [HOST] [PORT] [--max-clients N]
    python examples/rpc_kv.py client HOST PORT

The server keeps values in memory. Small values travel inside a single RDMA
send; values larger than the eager limit (8 KiB) are read by the receiver
straight out of the sender's memory: a ``put`` of 4 MiB lands in the
server's memory without passing through a socket buffer or an extra copy,
and a ``get`` is answered from the stored bytes themselves.

Run both in the lab:  ./dev demo
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import struct
import time

import aiordma
from aiordma import rpc
from aiordma.channel.open import prepare_channel

_KEY = struct.Struct("<H")


def pack_put(key: str, value: bytes) -> bytes:
    name = key.encode()
    return _KEY.pack(len(name)) + name + value


def unpack_put(payload: bytes | bytearray) -> tuple[str, memoryview]:
    view = memoryview(payload)
    (length,) = _KEY.unpack_from(view)
    return bytes(view[2 : 2 + length]).decode(), view[2 + length :]


def make_service() -> rpc.Service:
    store: dict[str, memoryview] = {}
    service = rpc.Service()

    @service.method()
    async def put(payload: bytes) -> bytes:
        key, value = unpack_put(payload)
        store[key] = value  # a view of the received buffer: no copy
        return b""

    @service.method()
    async def get(payload: bytes) -> memoryview:
        key = bytes(payload).decode()
        if key not in store:
            raise KeyError(key)
        return store[key]

    @service.method()
    async def delete(payload: bytes) -> bytes:
        return b"1" if store.pop(bytes(payload).decode(), None) is not None else b"0"

    @service.method()
    async def keys(payload: bytes) -> bytes:
        return "\n".join(sorted(store)).encode()

    return service


async def serve(host: str | None, port: int, max_clients: int | None) -> None:
    service = make_service()
    done = asyncio.Event()
    served = 0

    async def handle(conn: aiordma.Connection) -> None:
        nonlocal served
        await service.handle(conn)  # serves calls until the client disconnects
        served += 1
        if max_clients is not None and served >= max_clients:
            done.set()

    # What rpc.start_server(service, host, port) does, plus counting clients.
    async with await aiordma.start_server(handle, host, port, prepare=prepare_channel) as server:
        for addr, bound_port in server.addresses:
            print(f"listening on {addr} {bound_port}", flush=True)
        if max_clients is None:
            await server.serve_forever()
        else:
            await done.wait()


def value_of(size: int) -> bytes:
    block = hashlib.sha256(b"%d" % size).digest()
    return (block * (size // len(block) + 1))[:size]


async def client(host: str, port: int) -> None:
    async with await rpc.connect(host, port) as kv:
        for size in (11, 1024, 64 << 10, 4 << 20):
            key, value = f"value-{size}", value_of(size)
            start = time.perf_counter()
            await kv.call("put", pack_put(key, value), timeout=60)
            stored = time.perf_counter()
            fetched = await kv.call("get", key.encode(), timeout=60)
            took = time.perf_counter() - stored
            assert fetched == value, f"{key} came back different"
            print(
                f"{key}: {size} bytes stored in {(stored - start) * 1e3:.1f} ms, "
                f"fetched intact in {took * 1e3:.1f} ms",
                flush=True,
            )
        print("keys:", (await kv.call("keys")).decode().replace("\n", " "), flush=True)
        print("deleted value-11:", (await kv.call("delete", b"value-11")) == b"1", flush=True)
        try:
            await kv.call("get", b"value-11")
        except rpc.RemoteError as exc:
            print(f"get value-11: {exc.remote_type} {exc.remote_message}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    srv = sub.add_parser("serve", help="run the key-value server")
    srv.add_argument("host", nargs="?", default=None, help="address to listen on (default: all)")
    srv.add_argument("port", nargs="?", type=int, default=7472, help="0 picks a free port")
    srv.add_argument("--max-clients", type=int, help="exit after serving this many clients")
    cli = sub.add_parser("client", help="store and fetch values from bytes to megabytes")
    cli.add_argument("host")
    cli.add_argument("port", type=int)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        if args.role == "serve":
            asyncio.run(serve(args.host, args.port, args.max_clients))
        else:
            asyncio.run(client(args.host, args.port))
