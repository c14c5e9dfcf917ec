"""The transfer agent: registered memory as descriptor lists, and awaited one-sided transfers.

An :class:`Agent` registers memory (:meth:`Agent.register`,
:meth:`Agent.alloc`: :mod:`~aiordma.transfer.registration`), hands out its
blocks as :class:`~aiordma.transfer.DescriptorList` s, reaches other agents
by address or by their metadata (:mod:`~aiordma.transfer.peers`: one
message channel each, made on first use and again after a failure), and
moves a whole list of local blocks to or from a peer's blocks in one await
(:meth:`Agent.read`, :meth:`Agent.write`; :mod:`~aiordma.transfer.runs`). A
transfer may carry a notification that the peer receives once the data is
in place (:meth:`Agent.notifications`).

Call order of a transfer: ``check lists -> connect (first use) -> run ->
[NOTE]``; cancelled or past its deadline, it stops posting and returns once
what was posted has completed.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from aiordma import metrics
from aiordma._checks import check_bytes_like, check_deadline, check_int, check_seconds
from aiordma.channel import (
    Access,
    ChannelOptions,
    ConnectOptions,
    Device,
    MemoryRegion,
    PresharedKey,
    ServeOptions,
    Server,
    start_channel_server_with,
)
from aiordma.exceptions import MemoryLimitError, ResourceClosedError
from aiordma.lifecycle import check_loop, check_thread
from aiordma.metrics import Stats
from aiordma.transfer import runs, wire
from aiordma.transfer.descriptors import DescriptorList
from aiordma.transfer.peers import Peer, Peers
from aiordma.transfer.registration import REMOTE as _REMOTE
from aiordma.transfer.registration import Registration
from aiordma.transfer.wire import Identity

if TYPE_CHECKING:
    from typing_extensions import Unpack


@dataclass(frozen=True, slots=True)
class Notification:
    """Bytes a peer sent with a transfer, delivered once its data was in place."""

    peer: Peer
    data: bytes


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
        self._serving = ServeOptions(device=self.device, auth=auth)
        self._channel_options = ChannelOptions()
        """Its channels' options: the defaults (made once)."""
        self._peers = Peers(self.id, ConnectOptions(device=self.device, auth=auth),
                            self._channel_options, self._noted)  # fmt: skip
        """Its peers: how they are reached (its device, its key: checked now)."""
        self.max_exposed = max_exposed
        if (piece is not None and piece < 4096) or (window is not None and window < 1):
            raise ValueError(f"piece ({piece}) must be at least 4096 bytes, window ({window}) 1 "
                             "or more")  # fmt: skip
        self._piece = piece
        self._window = window
        self._server: Server | None = None
        self._regs: dict[int, Registration] = {}
        """Live registrations, by lkey."""
        self._notes: collections.deque[Notification] = collections.deque()
        self._note_waiters: list[asyncio.Future[None]] = []
        self._closing = False
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # made outside a loop: bound to the first that uses it
            self._loop = None
        self._stats = Stats("transfer_agent", self._gauges)
        metrics.watch(self)

    def __repr__(self) -> str:
        where = "" if self._server is None else f" at {self.address}"
        return f"<Agent {self.id:#x}{where} peers={self._peers.live()} regions={len(self._regs)}>"

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

    # -- peers (transfer/peers.py) ---------------------------------------------

    @property
    def address(self) -> tuple[str, int] | None:
        """Where this agent listens (None: it does not)."""
        identity = self._peers.identity
        return None if identity.host is None else (identity.host, identity.port)

    async def listen(self, host: str, port: int = 0) -> None:
        """Accept other agents' connections at ``host:port`` (0: any free port)."""
        self._on_loop()
        self._check_open()
        if self._server is not None:
            raise RuntimeError("this agent listens already")
        self._server = await start_channel_server_with(
            self._peers.accepted, host, port, self._serving, self._channel_options
        )
        bound_port = self._server.addresses[0][1]
        self._peers.identity = Identity(self.id, host, bound_port)

    def metadata(self) -> bytes:
        """Who this agent is and where it listens, for :meth:`peer` in another agent."""
        return self._peers.identity.to_bytes()

    def peer(self, metadata: bytes | bytearray | memoryview) -> Peer:
        """The peer whose :meth:`metadata` this is (connected on first use)."""
        self._check_open()
        if not isinstance(metadata, bytes | bytearray | memoryview):
            raise TypeError(f"peer() takes another agent's metadata() bytes, not "
                            f"{type(metadata).__name__}")  # fmt: skip
        identity = Identity.from_bytes(metadata)
        if identity.agent == self.id:
            raise ValueError("that metadata is this agent's own")
        return self._peers.named(identity)

    async def connect(self, host: str, port: int) -> Peer:
        """The peer listening at ``host:port``, connected (reused if it is already)."""
        self._on_loop()
        self._check_open()
        return await self._peers.connect(host, port)

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
        need = Access.REMOTE_WRITE if write else Access.REMOTE_READ
        remote.check_remote(peer.id, int(need), str(need.name))

    async def _transfer(
        self, write: bool, peer: Peer, local: DescriptorList, remote: DescriptorList,
        notify: bytes | None, timeout: float | None, deadline: float | None,  # noqa: ASYNC109
    ) -> None:  # fmt: skip
        self._on_loop()
        self._check_open()
        if not isinstance(peer, Peer):
            raise TypeError(f"peer must be a Peer (Agent.peer(metadata) or await "
                            f"Agent.connect(host, port)), not {type(peer).__name__}")  # fmt: skip
        if not self._peers.owns(peer):
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
        local.check_pairs(remote)
        kind = "write" if write else "read"
        try:
            if peer.connected:
                channel = await peer.channel()  # at once
            else:
                async with asyncio.timeout_at(deadline):
                    channel = await peer.channel()
            self._check_remote(peer, remote, write)  # the peer's id is known now
            await runs.run(channel, write, local, remote, mrs, self._piece, self._window,
                           deadline, self._stats)  # fmt: skip
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

    # -- notifications -------------------------------------------------------

    def _noted(self, peer: Peer, data: bytes) -> None:
        """A peer's notification arrived (its channel's notes task calls this)."""
        self._stats.add("notifications_received")
        self._notes.append(Notification(peer, data))
        waiters, self._note_waiters = self._note_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

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
                "peers": self._peers.live(), "known_peers": self._peers.known()}  # fmt: skip

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
        check_thread(self._loop, "Agent.close()")
        self._closing = True
        metrics.unwatch(self)
        if self._server is not None:
            self._server.close()
        self._peers.close()
        waiters, self._note_waiters = self._note_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(ResourceClosedError("the transfer agent is closed"))

    async def wait_closed(self) -> None:
        """Wait until the channels are closed and the memory deregistered."""
        if self._server is not None:
            await self._server.wait_closed()
        await self._peers.wait_closed()
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
