"""Other agents as one agent reaches them: one message channel each, made on
first use and made again after a failure.

:class:`Peer` is what an application holds; :class:`Peers` is the agent's
directory of them: it dials, accepts, greets (HELLO both ways), adopts a
channel for the peer it names, takes the peer's notifications while the
channel lasts, and forgets a peer once it has no working channel.

Call order of one channel: ``dial | accept -> HELLO both ways -> adopt ->
notes* -> ended -> forget``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from aiordma.channel import ChannelOptions, ConnectOptions, MessageChannel, open_channel_with
from aiordma.exceptions import ConnectionLostError, ProtocolError, RdmaError, ResourceClosedError
from aiordma.transfer import wire
from aiordma.transfer.wire import Identity

HELLO_TIMEOUT = 10.0
"""Seconds a new connection's peer has to say who it is."""


class Peer:
    """Another agent as this one reaches it (:meth:`Agent.peer
    <aiordma.transfer.Agent.peer>`, :meth:`Agent.connect
    <aiordma.transfer.Agent.connect>`, or a :class:`Notification
    <aiordma.transfer.Notification>`'s sender): its channel is made on first
    use, and again after a failure if its address is known."""

    def __init__(self, directory: Peers, identity: Identity | None,
                 address: tuple[str, int] | None) -> None:  # fmt: skip
        self._directory = directory
        self.identity = identity
        """Who it is (None until its HELLO when reached by address)."""
        self.address = address
        """Where it listens (None: it does not, so only it can connect again)."""
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
            self._connecting = asyncio.ensure_future(self._directory.dial(self))
        task = self._connecting
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and self._connecting is task:
                self._connecting = None
                if task.cancelled() or task.exception() is not None:
                    self._directory.forget(self)  # reached again on its next use

    def close(self) -> None:
        """Close the channel to the peer now: transfers on it fail, the peer
        sees its channel end, and the next use connects again (if the
        peer's address is known)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def _attach(self, channel: MessageChannel, identity: Identity) -> None:
        """Use ``channel`` unless a working one is there (two agents that dial
        each other at once keep both channels, each using its own)."""
        if self._channel is None or self._channel.is_closing():
            self._channel = channel
        self.identity = identity
        if identity.host and self.address is None:
            self.address = (identity.host, identity.port)


class Peers:
    """One agent's peers, by id and by address, and the channels it adopted.

    ``connect`` and ``options``: how its channels are made; ``on_note(peer,
    data)``: what receives a peer's notification. :attr:`identity` is what
    the agent says in its HELLO (its id, and where it listens once it does).
    """

    def __init__(self, agent: int, connect: ConnectOptions, options: ChannelOptions,
                 on_note: Callable[[Peer, bytes], None]) -> None:  # fmt: skip
        self.identity = Identity(agent)
        self._connect = connect
        self._options = options
        self._on_note = on_note
        self._by_id: dict[int, Peer] = {}
        self._by_address: dict[tuple[str, int], Peer] = {}
        self._channels: set[MessageChannel] = set()
        """Every channel adopted and not yet closed."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    def owns(self, peer: Peer) -> bool:
        """Whether ``peer`` is one of these (not another agent's)."""
        return peer._directory is self

    def known(self) -> int:
        """Peers held now, connected or not (forgotten ones are not)."""
        return len({*self._by_id.values(), *self._by_address.values()})

    def live(self) -> int:
        """Peers with a working channel now."""
        return sum(1 for peer in {*self._by_id.values(), *self._by_address.values()}
                   if peer.connected)  # fmt: skip

    def named(self, identity: Identity) -> Peer:
        """The peer ``identity`` names (made if new; ValueError if it does not listen)."""
        peer = self._by_id.get(identity.agent)
        if peer is None:
            if identity.host is None:
                raise ValueError("that agent does not listen: it must connect to this one")
            peer = self._by_id[identity.agent] = Peer(self, identity,
                                                      (identity.host, identity.port))  # fmt: skip
        return peer

    async def connect(self, host: str, port: int) -> Peer:
        """The peer listening at ``host:port``, connected (reused if it is already)."""
        peer = self._by_address.get((host, port))
        if peer is None:
            peer = self._by_address[(host, port)] = Peer(self, None, (host, port))
        await peer.channel()
        return self._by_address.get((host, port), peer)

    async def dial(self, peer: Peer) -> MessageChannel:
        """A new channel to ``peer``'s address, greeted and adopted."""
        assert peer.address is not None
        host, port = peer.address
        channel = await open_channel_with(host, port, self._connect, self._options)
        try:
            await channel.send_message(wire.hello(self.identity))
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

    async def accepted(self, channel: MessageChannel) -> None:
        """The listener's handler: greet, adopt, then serve as long as the channel."""
        try:
            async with asyncio.timeout(HELLO_TIMEOUT):
                identity = wire.parse(await channel.recv_message())
            if not isinstance(identity, Identity):
                raise ProtocolError("the peer agent did not start with HELLO")
            await channel.send_message(wire.hello(self.identity))
        except (Exception, asyncio.CancelledError):
            channel.close()
            raise
        peer = self._by_id.get(identity.agent)
        if peer is None:
            address = (identity.host, identity.port) if identity.host else None
            peer = self._by_id[identity.agent] = Peer(self, identity, address)
        peer = self._adopt(peer, channel, identity)
        await self._serve(peer, channel)

    def _adopt(self, peer: Peer, channel: MessageChannel, identity: Identity) -> Peer:
        """Give ``channel`` to the peer ``identity`` names (one Peer per agent)."""
        if self._closing:
            channel.close()
            raise ResourceClosedError("the transfer agent is closed")
        known = self._by_id.get(identity.agent)
        if known is not None and known is not peer:  # reached by address, known by metadata
            peer._attach(channel, identity)  # the caller's Peer works too
            peer = known
        self._by_id[identity.agent] = peer
        self._channels.add(channel)
        peer._attach(channel, identity)
        if peer.address is not None:
            self._by_address[peer.address] = peer
        return peer

    async def _serve(self, peer: Peer, channel: MessageChannel) -> None:
        """Take the peer's notifications until the channel ends; then see it closed."""
        try:
            with contextlib.suppress(ConnectionError, RdmaError):  # the channel ended, however
                async for message in channel:
                    note = wire.parse(message)
                    if isinstance(note, bytes):
                        self._on_note(peer, note)
        finally:
            channel.close()
            await channel.wait_closed()
            self._channels.discard(channel)
            self.forget(peer, channel)

    def forget(self, peer: Peer, channel: MessageChannel | None = None) -> None:
        """Let go of ``peer`` once it has no working channel (``channel`` ended,
        or a dial failed): a Peer the application still holds connects again
        on its next use, if its address is known."""
        if channel is not None and peer._channel is channel:
            peer._channel = None
        if peer.connected or (peer._connecting is not None and not peer._connecting.done()):
            return
        if peer.id is not None and self._by_id.get(peer.id) is peer:
            del self._by_id[peer.id]
        for address in [a for a, known in self._by_address.items() if known is peer]:
            del self._by_address[address]

    def close(self) -> None:
        """Close every peer's channel; adopt no more."""
        self._closing = True
        for peer in {*self._by_id.values(), *self._by_address.values()}:
            peer.close()
        for channel in self._channels:
            channel.close()

    async def wait_closed(self) -> None:
        """Wait until dials, the notes tasks and the channels are done."""
        for peer in {*self._by_id.values(), *self._by_address.values()}:
            if peer._connecting is not None:
                peer._connecting.cancel()
                with contextlib.suppress(BaseException):
                    await peer._connecting
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for channel in list(self._channels):
            await channel.wait_closed()
