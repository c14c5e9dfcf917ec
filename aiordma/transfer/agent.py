"""The transfer agent: registered memory as descriptor lists, and awaited one-sided transfers.

An :class:`Agent` registers memory (:meth:`Agent.register`,
:meth:`Agent.alloc`), hands out its blocks as
:class:`~aiordma.transfer.DescriptorList` s, reaches other agents by
address or by their metadata (one message channel each, made on first use
and made again after a failure), and moves a whole list of local blocks
to or from a peer's blocks in one await (:meth:`Agent.read`,
:meth:`Agent.write`): the pairs become a table of records in compiled code
and the verbs layer posts the table in bounded chunks from the completion
drain (:meth:`aiordma.QueuePair.start_bulk`). A transfer may carry a
notification that the peer receives once the data is in place
(:meth:`Agent.notifications`).

Call order of a transfer: ``check lists -> connect (first use) -> plan ->
start_bulk -> done -> [NOTE]``; cancelled or past its deadline, it stops
posting and returns once what was posted has completed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import secrets
from array import array
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from aiordma import bulk_table, metrics
from aiordma._checks import check_bytes_like, check_deadline, check_int, check_seconds
from aiordma.channel import (
    Access,
    ChannelOptions,
    ConnectOptions,
    Device,
    MemoryRegion,
    MessageChannel,
    PresharedKey,
    ServeOptions,
    Server,
    open_channel_with,
    post_block,
    read_piece_for,
    serve_channels_with,
    start_bulk,
)
from aiordma.exceptions import (
    ConnectionLostError,
    MemoryLimitError,
    ProtocolError,
    RdmaError,
    ResourceClosedError,
    TransferError,
)
from aiordma.lifecycle import check_loop
from aiordma.metrics import Stats
from aiordma.transfer import _plan, wire
from aiordma.transfer.descriptors import DescriptorList, RegionInfo
from aiordma.transfer.wire import Identity

if TYPE_CHECKING:
    from typing_extensions import Unpack

HELLO_TIMEOUT = 10.0
"""Seconds a new connection's peer has to say who it is."""

_REMOTE = Access.REMOTE_READ | Access.REMOTE_WRITE


@dataclass(frozen=True, slots=True)
class Notification:
    """Bytes a peer sent with a transfer, delivered once its data was in place."""

    peer: Peer
    data: bytes


class Registration:
    """Memory an agent registered: what its descriptor lists name.

    Made by :meth:`Agent.register` / :meth:`Agent.alloc`; ended by
    :meth:`Agent.unregister` (or :meth:`aclose`).
    """

    def __init__(self, agent: Agent, mr: MemoryRegion) -> None:
        self.agent = agent
        self.mr = mr
        """The memory region (its ``view()`` is the memory)."""
        self.info = RegionInfo(mr.addr, mr.length, mr.lkey,
                               mr.rkey if mr.access & _REMOTE else 0, int(mr.access))  # fmt: skip

    def __repr__(self) -> str:
        state = "unregistered" if self.mr.closed else repr(self.mr.access)
        return f"<Registration {self.mr.length} bytes at {self.mr.addr:#x} {state}>"

    def __len__(self) -> int:
        return self.mr.length

    def view(self) -> memoryview:
        """The registered memory, byte-wise (no copy)."""
        return self.mr.view()

    def blocks(self, size: int, count: int | None = None, *, offset: int = 0) -> DescriptorList:
        """``count`` blocks of ``size`` bytes back to back from ``offset`` (as many
        as fit by default): a pool of equal blocks, such as a KV cache's."""
        self._check_open()
        check_int("size", size)
        check_int("offset", offset)
        if count is not None:
            check_int("count", count)
        if size <= 0 or offset < 0:
            raise ValueError(f"block size {size} must be positive and offset {offset} "
                             "not negative")  # fmt: skip
        room = (self.mr.length - offset) // size if offset <= self.mr.length else 0
        if count is None:
            count = room
        if count < 1 or count > room:
            raise ValueError(f"{count} blocks of {size} bytes from offset {offset} do not fit "
                             f"the {self.mr.length}-byte registration")  # fmt: skip
        base = self.mr.addr + offset
        return DescriptorList.trusted(
            self.agent.id, (self.info,), array("Q", range(base, base + count * size, size)),
            array("Q", [size]) * count, array("I", bytes(4 * count)),
        )  # fmt: skip

    def descriptors(self, spans: Iterable[tuple[int, int]]) -> DescriptorList:
        """One block per ``(offset, length)`` of ``spans``; ValueError names one outside."""
        self._check_open()
        return DescriptorList.spans(self.agent.id, self.info, spans)

    def _check_open(self) -> None:
        if self.agent._closing:
            raise ResourceClosedError("the transfer agent is closed")
        if self.mr.closed:
            raise ResourceClosedError("this registration was unregistered")

    async def aclose(self) -> None:
        """:meth:`Agent.unregister` this registration."""
        await self.agent.unregister(self)


class Peer:
    """Another agent as this one reaches it: its channel is made on first use,
    and again after a failure if its address is known."""

    def __init__(self, agent: Agent, identity: Identity | None, address: tuple[str, int] | None):
        self.agent = agent
        self.identity = identity
        """Who it is (None until its HELLO when reached by address)."""
        self.address = address
        self._channel: MessageChannel | None = None
        self._connecting: asyncio.Task[MessageChannel] | None = None

    def __repr__(self) -> str:
        who = f"{self.identity.agent:#x}" if self.identity else "?"
        where = "" if self.address is None else f" at {self.address[0]}:{self.address[1]}"
        return f"<Peer agent {who}{where}>"

    @property
    def id(self) -> int | None:
        """The peer agent's id (None until known)."""
        return None if self.identity is None else self.identity.agent

    @property
    def connected(self) -> bool:
        """Whether a working channel to the peer is open now."""
        return self._channel is not None and not self._channel.is_closing()

    async def channel(self) -> MessageChannel:
        """The channel to the peer, connecting (once, however many ask) if needed."""
        if self._channel is not None and not self._channel.is_closing():
            return self._channel
        if self._connecting is None:
            if self.address is None:
                raise ConnectionLostError(f"the connection to {self!r} was lost and it does "
                                          "not listen: it must connect again")  # fmt: skip
            self._connecting = asyncio.ensure_future(self.agent._dial(self))
        task = self._connecting
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and self._connecting is task:
                self._connecting = None
                if task.cancelled() or task.exception() is not None:
                    self.agent._forget(self)  # reached again on its next use

    def _attach(self, channel: MessageChannel, identity: Identity) -> None:
        """Use ``channel`` unless a working one is there (two agents that dial
        each other at once keep both channels, each using its own)."""
        if self._channel is None or self._channel.is_closing():
            self._channel = channel
        self.identity = identity
        if identity.host and self.address is None:
            self.address = (identity.host, identity.port)

    def _drop(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()


class TransferKeywords(TypedDict, total=False):
    """:meth:`~aiordma.transfer.Agent.read`'s and
    :meth:`~aiordma.transfer.Agent.write`'s keyword arguments (for typing ``**``)."""

    notify: bytes | None
    timeout: float | None
    deadline: float | None


class AgentKeywords(TypedDict, total=False):
    """:class:`Agent`'s keyword arguments (for typing ``**``; a host test holds
    the two equal)."""

    device: Device | None
    auth: PresharedKey | bytes | None
    max_exposed: int | None
    piece: int | None
    window: int | None


class Agent:
    """Registered memory, peers, and transfers between them (see the module's docstring).

    ``device``: where memory is registered and connections are made (the
    default device if not given). ``auth``: the key every connection must
    prove, both ways. ``max_exposed``: bytes that may be registered with
    remote access at once (None: no bound). ``piece`` (bytes a work request
    moves at most) and ``window`` (work requests in flight) are chosen by the
    path when None: 1 MiB and 64 to a peer on the same device, 64 KiB and 16
    across a wire. Use :func:`start_agent` to make one that listens.
    """

    def __init__(
        self, *, device: Device | None = None, auth: PresharedKey | bytes | None = None,
        max_exposed: int | None = None, piece: int | None = None, window: int | None = None,
    ) -> None:  # fmt: skip
        for name, value in (("max_exposed", max_exposed), ("piece", piece), ("window", window)):
            if value is not None:
                check_int(name, value)
        if max_exposed is not None and max_exposed < 0:
            raise ValueError(f"max_exposed must be 0 or more bytes, not {max_exposed}")
        self.device = device or Device.shared()
        self.id = secrets.randbits(63) | 1
        """This agent's id (random, never 0)."""
        self._connect = ConnectOptions(device=self.device, auth=auth)
        """How this agent's connections are made: its device, its key (checked now)."""
        self._serving = ServeOptions(device=self.device, auth=auth)
        self._channel_options = ChannelOptions()
        """Its channels' options: the defaults (made once)."""
        self.max_exposed = max_exposed
        if (piece is not None and piece < 4096) or (window is not None and window < 1):
            raise ValueError(f"piece ({piece}) must be at least 4096 bytes, window ({window}) 1 "
                             "or more")  # fmt: skip
        self._piece = piece
        self._window = window
        self._server: Server | None = None
        self._identity = Identity(self.id)
        self._regs: dict[int, Registration] = {}
        """Live registrations, by lkey."""
        self._peers: dict[int, Peer] = {}
        self._by_address: dict[tuple[str, int], Peer] = {}
        self._notes: collections.deque[Notification] = collections.deque()
        self._note_waiters: list[asyncio.Future[None]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._channels: set[MessageChannel] = set()
        """Every channel adopted and not yet closed."""
        self._closing = False
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # made outside a loop: bound to the first that uses it
            self._loop = None
        self._stats = Stats("transfer_agent", self._gauges)
        metrics.watch(self)

    def __repr__(self) -> str:
        where = "" if self._server is None else f" at {self.address}"
        return f"<Agent {self.id:#x}{where} peers={self._live_peers()} regions={len(self._regs)}>"

    # -- memory --------------------------------------------------------------

    @property
    def exposed(self) -> int:
        """Bytes registered with remote access now."""
        return sum(r.mr.length for r in self._regs.values() if r.info.rkey)

    def register(self, obj: Any, *, remote: Access = Access.NONE) -> Registration:
        """Register ``obj``'s memory (any C-contiguous buffer) for transfers.

        Local access only unless ``remote`` (``Access.REMOTE_READ`` and/or
        ``REMOTE_WRITE``) lets peers read or write it. Read-only memory
        (``bytes``, a read-only ``memoryview``) may be a source only:
        written from, or read by peers; a read into it is refused. Raises
        :class:`~aiordma.MemoryLimitError` when that would pass ``max_exposed``.
        """
        self._check_open()
        try:
            with memoryview(obj) as view:
                size, readonly = view.nbytes, view.readonly
        except TypeError:
            raise TypeError(
                f"obj must be a buffer (bytes, bytearray, memoryview, mmap, a numpy "
                f"array...), not {type(obj).__name__}"
            ) from None
        remote = self._exposable(size, remote)
        local = Access.NONE if readonly else Access.LOCAL_WRITE  # read-only: a source only
        return self._registration(self.device.register(obj, local | remote))

    def alloc(self, size: int, *, remote: Access = Access.NONE) -> Registration:
        """Allocate ``size`` page-aligned bytes and :meth:`register` them
        (:class:`~aiordma.MemoryLimitError` naming ``size`` when the system
        has no room for them)."""
        check_int("size", size, 1)
        self._check_open()
        remote = self._exposable(size, remote)
        return self._registration(self.device.alloc(size, Access.LOCAL_WRITE | remote))

    def _exposable(self, size: int, remote: Access) -> Access:
        """``remote`` checked, if ``size`` more bytes may be exposed with it."""
        remote = Access(remote)
        if remote & ~_REMOTE:
            raise ValueError(f"remote= takes Access.REMOTE_READ and REMOTE_WRITE, not {remote!r}")
        if remote and self.max_exposed is not None and self.exposed + size > self.max_exposed:
            raise MemoryLimitError(
                f"registering {size} bytes with {remote!r} would expose {self.exposed + size} "
                f"bytes, more than this agent's max_exposed ({self.max_exposed})",
                size, self.exposed, self.max_exposed,
            )  # fmt: skip
        return remote

    def _registration(self, mr: MemoryRegion) -> Registration:
        reg = Registration(self, mr)
        self._regs[mr.lkey] = reg
        return reg

    async def unregister(self, reg: Registration) -> None:
        """End ``reg``: it leaves the agent at once (new transfers cannot name
        it), and is deregistered as soon as this agent's own transfers using it
        are done (at once if none are): from then on a peer's transfer against
        it fails with :class:`~aiordma.TransferError`, and never reads or
        writes the memory, which is released only after that."""
        self._on_loop()
        if not isinstance(reg, Registration):
            raise TypeError(f"unregister() takes a Registration, not {type(reg).__name__}")
        if self._regs.get(reg.mr.lkey) is not reg:
            if reg.mr.closed:
                return
            raise ValueError(f"{reg!r} is not this agent's")
        del self._regs[reg.mr.lkey]
        await reg.mr.aclose()

    # -- peers ---------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int] | None:
        """Where this agent listens (None: it does not)."""
        if self._identity.host is None:
            return None
        return self._identity.host, self._identity.port

    async def listen(self, host: str, port: int = 0) -> None:
        """Accept other agents' connections at ``host:port`` (0: any free port)."""
        self._on_loop()
        self._check_open()
        if self._server is not None:
            raise RuntimeError("this agent listens already")
        self._server = await serve_channels_with(
            self._accepted, host, port, self._serving, self._channel_options
        )
        bound_port = self._server.addresses[0][1]
        self._identity = Identity(self.id, host, bound_port)

    def metadata(self) -> bytes:
        """Who this agent is and where it listens, for :meth:`peer` in another agent."""
        return self._identity.to_bytes()

    def peer(self, metadata: bytes | bytearray | memoryview) -> Peer:
        """The peer whose :meth:`metadata` this is (connected on first use)."""
        self._check_open()
        if not isinstance(metadata, bytes | bytearray | memoryview):
            raise TypeError(f"peer() takes another agent's metadata() bytes, not "
                            f"{type(metadata).__name__}")  # fmt: skip
        identity = Identity.from_bytes(metadata)
        if identity.agent == self.id:
            raise ValueError("that metadata is this agent's own")
        peer = self._peers.get(identity.agent)
        if peer is None:
            if identity.host is None:
                raise ValueError("that agent does not listen: it must connect to this one")
            peer = self._peers[identity.agent] = Peer(
                self, identity, (identity.host, identity.port)
            )
        return peer

    async def connect(self, host: str, port: int) -> Peer:
        """The peer listening at ``host:port``, connected (reused if it is already)."""
        self._on_loop()
        self._check_open()
        peer = self._by_address.get((host, port))
        if peer is None:
            peer = self._by_address[(host, port)] = Peer(self, None, (host, port))
        await peer.channel()
        return self._by_address.get((host, port), peer)

    async def _dial(self, peer: Peer) -> MessageChannel:
        assert peer.address is not None
        host, port = peer.address
        channel = await open_channel_with(host, port, self._connect, self._channel_options)
        try:
            await channel.send_message(wire.hello(self._identity))
            async with asyncio.timeout(HELLO_TIMEOUT):
                identity = wire.parse(await channel.recv_message())
            if not isinstance(identity, Identity):
                raise ProtocolError("the peer agent did not start with HELLO")
            if peer.identity is not None and identity.agent != peer.identity.agent:
                raise ProtocolError(f"{host}:{port} is agent {identity.agent:#x}, not "
                                    f"{peer.identity.agent:#x}")  # fmt: skip
        except BaseException:
            channel.close()
            raise
        peer = self._adopt(peer, channel, identity)
        task = asyncio.ensure_future(self._serve(peer, channel))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return channel

    async def _accepted(self, channel: MessageChannel) -> None:
        try:
            async with asyncio.timeout(HELLO_TIMEOUT):
                identity = wire.parse(await channel.recv_message())
            if not isinstance(identity, Identity):
                raise ProtocolError("the peer agent did not start with HELLO")
            await channel.send_message(wire.hello(self._identity))
        except (Exception, asyncio.CancelledError):
            channel.close()
            raise
        peer = self._peers.get(identity.agent)
        if peer is None:
            address = (identity.host, identity.port) if identity.host else None
            peer = self._peers[identity.agent] = Peer(self, identity, address)
        peer = self._adopt(peer, channel, identity)
        await self._serve(peer, channel)  # the server's handler lives as long as the channel

    def _adopt(self, peer: Peer, channel: MessageChannel, identity: Identity) -> Peer:
        """Give ``channel`` to the peer ``identity`` names (one Peer per agent)."""
        if self._closing:
            channel.close()
            raise ResourceClosedError("the transfer agent is closed")
        known = self._peers.get(identity.agent)
        if known is not None and known is not peer:  # reached by address, known by metadata
            peer._attach(channel, identity)  # the caller's Peer works too
            peer = known
        self._peers[identity.agent] = peer
        self._channels.add(channel)
        peer._attach(channel, identity)
        if peer.address is not None:
            self._by_address[peer.address] = peer
        return peer

    async def _serve(self, peer: Peer, channel: MessageChannel) -> None:
        """Take the peer's notifications until the channel ends; then see it closed."""
        try:
            await self._take_notes(peer, channel)
        finally:
            channel.close()
            await channel.wait_closed()
            self._channels.discard(channel)
            self._forget(peer, channel)

    def _forget(self, peer: Peer, channel: MessageChannel | None = None) -> None:
        """Let go of ``peer`` once it has no working channel (``channel`` ended,
        or a dial failed): a Peer the application still holds connects again
        on its next use, if its address is known."""
        if channel is not None and peer._channel is channel:
            peer._channel = None
        if peer.connected or (peer._connecting is not None and not peer._connecting.done()):
            return
        if peer.id is not None and self._peers.get(peer.id) is peer:
            del self._peers[peer.id]
        for address in [a for a, known in self._by_address.items() if known is peer]:
            del self._by_address[address]

    def _live_peers(self) -> int:
        return sum(1 for peer in {*self._peers.values(), *self._by_address.values()}
                   if peer.connected)  # fmt: skip

    async def _take_notes(self, peer: Peer, channel: MessageChannel) -> None:
        with contextlib.suppress(ConnectionError, RdmaError):  # the channel ended, however
            async for message in channel:
                note = wire.parse(message)
                if isinstance(note, bytes):
                    self._stats.add("notifications_received")
                    self._notes.append(Notification(peer, note))
                    waiters, self._note_waiters = self._note_waiters, []
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_result(None)

    # -- transfers -----------------------------------------------------------

    async def read(
        self, peer: Peer, local: DescriptorList, remote: DescriptorList, *,
        notify: bytes | None = None, timeout: float | None = None,  # noqa: ASYNC109  (and deadline=)
        deadline: float | None = None,
    ) -> None:  # fmt: skip
        """Read the peer's ``remote`` blocks into this agent's ``local`` ones, pair by pair.

        ``notify``: bytes the peer receives (:meth:`notifications`) once the
        read is done. ``timeout`` (seconds) or ``deadline`` (the loop's
        clock) bound it: past them, or cancelled, posting stops and this
        returns once what was posted has completed, raising ``TimeoutError``
        (or ``CancelledError``). Bad lists raise ValueError before anything
        is posted; a failure on the device raises
        :class:`~aiordma.TransferError` naming the first block that failed.
        """
        await self._transfer(False, peer, local, remote, notify, timeout, deadline)

    async def write(
        self, peer: Peer, local: DescriptorList, remote: DescriptorList, *,
        notify: bytes | None = None, timeout: float | None = None,  # noqa: ASYNC109  (and deadline=)
        deadline: float | None = None,
    ) -> None:  # fmt: skip
        """Write this agent's ``local`` blocks into the peer's ``remote`` ones,
        pair by pair; ``notify`` reaches the peer only after the data is in
        place. Otherwise as :meth:`read`."""
        await self._transfer(True, peer, local, remote, notify, timeout, deadline)

    def start_read(self, peer: Peer, local: DescriptorList, remote: DescriptorList,
                   **keywords: Unpack[TransferKeywords]) -> asyncio.Task[None]:  # fmt: skip
        """:meth:`read` as a task (an awaitable handle), to overlap many transfers."""
        self._on_loop()
        return asyncio.ensure_future(self.read(peer, local, remote, **keywords))

    def start_write(self, peer: Peer, local: DescriptorList, remote: DescriptorList,
                    **keywords: Unpack[TransferKeywords]) -> asyncio.Task[None]:  # fmt: skip
        """:meth:`write` as a task (an awaitable handle), to overlap many transfers."""
        self._on_loop()
        return asyncio.ensure_future(self.write(peer, local, remote, **keywords))

    def _check_local(self, local: DescriptorList, write: bool) -> tuple[MemoryRegion, ...]:
        if not isinstance(local, DescriptorList):
            raise TypeError(f"the local list must be a DescriptorList (from a Registration), "
                            f"not {type(local).__name__}")  # fmt: skip
        if local.remote or local.agent != self.id:
            raise ValueError("the local list must be this agent's own blocks "
                             "(from its registrations)")  # fmt: skip
        mrs = []
        for info in local.regions:
            reg = self._regs.get(info.lkey)
            if reg is None or reg.info.base != info.base or reg.info.length != info.length:
                raise ValueError(f"the local list names memory at {info.base:#x} that this "
                                 "agent has not registered (or unregistered)")  # fmt: skip
            if not write and not reg.mr.access & Access.LOCAL_WRITE:
                raise ValueError(f"the local list names read-only memory at {info.base:#x}: "
                                 "a read cannot land there")  # fmt: skip
            mrs.append(reg.mr)
        return tuple(mrs)

    @staticmethod
    def _check_remote(peer: Peer, remote: DescriptorList, write: bool) -> None:
        if not isinstance(remote, DescriptorList):
            raise TypeError("the remote list must be a DescriptorList (DescriptorList.from_bytes "
                            f"of the peer's bytes), not {type(remote).__name__}")  # fmt: skip
        if not remote.remote:
            raise ValueError("the remote list must be a peer's (DescriptorList.from_bytes)")
        if peer.id is not None and remote.agent != peer.id:
            raise ValueError(f"the remote list is agent {remote.agent:#x}'s memory, "
                             f"not the peer's ({peer.id:#x})")  # fmt: skip
        need = Access.REMOTE_WRITE if write else Access.REMOTE_READ
        for info in remote.regions:
            if not info.access & need:
                raise ValueError(f"the peer's region at {info.base:#x} does not allow "
                                 f"{need.name}")  # fmt: skip

    @staticmethod
    def _check_pairs(local: DescriptorList, remote: DescriptorList) -> None:
        count = len(local)
        if len(remote) != count:
            raise ValueError(f"{count} local blocks cannot pair with {len(remote)} remote ones")
        if not count:
            raise ValueError("the lists are empty: a transfer moves at least one block")
        bad = _plan.mismatch(local.lengths, remote.lengths, count)
        if bad >= 0:
            raise ValueError(f"descriptor {bad}: {local.lengths[bad]} local bytes, "
                             f"{remote.lengths[bad]} remote")  # fmt: skip

    @staticmethod
    def _plan(local: DescriptorList, remote: DescriptorList, piece: int) -> tuple[array[int], int]:
        count = len(local)
        table = bulk_table.new_table(_plan.records_needed(local.lengths, count, piece))
        lkeys = array("I", [r.lkey for r in local.regions])
        rkeys = array("I", [r.rkey for r in remote.regions])
        n = _plan.fill(local.addrs, local.lengths, local.region_of, lkeys,
                       remote.addrs, remote.region_of, rkeys, count, piece, table)  # fmt: skip
        return table, n

    async def _transfer(
        self, write: bool, peer: Peer, local: DescriptorList, remote: DescriptorList,
        notify: bytes | None, timeout: float | None, deadline: float | None,  # noqa: ASYNC109
    ) -> None:  # fmt: skip
        self._on_loop()
        self._check_open()
        if not isinstance(peer, Peer):
            raise TypeError(f"peer must be a Peer (Agent.peer(metadata) or await "
                            f"Agent.connect(host, port)), not {type(peer).__name__}")  # fmt: skip
        if peer.agent is not self:
            raise ValueError(f"{peer!r} is another agent's peer")
        note = _note(notify, "notify")
        timeout = check_seconds("timeout", timeout, expired=True)
        deadline = check_seconds("deadline", deadline, expired=True)
        if timeout is not None and deadline is not None:
            raise ValueError("give timeout= (seconds) or deadline= (the loop's clock), not both")
        loop = asyncio.get_running_loop()
        if timeout is not None:
            deadline = loop.time() + timeout
        elif deadline is not None:
            check_deadline(deadline, loop.time())
        mrs = self._check_local(local, write)
        self._check_remote(peer, remote, write)
        self._check_pairs(local, remote)
        kind = "write" if write else "read"
        try:
            if peer.connected:
                channel = await peer.channel()  # at once
            else:
                async with asyncio.timeout_at(deadline):
                    channel = await peer.channel()
            self._check_remote(peer, remote, write)  # the peer's id is known now
            piece = read_piece_for(self._piece, channel.loopback)
            block = None
            if deadline is None and len(local) == 1 and local.lengths[0] <= piece:
                block = self._post_block(channel, write, local, remote, mrs)
            if block is not None:
                await self._block_done(channel, write, block)
            else:
                table, count = self._plan(local, remote, piece)
                await self._run(channel, write, table, count, mrs, deadline)
        except TimeoutError as exc:
            if exc.args:  # not the deadline's own
                raise
            self._stats.add(f"timeouts:{kind}")
            bound = f"within {timeout} s" if timeout is not None else "by its deadline"
            raise TimeoutError(f"{kind} of {len(local)} blocks ({local.nbytes} bytes) with "
                               f"{peer!r} did not finish {bound}") from None  # fmt: skip
        except asyncio.CancelledError:
            self._stats.add(f"cancelled:{kind}")
            raise
        self._stats.add(f"transfers:{kind}")
        self._stats.add(f"bytes:{kind}", local.nbytes)
        if note is not None:
            await channel.send_message(wire.note(note))
            self._stats.add("notifications_sent")

    @staticmethod
    def _post_block(
        channel: MessageChannel, write: bool, local: DescriptorList, remote: DescriptorList,
        mrs: tuple[MemoryRegion, ...],
    ) -> asyncio.Future[Any] | None:  # fmt: skip
        """A single block of at most one piece, posted as one RDMA write or
        read with no table and no bulk run; None (nothing posted) when the
        queue pair cannot take it now (the bulk run then waits, or says why)."""
        rkey = remote.regions[remote.region_of[0]].rkey
        return post_block(channel, write, mrs[local.region_of[0]], local.addrs[0],
                          local.lengths[0], remote.addrs[0], rkey)  # fmt: skip

    async def _block_done(
        self, channel: MessageChannel, write: bool, block: asyncio.Future[Any]
    ) -> None:
        """Wait for a block of :meth:`_post_block` (for its completion, even
        if cancelled); its failure as the bulk run reports one."""
        what = "write" if write else "read"
        try:
            await asyncio.shield(block)
        except asyncio.CancelledError:
            await _settled(block)
            raise
        except Exception as error:
            self._stats.add(f"failures:{what}")
            channel.close()  # its queue pair is in the error state: the next use reconnects
            raise TransferError(f"{what} failed at descriptor 0: {error}", 0) from error

    async def _run(
        self, channel: MessageChannel, write: bool, table: array[int], count: int,
        mrs: tuple[MemoryRegion, ...], deadline: float | None,
    ) -> None:  # fmt: skip
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        what = "write" if write else "read"

        def finished(error: BaseException | None, tag: int) -> None:
            if done.done():
                return
            if error is None:
                done.set_result(None)
                return
            index = None if tag < 0 else tag
            where = "before its first block" if index is None else f"at descriptor {index}"
            exc = TransferError(f"{what} failed {where}: {error}", index)
            exc.__cause__ = error
            done.set_exception(exc)

        try:
            run = start_bulk(channel, write, table, count, mrs, finished, window=self._window)
        except (ResourceClosedError, ConnectionError) as exc:
            raise TransferError(f"{what} failed before its first block: {exc}") from exc
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.shield(done)
        except TransferError:
            self._stats.add(f"failures:{what}")
            channel.close()  # its queue pair is in the error state: the next use reconnects
            raise
        except BaseException:
            run.cancel()
            await _settled(done)
            raise

    # -- notifications -------------------------------------------------------

    async def next_notification(self, data: bytes | None = None, *,
                                timeout: float | None = None) -> Notification:  # fmt: skip  # noqa: ASYNC109
        """The first notification received and not yet taken (the first equal to
        ``data`` if given), waiting for it if none is there; ``TimeoutError``
        after ``timeout`` seconds, naming what was awaited."""
        self._on_loop()
        wanted = _note(data, "data")
        timeout = check_seconds("timeout", timeout, expired=True)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    for note in self._notes:
                        if wanted is None or note.data == wanted:
                            self._notes.remove(note)
                            return note
                    self._check_open()
                    waiter = asyncio.get_running_loop().create_future()
                    self._note_waiters.append(waiter)
                    await waiter
        except TimeoutError as exc:
            if exc.args:
                raise
            what = "no notification" if wanted is None else f"no notification {wanted!r}"
            raise TimeoutError(f"{what} arrived within {timeout} s") from None

    async def notifications(self) -> AsyncIterator[Notification]:
        """Every notification, in the order received (per peer: the order sent)."""
        while True:
            yield await self.next_notification()

    # -- state ---------------------------------------------------------------

    def _gauges(self) -> dict[str, int]:
        registered = sum(r.mr.length for r in self._regs.values())
        return {"exposed_bytes": self.exposed, "registered_bytes": registered,
                "peers": self._live_peers()}  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """What this agent did, as plain data (see :mod:`aiordma.metrics`):
        transfers and bytes each way, failures, notifications; registered and
        exposed bytes and peers now."""
        return self._stats.snapshot()

    def _metric_sources(self) -> Any:
        yield {"agent": f"{self.id:x}"}, self._stats

    def _check_open(self) -> None:
        if self._closing:
            raise ResourceClosedError("the transfer agent is closed")

    def _on_loop(self) -> None:
        """WrongLoopError unless called from this agent's loop (the first that used it)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        else:
            check_loop(self._loop)

    def is_closing(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closing

    def close(self) -> None:
        """Stop listening, close every peer's channel and deregister the memory
        once nothing uses it (see :meth:`wait_closed`)."""
        if self._closing:
            return
        self._closing = True
        metrics.unwatch(self)
        if self._server is not None:
            self._server.close()
        for peer in {*self._peers.values(), *self._by_address.values()}:
            peer._drop()
        for channel in self._channels:
            channel.close()
        waiters, self._note_waiters = self._note_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(ResourceClosedError("the transfer agent is closed"))

    async def wait_closed(self) -> None:
        """Wait until the channels are closed and the memory deregistered."""
        if self._server is not None:
            await self._server.wait_closed()
        for peer in {*self._peers.values(), *self._by_address.values()}:
            if peer._connecting is not None:
                peer._connecting.cancel()
                with contextlib.suppress(BaseException):
                    await peer._connecting
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for channel in list(self._channels):
            await channel.wait_closed()
        regs, self._regs = list(self._regs.values()), {}
        for reg in regs:
            await reg.mr.aclose()

    async def aclose(self) -> None:
        """:meth:`close`, then :meth:`wait_closed`."""
        self.close()
        await self.wait_closed()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.wait_closed()


def _note(value: bytes | bytearray | memoryview | None, name: str) -> bytes | None:
    """A notification's bytes; TypeError naming ``name`` for anything but bytes-like."""
    if value is None:
        return None
    check_bytes_like(name, value)
    return bytes(value)


async def _settled(done: asyncio.Future[Any]) -> None:
    """Wait for ``done`` however often the caller is cancelled meanwhile (the
    device is still using the buffers); then let the cancellation go on."""
    cancelled = False
    while not done.done():
        try:
            await asyncio.wait([done])
        except asyncio.CancelledError:
            cancelled = True
    if not done.cancelled():
        done.exception()  # seen: the caller's own error (cancel, timeout) wins
    if cancelled:
        raise asyncio.CancelledError


async def start_agent(
    host: str | None = None, port: int = 0, **keywords: Unpack[AgentKeywords]
) -> Agent:
    """An :class:`Agent` (``keywords`` are its own), listening at
    ``host:port`` if ``host`` is given."""
    agent = Agent(**keywords)
    if host is not None:
        try:
            await agent.listen(host, port)
        except BaseException:
            agent.close()
            await agent.wait_closed()
            raise
    return agent
