"""The ``rdma://`` comm's contract with distributed (lab device, asyncio and uvloop).

Both ends go through distributed's own ``connect`` and ``listen``, so the
handshake, the address handling and the error conversions are distributed's
real ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
from distributed.comm.core import Comm, CommClosedError, FatalCommClosedError, connect, listen
from distributed.protocol.serialize import Serialize, Serialized, to_serialize

import aiordma
from aiordma.dask.comm import REFUSAL, RdmaComm
from tests.conftest import Lab, spawn_python

TIMEOUT = 120
STARTUP = 600
"""Seconds a child process may take to import distributed and connect."""
MIB = 1 << 20

Handler = Callable[[Comm], Awaitable[None]]


@asynccontextmanager
async def listening(
    lab: Lab, handler: Handler, *, deserialize: bool = True, host: str | None = None
) -> AsyncIterator[Any]:
    listener = listen(f"rdma://{lab.addr if host is None else host}:0", handler, deserialize)
    await listener.start()
    try:
        yield listener
    finally:
        listener.stop()
        await asyncio.wait_for(listener.wait_closed(), TIMEOUT)


async def echo(comm: Comm) -> None:
    try:
        while True:
            await comm.write(await comm.read())
    except CommClosedError:
        pass
    finally:
        await comm.close()


def digest(data: Any) -> str:
    return hashlib.sha256(memoryview(data).cast("B")).hexdigest()


async def digests(comm: Comm) -> None:
    """Replies to each array with its size and digest (large replies are not the point)."""
    try:
        while True:
            msg = await comm.read()
            array = msg["array"]
            await comm.write({"n": array.nbytes, "sha": digest(array), "w": array.flags.writeable})
    except CommClosedError:
        pass
    finally:
        await comm.close()


@pytest.mark.asyncio
async def test_small_messages_round_trip_with_the_handshake_done(lab: Lab) -> None:
    async with listening(lab, echo) as listener:
        comm = await connect(listener.contact_address, timeout=TIMEOUT)
        try:
            assert isinstance(comm, RdmaComm)
            assert comm.remote_info["address"] == listener.contact_address
            assert "pickle-protocol" in comm.handshake_options
            for msg in ({"op": "ping"}, (1, 2.5, "three", None), b"x" * 1000, {"k": b"\0" * 7000}):
                await comm.write(msg)
                assert await comm.read() == msg
        finally:
            await comm.close()
        assert comm.closed()


async def _array_round_trip(lab: Lab, size: int) -> None:
    rng = np.random.default_rng(size)
    array = rng.integers(0, 255, size, dtype=np.uint8)
    async with listening(lab, digests) as listener:
        comm = await connect(listener.contact_address, timeout=TIMEOUT)
        try:
            await comm.write({"array": to_serialize(array)})
            reply = await asyncio.wait_for(comm.read(), TIMEOUT * 4)
        finally:
            await comm.close()
    assert reply == {"n": size, "sha": digest(array), "w": True}


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [64 * 1024, 8 * MIB], ids=["64K", "8M"])
async def test_large_arrays_arrive_intact_and_writable(lab: Lab, size: int) -> None:
    await _array_round_trip(lab, size)


@pytest.mark.asyncio
@pytest.mark.slow  # 80 s in the lab; the 8 MiB array above takes the same path
@pytest.mark.timeout(600)
async def test_a_256_mib_array_arrives_intact_and_writable(lab: Lab) -> None:
    await _array_round_trip(lab, 256 * MIB)


@pytest.mark.asyncio
async def test_a_write_returns_before_the_peer_reads_its_large_frames(lab: Lab) -> None:
    """One task writes on one comm, then reads on the other, as distributed's
    ``check_deserialize_roundtrip`` does: the write must not wait for the read."""
    accepted: asyncio.Queue[Comm] = asyncio.Queue()
    payload = bytes(range(256)) * (16 << 10)  # 4 MiB: a frame of its own, read by rendezvous
    async with listening(lab, reader_of(accepted)) as listener:
        a = await connect(listener.contact_address, timeout=TIMEOUT)
        b = await asyncio.wait_for(accepted.get(), TIMEOUT)
        try:
            await asyncio.wait_for(a.write({"x": to_serialize(payload)}), TIMEOUT)
            got = await asyncio.wait_for(b.read(), TIMEOUT)
            assert got["x"] == payload
            await asyncio.wait_for(b.write(got), TIMEOUT)
            assert (await asyncio.wait_for(a.read(), TIMEOUT))["x"] == payload
        finally:
            await a.close()
            await b.close()


@pytest.mark.asyncio
async def test_a_message_of_many_frames_keeps_their_order(lab: Lab) -> None:
    sizes = [5, 300_000, 0, 70_000, 9, 2 * MIB]
    arrays = [np.full(n, i, dtype=np.uint8) for i, n in enumerate(sizes)]
    async with listening(lab, echo) as listener:
        comm = await connect(listener.contact_address, timeout=TIMEOUT)
        try:
            await comm.write({"arrays": [to_serialize(a) for a in arrays]})
            back = await comm.read()
        finally:
            await comm.close()
    assert [a.tobytes() for a in back["arrays"]] == [a.tobytes() for a in arrays]


@pytest.mark.asyncio
async def test_deserialize_off_hands_over_serialized_payloads(lab: Lab) -> None:
    received: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def keep(comm: Comm) -> None:
        received.set_result(await comm.read())
        await comm.close()

    array = np.arange(1000, dtype=np.int64)
    async with listening(lab, keep, deserialize=False) as listener:
        comm = await connect(listener.contact_address, timeout=TIMEOUT)
        try:
            await comm.write({"op": "put", "data": Serialize(array)})
            msg = await asyncio.wait_for(received, TIMEOUT)
        finally:
            await comm.close()
    assert msg["op"] == "put"
    assert isinstance(msg["data"], Serialized)
    assert msg["data"].header["type"] != ""
    assert sum(map(len, msg["data"].frames)) >= array.nbytes


@pytest.mark.asyncio
async def test_many_listeners_at_once_each_reach_their_own_handler(lab: Lab) -> None:
    def named(name: str) -> Handler:
        async def handler(comm: Comm) -> None:
            await comm.read()
            await comm.write(name)
            await comm.close()

        return handler

    listeners = [listen(f"rdma://{lab.addr}:0", named(f"n{i}")) for i in range(6)]
    for listener in listeners:
        await listener.start()
    try:
        assert len({listener.listen_address for listener in listeners}) == 6
        comms = await asyncio.gather(
            *(connect(listener.contact_address, timeout=TIMEOUT) for listener in listeners)
        )
        for comm in comms:
            await comm.write("who")
        assert [await comm.read() for comm in comms] == [f"n{i}" for i in range(6)]
        for comm in comms:
            await comm.close()
    finally:
        for listener in listeners:
            listener.stop()
        for listener in listeners:
            await asyncio.wait_for(listener.wait_closed(), TIMEOUT)


def reader_of(listener_comms: asyncio.Queue[Comm]) -> Handler:
    """A handler that hands each accepted comm to the test."""

    async def handler(comm: Comm) -> None:
        await listener_comms.put(comm)

    return handler


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["close", "abort"])
@pytest.mark.both_loops("close")
async def test_the_peers_read_fails_with_commclosederror_when_a_comm_is_closed(
    lab: Lab, how: str
) -> None:
    accepted: asyncio.Queue[Comm] = asyncio.Queue()
    async with listening(lab, reader_of(accepted)) as listener:
        comm = await connect(listener.contact_address, timeout=TIMEOUT)
        server_side = await asyncio.wait_for(accepted.get(), TIMEOUT)
        pending = asyncio.ensure_future(server_side.read())
        await comm.write("last words")
        assert await asyncio.wait_for(pending, TIMEOUT) == "last words"
        await comm.write({"then": "closed"})  # delivered, as a socket delivers before its FIN
        if how == "close":
            await comm.close()
        else:
            comm.abort()
        assert await asyncio.wait_for(server_side.read(), TIMEOUT) == {"then": "closed"}
        pending = asyncio.ensure_future(server_side.read())
        with pytest.raises(CommClosedError):
            await asyncio.wait_for(pending, TIMEOUT)
        assert comm.closed()
        with pytest.raises(CommClosedError):
            await comm.write("after close")
        with pytest.raises(CommClosedError):
            await server_side.write("to a closed peer")
        assert server_side.closed()
        await server_side.close()


@pytest.mark.asyncio
async def test_a_peer_process_killed_fails_the_read_promptly(lab: Lab) -> None:
    accepted: asyncio.Queue[Comm] = asyncio.Queue()
    async with listening(lab, reader_of(accepted)) as listener:
        code = (
            "import asyncio, sys\n"
            "from distributed.comm import connect\n"
            "async def main():\n"
            "    comm = await connect(sys.argv[1], timeout=600)\n"
            "    await comm.write('hello')\n"
            "    print('connected', flush=True)\n"
            "    await asyncio.sleep(3600)\n"
            "asyncio.run(main())\n"
        )
        proc = await spawn_python(["-c", code, listener.contact_address], stderr=None)
        try:
            # The child first imports distributed: minutes in an emulated guest
            # that shares its cores with other guests (seen: over 120 s).
            server_side = await asyncio.wait_for(accepted.get(), STARTUP)
            assert await asyncio.wait_for(server_side.read(), TIMEOUT) == "hello"
            pending = asyncio.ensure_future(server_side.read())
            assert proc.stdout is not None
            assert (await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)).strip() == b"connected"
            killed = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            with pytest.raises(CommClosedError):
                await asyncio.wait_for(pending, TIMEOUT)
            took = time.monotonic() - killed
            await server_side.close()
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
    # The kernel disconnects a dead process's connections: no keepalive wait.
    bound = aiordma.QueuePairOptions().retry_bound + 10
    assert took < bound, f"the read failed {took:.1f} s after the peer died (bound {bound:.1f} s)"


@pytest.mark.asyncio
async def test_addresses_and_repr(lab: Lab) -> None:
    accepted: asyncio.Queue[Comm] = asyncio.Queue()
    async with listening(lab, reader_of(accepted), host="0.0.0.0") as listener:
        port = listener.get_host_port()[1]
        assert port > 0
        assert listener.listen_address == f"rdma://0.0.0.0:{port}"
        assert listener.contact_address == f"rdma://{lab.addr}:{port}"
        comm = await connect(listener.contact_address, timeout=TIMEOUT)
        server_side = await asyncio.wait_for(accepted.get(), TIMEOUT)
        try:
            assert comm.peer_address == listener.contact_address
            assert comm.local_address.startswith(f"rdma://{lab.addr}:")
            assert server_side.peer_address == comm.local_address
            assert server_side.local_address == listener.contact_address
            assert repr(comm).startswith("<RdmaComm ")
            assert f"remote={listener.contact_address}" in repr(comm)
            assert comm.same_host
        finally:
            await comm.close()
            await server_side.close()
        assert repr(comm).startswith("<RdmaComm (closed)")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("form", "bound", "port"),
    [("0.0.0.0", "0.0.0.0", 0), ("0.0.0.0:3241", "0.0.0.0", 3241), ("", "0.0.0.0", 0),
     (":3242", "0.0.0.0", 3242), ("[::]", "::", 0)],
    ids=["any4", "any4-port", "bare", "port-only", "any6"],
)  # fmt: skip
async def test_every_wildcard_form_listens_where_peers_reach_it(
    lab: Lab, form: str, bound: str, port: int
) -> None:
    """As distributed's own tcp:// checks: no host (or :port) reports 0.0.0.0,
    and the contact address is this host's RDMA address of that family."""
    listener = listen(f"rdma://{form}", echo)
    await listener.start()
    try:
        host, got = listener.get_host_port()
        assert host == bound
        assert got == port or (port == 0 and got > 0)
        port = got
        contact = f"[{lab.addr6}]" if bound == "::" else lab.addr
        assert listener.contact_address == f"rdma://{contact}:{port}"
        comms = await asyncio.gather(
            *(connect(listener.contact_address, timeout=TIMEOUT) for _ in range(4))
        )
        for i, comm in enumerate(comms):
            assert comm.peer_address == listener.contact_address
            await comm.write({"key": i})
        assert [await comm.read() for comm in comms] == [{"key": i} for i in range(4)]
        for comm in comms:
            await comm.close()
    finally:
        listener.stop()
        await asyncio.wait_for(listener.wait_closed(), TIMEOUT)


@pytest.mark.asyncio
async def test_a_comm_pair_outlives_the_listener_that_made_it(lab: Lab) -> None:
    """Stopping a listener at once after connecting (as distributed's
    ``get_comm_pair`` does) leaves the accepted comm open, mid-handshake or not."""
    accepted: asyncio.Queue[Comm] = asyncio.Queue()
    listener = listen(f"rdma://{lab.addr}:0", reader_of(accepted))
    async with listener:  # as get_comm_pair: stop() on the way out, no waiting
        comm = await connect(listener.contact_address, timeout=TIMEOUT)
    server_side = await asyncio.wait_for(accepted.get(), TIMEOUT)
    try:
        assert "closed" not in repr(comm)
        assert "closed" not in repr(server_side)
        await server_side.write({"after": "stop"})
        assert await asyncio.wait_for(comm.read(), TIMEOUT) == {"after": "stop"}
    finally:
        await comm.close()
    assert "closed" in repr(comm)
    with pytest.raises(CommClosedError):
        await asyncio.wait_for(server_side.read(), TIMEOUT)
    await server_side.close()
    await asyncio.wait_for(listener.wait_closed(), TIMEOUT)


@pytest.mark.asyncio
async def test_ipv6_addresses_work_and_are_bracketed(lab: Lab) -> None:
    assert lab.addr6
    async with listening(lab, echo, host=f"[{lab.addr6}]") as listener:
        assert listener.contact_address.startswith(f"rdma://[{lab.addr6}]:")
        comm = await connect(listener.contact_address, timeout=TIMEOUT)
        try:
            await comm.write({"v6": True})
            assert await comm.read() == {"v6": True}
        finally:
            await comm.close()


# -- bad input ---------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("addr", "says"),
    [("rdma://192.0.2.1", "missing port"), ("rdma://192.0.2.1:99999", "port"),
     ("rdma://[2001:db8::1:7", "invalid address")],
)  # fmt: skip
async def test_a_malformed_address_is_a_valueerror(lab: Lab, addr: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        await connect(addr, timeout=5)


@pytest.mark.asyncio
async def test_a_listener_on_an_address_of_no_rdma_device_names_the_ones_that_are(
    lab: Lab,
) -> None:
    listener = listen("rdma://127.0.0.1:0", echo)
    with pytest.raises(OSError, match=lab.addr):
        await listener.start()


@pytest.mark.asyncio
async def test_connecting_where_nobody_listens_fails_within_the_timeout(lab: Lab) -> None:
    server = await aiordma.start_server(lambda conn: None, lab.addr, 0)
    port = server.addresses[0][1]
    server.close()
    await server.wait_closed()
    with pytest.raises(OSError, match=r"Timed out trying to connect .* after 3 s"):
        await connect(f"rdma://{lab.addr}:{port}", timeout=3)  # retried until its timeout


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_connecting_to_a_silent_address_fails_within_the_timeout(lab: Lab) -> None:
    silent = lab.addr.rsplit(".", 1)[0] + ".99"  # in the lab's subnet; nobody has it
    with pytest.raises(OSError, match=r"Timed out trying to connect .* after 4 s"):
        await connect(f"rdma://{silent}:8786", timeout=4)


@pytest.mark.asyncio
async def test_a_peer_that_is_not_a_dask_comm_is_refused_at_once(lab: Lab) -> None:
    async def channel_echo(channel: aiordma.MessageChannel) -> None:
        async for msg in channel:
            await channel.send_message(msg)

    server = await aiordma.start_channel_server(channel_echo, lab.addr, 0)
    try:
        port = server.addresses[0][1]
        # Fatal: not retried (a retried connect would end in "Timed out" after 30 s).
        with pytest.raises(FatalCommClosedError, match="not an aiordma Dask comm listener"):
            await connect(f"rdma://{lab.addr}:{port}", timeout=30)
    finally:
        server.close()
        server.close_clients()
        await server.wait_closed()


@pytest.mark.asyncio
async def test_a_client_that_is_not_a_dask_comm_is_rejected_with_a_reason(lab: Lab) -> None:
    async with listening(lab, echo) as listener:
        port = listener.get_host_port()[1]
        with pytest.raises(aiordma.ConnectionRejectedError) as caught:
            await aiordma.open_channel(lab.addr, port)
    assert caught.value.private_data.rstrip(b"\0") == REFUSAL


@pytest.mark.asyncio
async def test_required_encryption_is_refused_rather_than_ignored(lab: Lab) -> None:
    with pytest.raises(RuntimeError, match="encryption required"):
        await connect(f"rdma://{lab.addr}:8786", timeout=5, require_encryption=True)
    with pytest.raises(RuntimeError, match="encryption required"):
        listen(f"rdma://{lab.addr}:0", echo, require_encryption=True)


def test_the_backend_is_found_by_its_entry_point() -> None:
    from distributed.comm.registry import backends, get_backend

    backends.pop("rdma", None)
    backend = get_backend("rdma")
    assert type(backend).__module__ == "aiordma.dask.backend"
    assert backend.resolve_address("localhost:8786") == "127.0.0.1:8786"
    assert backend.get_address_host_port("[2001:db8::1]:9") == ("2001:db8::1", 9)
