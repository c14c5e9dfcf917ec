"""The measurements ``aiordma bench`` makes, against :mod:`aiordma.bench.peer`."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiordma
from aiordma import RemoteBuffer, metrics, rpc
from aiordma.bench import counts, tcp
from aiordma.bench.stats import Latency, Result
from aiordma.channel.options import DEFAULT_MAX_MESSAGE
from aiordma.lab.remote import Fabric
from aiordma.transfer import DescriptorList, start_agent
from aiordma.verbs.options import Read, Send, Write

REMOTE_START_TIMEOUT = 120.0
"""Seconds the peer on the lab's host 2 may take to start listening."""

Progress = Callable[[int], None]
"""Told how many measured operations have completed so far."""


@dataclass(frozen=True)
class Plan:
    """How long one measurement runs: ``iterations`` operations, or ``duration`` seconds."""

    iterations: int
    warmup: int
    depth: int
    duration: float | None = None
    pace: float | None = None
    """Seconds from one latency operation's start to the next's (None: back to back)."""

    def more(self, done: int, start: float) -> bool:
        if self.duration is not None:
            return time.perf_counter() - start < self.duration
        return done < self.iterations


class Peer:
    """The peer process, on ``addr`` for messages up to ``max_size``, running ``loop``.

    It serves the RDMA side on :attr:`port` and the TCP baseline on
    :attr:`tcp_port`. :meth:`start` runs it here; :meth:`start_remote` on
    host 2 of the two-host lab, across the link.
    """

    def __init__(
        self, addr: str, port: int, tcp_port: int, stop: Callable[[], None],
        agent: bytes = b"", pool: bytes = b"",
    ) -> None:  # fmt: skip
        self.addr, self.port, self.tcp_port = addr, port, tcp_port
        self.agent, self.pool = agent, pool
        """The peer's transfer agent (metadata) and its pool (a packed descriptor list)."""
        self._stop = stop

    @staticmethod
    def _argv(addr: str, max_size: int, loop: str) -> list[str]:
        return [sys.executable, "-m", "aiordma.bench.peer", addr, str(max_size), loop]

    @classmethod
    def _from_line(cls, addr: str, line: str, stop: Callable[[], None]) -> Peer:
        words = line.split()
        if words[:1] != ["listening"]:
            stop()
            raise RuntimeError(f"the benchmark peer did not start: {line!r}")
        agent, pool = (bytes.fromhex(w) for w in words[3:5]) if len(words) >= 5 else (b"", b"")
        return cls(addr, int(words[1]), int(words[2]), stop, agent, pool)

    @classmethod
    def start(cls, addr: str, max_size: int, loop: str = "asyncio") -> Peer:
        """Run the peer as a process of this machine."""
        proc = subprocess.Popen(cls._argv(addr, max_size, loop), stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None

        def stop() -> None:
            proc.kill()
            proc.wait()

        return cls._from_line(addr, proc.stdout.readline(), stop)

    @classmethod
    async def start_remote(cls, fabric: Fabric, max_size: int, loop: str = "asyncio") -> Peer:
        """Run the peer on host 2 of the two-host lab (``fabric``)."""
        proc = fabric.start(cls._argv(fabric.peer_addr, max_size, loop))
        try:
            async with asyncio.timeout(REMOTE_START_TIMEOUT):
                out = await proc.wait_for_output("listening ")
        except BaseException:
            proc.send_signal(signal.SIGKILL)
            raise
        line = "listening " + out.split("listening ", 1)[1].split("\n", 1)[0]
        return cls._from_line(fabric.peer_addr, line, lambda: proc.send_signal(signal.SIGKILL))

    def close(self) -> None:
        self._stop()


def _report(progress: Progress | None, done: int) -> None:
    if progress is not None and done % 64 == 0:
        progress(done)


class Samples(list[float]):
    """Latencies in seconds, and the machine's busy CPU seconds per operation."""

    cpu_per_op: float | None = None


def machine_busy() -> float | None:
    """Seconds of CPU the whole machine has been busy (``/proc/stat``; None
    where there is none): every process's and the kernel's, the device's
    work on Soft-RoCE included."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal: all but idle and iowait
    ticks = sum(int(f) for i, f in enumerate(fields[1:9]) if i not in (3, 4))
    return ticks / os.sysconf("SC_CLK_TCK")


async def _latencies(
    plan: Plan, op: Callable[[], Awaitable[Any]], progress: Progress | None
) -> Samples:
    for _ in range(plan.warmup):
        await op()
    samples = Samples()
    clock = time.perf_counter
    busy = machine_busy()
    begin = clock()
    while plan.more(len(samples), begin):
        start = clock()
        await op()
        samples.append(clock() - start)
        _report(progress, len(samples))
        if plan.pace is not None:  # the next start on a fixed schedule
            await asyncio.sleep(max(0.0, begin + len(samples) * plan.pace - clock()))
    after = machine_busy()
    if busy is not None and after is not None and samples:
        samples.cpu_per_op = (after - busy) / len(samples)
    return samples


async def _window(
    plan: Plan, post: Callable[[], Awaitable[Any]], progress: Progress | None, *, warm: bool = False
) -> tuple[int, float]:
    """Keep ``plan.depth`` operations in flight; (operations, seconds taken)."""
    pending: collections.deque[asyncio.Future[Any]] = collections.deque()
    done = 0
    start = time.perf_counter()
    while plan.more(done, start) if not warm else done < plan.warmup:
        if len(pending) >= plan.depth:
            await pending.popleft()
        pending.append(await post())
        done += 1
        _report(progress, done)
    for fut in pending:
        await fut
    return done, time.perf_counter() - start


async def _rate(
    conn: aiordma.Connection, op: Send, plan: Plan, progress: Progress | None, count: int | None
) -> tuple[int, float]:
    """Sends, ``plan.depth`` in flight, posted as lists whenever half the window is free."""
    pending: collections.deque[asyncio.Future[Any]] = collections.deque()
    done = 0
    start = time.perf_counter()
    refill = max(1, plan.depth // 2)
    silent = dataclasses.replace(op, signaled=False)
    while plan.more(done, start) if count is None else done < count:
        room = plan.depth - len(pending)
        if room < refill:
            await pending.popleft()
            while pending and pending[0].done():
                pending.popleft().result()
            continue
        if count is not None:
            room = min(room, count - done)
        elif plan.duration is None:
            room = min(room, plan.iterations - done)
        batch = [silent] * (room - 1) + [op]  # one completion per list (selective signalling)
        pending.extend(await conn.post_batch(batch))
        done += room
        _report(progress, done - done % 64)
    for fut in pending:
        await fut
    return done, time.perf_counter() - start


async def measure(
    peer: Peer, mode: str, size: int, plan: Plan, progress: Progress | None = None
) -> Result:
    """Run ``mode`` at ``size`` bytes over RDMA against ``peer``; its ``warmup``
    says how many operations ran before the measured ones."""
    result = await _measure(peer, mode, size, plan, progress)
    if mode.startswith("xfer_"):  # it warmed up in whole transfers, and says how many blocks
        return result
    return dataclasses.replace(result, warmup=plan.warmup)


async def _measure(
    peer: Peer, mode: str, size: int, plan: Plan, progress: Progress | None
) -> Result:
    if mode.startswith("rpc"):
        return await _measure_rpc(peer, mode, size, plan, progress)
    if mode == "connect":
        return await _measure_connect(peer, plan, progress)
    if mode.startswith("msg_"):
        return await _measure_messages(peer, mode, size, plan, progress)
    if mode.startswith("xfer_"):
        return await _measure_transfers(peer, mode, size, plan, progress)
    kind = {"send_lat": b"echo", "send_rate": b"sink"}.get(mode, b"mem")
    async with await aiordma.connect(peer.addr, peer.port, private_data=kind) as conn:
        local = conn.alloc(size)
        if mode == "send_rate":
            await _rate(conn, Send(local), plan, None, plan.warmup)
            done, seconds = await _rate(conn, Send(local), plan, progress, None)
            return Result("aiordma", mode, size, plan.depth, done, seconds)
        if mode == "send_lat":
            inbox = conn.alloc(size)

            async def ping() -> None:
                (reply,) = await conn.post_recv_batch([inbox])
                await conn.post_send(local)
                await reply

            samples = await _latencies(plan, ping, progress)
            return Result("aiordma", mode, size, 1, len(samples), sum(samples), Latency.of(samples))
        remote = RemoteBuffer.from_bytes(conn.peer_private_data[: RemoteBuffer.SIZE])[:size]
        if mode == "write_lat":
            samples = await _latencies(plan, lambda: conn.rdma_write(local, remote), progress)
        elif mode == "read_lat":
            samples = await _latencies(plan, lambda: conn.rdma_read(local, remote), progress)
        else:
            op = Write(local, remote) if mode == "write_bw" else Read(local, remote)

            async def post() -> asyncio.Future[Any]:
                (fut,) = await conn.post_batch([op])
                return fut

            await _window(plan, post, None, warm=True)
            done, seconds = await _window(plan, post, progress)
            return Result("aiordma", mode, size, plan.depth, done, seconds)
        return Result("aiordma", mode, size, 1, len(samples), sum(samples), Latency.of(samples))


XFER_BLOCKS = 1000
"""Blocks one transfer of the ``xfer_*`` modes names, at most (fewer when
that many would not fit the peer's pool)."""


async def _measure_transfers(
    peer: Peer, mode: str, size: int, plan: Plan, progress: Progress | None
) -> Result:
    """Transfers of a list of scattered ``size``-byte blocks of the peer's pool,
    ``plan.depth`` in flight; counted in blocks (so rates compare with perftest's)."""
    pool = DescriptorList.from_bytes(peer.pool)
    if size > pool.nbytes:
        raise ValueError(f"{mode} moves blocks of at most {pool.nbytes} bytes (the peer's pool)")
    slots = pool.nbytes // size
    count = min(XFER_BLOCKS, slots)
    remote = pool.split(size).take(random.Random(size).sample(range(slots), count))
    async with await start_agent() as agent:
        target = agent.peer(peer.agent)
        local = agent.alloc(size * count).blocks(size)
        move = agent.write if mode == "xfer_write" else agent.read
        transfers = Plan(max(1, plan.iterations // count), max(1, plan.warmup // count),
                         plan.depth, plan.duration)  # fmt: skip

        async def post() -> asyncio.Future[Any]:
            return asyncio.ensure_future(move(target, local, remote))

        def blocks(done: int) -> None:
            if progress is not None:
                progress(done * count)

        await _window(transfers, post, None, warm=True)
        done, seconds = await _window(transfers, post, blocks)
        return Result("aiordma", mode, size, plan.depth, done * count, seconds,
                      extra={"blocks_per_transfer": count},
                      warmup=transfers.warmup * count)  # fmt: skip


async def _measure_rpc(
    peer: Peer, mode: str, size: int, plan: Plan, progress: Progress | None
) -> Result:
    async with await rpc.connect(peer.addr, peer.port) as client:
        if mode == "rpc_lat":
            payload = bytes(size)
            samples = await _latencies(plan, lambda: client.call("echo", payload), progress)
            return Result("aiordma", mode, size, 1, len(samples), sum(samples), Latency.of(samples))
        if mode == "rpc_sink":
            payload = bytes(size)

            async def post() -> asyncio.Future[Any]:
                return asyncio.ensure_future(client.call("sink", payload))

        elif mode == "rpc_fetch":  # a new buffer per result
            request = str(size).encode()

            async def post() -> asyncio.Future[Any]:
                return asyncio.ensure_future(client.call("source", request))

        else:  # rpc_bw: results land in registered memory
            into = client.conn.alloc(size)
            request = str(size).encode()

            async def post() -> asyncio.Future[Any]:
                return asyncio.ensure_future(client.call("source", request, into=into))

        await _window(plan, post, None, warm=True)
        done, seconds = await _window(plan, post, progress)
        return Result("aiordma", mode, size, plan.depth, done, seconds)


async def _measure_messages(
    peer: Peer, mode: str, size: int, plan: Plan, progress: Progress | None
) -> Result:
    """Messages through a channel: a ping-pong (``_lat``), a stream with
    ``plan.depth`` sends in flight (``_bw``) or of ``send_messages`` calls of
    ``plan.depth`` messages each (``msg_rate``), timed until the peer
    acknowledged the last; ``msg_reg_*`` send from and receive into
    registered memory. Its ``extra`` has the work each message cost on
    each side (:mod:`aiordma.bench.counts`)."""
    registered = mode.startswith("msg_reg_")
    latency = mode.endswith("_lat")
    batched = mode == "msg_rate"
    shape = (b"_reg" if registered else b"_into" if mode.startswith("msg_into_")
             else b"_many" if batched else b"")  # fmt: skip
    kind = (b"msgecho" if latency else b"msgsink") + shape
    channel = await aiordma.open_channel(
        peer.addr, peer.port, private_data=kind, max_message=max(size, DEFAULT_MAX_MESSAGE)
    )
    async with channel:
        outgoing: aiordma.MemoryRegion | bytes = bytes(size)
        incoming: aiordma.MemoryRegion | None = None
        if registered:
            outgoing, incoming = channel.conn.alloc(size), channel.conn.alloc(size)

        async def receive() -> None:
            if incoming is not None:
                await channel.recv_message_into(incoming)
            else:
                await channel.recv_message()

        async def peer_counts() -> dict[str, int] | None:
            await channel.send_message(b"")  # the peer answers an empty message with its counts
            return counts.decode(await channel.recv_message())

        if latency:

            async def ping() -> None:
                await channel.send_message(outgoing)
                await receive()

            for _ in range(plan.warmup):
                await ping()
            before = _credit_packets(channel)
            mine, theirs = counts.read(channel.conn.qp), await peer_counts()
            samples = await _latencies(dataclasses.replace(plan, warmup=0), ping, progress)
            mine_after = counts.read(channel.conn.qp)  # before the probe, which it would count
            theirs_after = await peer_counts()
            messages = 2 * len(
                samples
            )  # two a round trip, each sent by one side and received by the other
            extra = _credit_extra(channel, before, messages)
            extra.update(counts.per_message(mine, mine_after, messages))
            extra.update(counts.per_message(theirs, theirs_after, messages, "peer_"))
            return Result("aiordma", mode, size, 1, len(samples), sum(samples), Latency.of(samples),
                          extra)  # fmt: skip

        async def stream(
            count: int | None, report: Progress | None
        ) -> tuple[int, float, dict[str, int] | None]:
            async def post() -> asyncio.Future[Any]:
                return asyncio.ensure_future(channel.send_message(outgoing))

            start = time.perf_counter()
            if batched:  # --depth messages a call, one call at a time
                done, total = 0, plan.iterations if count is None else count
                while plan.more(done, start) if count is None else done < total:
                    await channel.send_messages([outgoing] * plan.depth)
                    done += plan.depth
                    _report(report, done)
            elif count is None:
                done, _ = await _window(plan, post, report)
            else:
                done, _ = await _window(dataclasses.replace(plan, warmup=count), post, None,
                                        warm=True)  # fmt: skip
            answer = await peer_counts()  # the peer answers once it has all
            return done, time.perf_counter() - start, answer

        _, _, theirs = await stream(plan.warmup, None)
        before = _credit_packets(channel)
        mine = counts.read(channel.conn.qp)
        done, seconds, theirs_after = await stream(None, progress)
        extra = _credit_extra(channel, before, done)
        extra.update(counts.per_message(mine, counts.read(channel.conn.qp), done))
        extra.update(counts.per_message(theirs, theirs_after, done, "peer_"))
        return Result("aiordma", mode, size, plan.depth, done, seconds, extra=extra)


def _credit_packets(channel: aiordma.MessageChannel) -> int:
    """Credit-only packets this channel has sent and received so far."""
    counters = channel.stats()["counters"]
    return int(counters.get("credit_updates_sent", 0) + counters.get("credit_updates_received", 0))


def _credit_extra(channel: aiordma.MessageChannel, before: int, messages: int) -> dict[str, float]:
    """``credit_packets_per_message``: the packets that carried only credits,
    both ways, per message since ``before`` (none when metrics are off)."""
    if not messages or not metrics.enabled():
        return {}
    return {"credit_packets_per_message": (_credit_packets(channel) - before) / messages}


async def _measure_connect(peer: Peer, plan: Plan, progress: Progress | None) -> Result:
    """rdma_cm connection set-up: ``connect()`` until established (closing is not timed)."""

    async def connect() -> float:
        start = time.perf_counter()
        conn = await aiordma.connect(peer.addr, peer.port, private_data=b"idle")
        took = time.perf_counter() - start
        await conn.close()
        return took

    return await _connect_result("aiordma", plan, connect, progress)


async def _connect_result(
    tool: str, plan: Plan, op: Callable[[], Awaitable[float]], progress: Progress | None
) -> Result:
    """The ``connect`` result of ``tool``: ``op`` sets up (and closes) one
    connection and returns how long the set-up alone took."""
    for _ in range(plan.warmup):
        await op()
    samples: list[float] = []
    begin = time.perf_counter()
    while plan.more(len(samples), begin):
        samples.append(await op())
        _report(progress, len(samples))
    return Result(tool, "connect", 0, 1, len(samples), sum(samples), Latency.of(samples))


async def measure_tcp(
    peer: Peer, mode: str, size: int, plan: Plan, progress: Progress | None = None
) -> Result:
    """The same pattern as ``mode`` over asyncio TCP streams (see
    :mod:`aiordma.bench.tcp`), after ``plan.warmup`` operations (its ``warmup``)."""
    result = await _measure_tcp(peer, mode, size, plan, progress)
    return dataclasses.replace(result, warmup=plan.warmup)


async def _measure_tcp(
    peer: Peer, mode: str, size: int, plan: Plan, progress: Progress | None
) -> Result:
    if mode == "connect":

        async def connect() -> float:
            start = time.perf_counter()
            _, writer = await asyncio.open_connection(peer.addr, peer.tcp_port)
            took = time.perf_counter() - start
            writer.close()
            await writer.wait_closed()
            return took

        return await _connect_result("tcp", plan, connect, progress)
    method, payload = tcp.request_for(mode, size)
    if method in tcp.PLAIN:
        return await _measure_framed(peer, mode, method, payload, plan, progress)
    async with await tcp.Client.connect(peer.addr, peer.tcp_port) as client:
        if mode.endswith("_lat"):
            samples = await _latencies(plan, lambda: client.call(method, payload), progress)
            return Result("tcp", mode, size, 1, len(samples), sum(samples), Latency.of(samples))

        async def post() -> asyncio.Future[Any]:
            return asyncio.ensure_future(client.call(method, payload))

        await _window(plan, post, None, warm=True)
        done, seconds = await _window(plan, post, progress)
        return Result("tcp", mode, size, plan.depth, done, seconds)


async def _measure_framed(
    peer: Peer, mode: str, protocol: str, payload: bytes, plan: Plan, progress: Progress | None
) -> Result:
    """A framed ping-pong, or a framed stream timed until the server has read it all."""
    size = len(payload)
    async with await tcp.Framed.connect(peer.addr, peer.tcp_port, protocol) as framed:
        if protocol == "ping":
            samples = await _latencies(plan, lambda: framed.ping(payload), progress)
            return Result("tcp", mode, size, 1, len(samples), sum(samples), Latency.of(samples))

        async def stream(count: int | None, report: Progress | None) -> tuple[int, float]:
            done = 0
            start = time.perf_counter()
            while plan.more(done, start) if count is None else done < count:
                await framed.send(payload)
                done += 1
                _report(report, done)
            await framed.flush()
            return done, time.perf_counter() - start

        await stream(plan.warmup, None)
        done, seconds = await stream(None, progress)
        return Result("tcp", mode, size, plan.depth, done, seconds)
