"""rdma_cm on the event loop: one event channel per loop, events routed to their cm_id.

The channel's descriptor is non-blocking and registered with ``add_reader``;
when it is readable every pending event is read, copied, acknowledged at once
(so destroying a cm_id never waits on an unacknowledged event) and handed to
the :class:`CMId` it belongs to. A connection request creates the new cm_id
(it shares the listener's channel) before it reaches the listener. The
channel closes itself when its last cm_id is destroyed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Final

from aiordma.cm import _rdmacm
from aiordma.cm._rdmacm import Event, EventType
from aiordma.exceptions import ResourceClosedError, WrongLoopError

log = logging.getLogger(__name__)

EventHandler = Callable[[Event, "CMId | None"], None]
"""Called with an event and, for a connection request, the requesting cm_id."""


class CMEventChannel:
    """The rdma_cm event channel of one event loop."""

    _by_loop: dict[asyncio.AbstractEventLoop, CMEventChannel] = {}  # noqa: RUF012

    @classmethod
    def for_running_loop(cls) -> CMEventChannel:
        loop = asyncio.get_running_loop()
        channel = cls._by_loop.get(loop)
        if channel is None or channel.closed:
            for stale in [lp for lp in cls._by_loop if lp.is_closed()]:
                cls._by_loop.pop(stale).close()
            channel = cls._by_loop[loop] = cls(loop)
        return channel

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._channel: _rdmacm.EventChannel | None = _rdmacm.EventChannel()
        self._ids: dict[int, CMId] = {}
        fd = self._channel.fd
        try:
            os.set_blocking(fd, False)
            loop.add_reader(fd, self._on_readable)
        except BaseException:
            self._channel.close()
            raise

    @property
    def closed(self) -> bool:
        return self._channel is None

    def create_id(self) -> CMId:
        """A new cm_id whose events this channel delivers."""
        if self._channel is None:
            raise ResourceClosedError("rdma_cm event channel is closed")
        return self._adopt(self._channel.create_id())

    def _adopt(self, ptr: int) -> CMId:
        cm_id = CMId(self, ptr)
        self._ids[ptr] = cm_id
        return cm_id

    def _on_readable(self) -> None:
        self.read_pending()

    def read_pending(self) -> None:
        """Read and route every event the kernel has queued (a busy loop may
        not have got to them yet: a deadline checks here before it expires)."""
        while self._channel is not None:
            try:
                event = self._channel.get_event()
            except OSError:
                log.exception("reading rdma_cm events failed")
                return
            if event is None:
                return
            self._dispatch(event)

    def _dispatch(self, event: Event) -> None:
        log.debug("rdma_cm %s status=%d id=%#x", event.name, event.status, event.id)
        if event.type == EventType.CONNECT_REQUEST:
            listener = self._ids.get(event.listen_id)
            child = self._adopt(event.id)
            if listener is None:
                log.warning("connection request for an unknown listener: rejected")
                child.reject(b"")
                child.destroy()
                return
            listener._deliver(event, child)
            return
        target = self._ids.get(event.id)
        if target is None:
            log.warning("rdma_cm %s for an unknown cm_id ignored", event.name)
            return
        target._deliver(event, None)

    def _forget(self, ptr: int) -> None:
        self._ids.pop(ptr, None)
        if not self._ids:
            self.close()

    def close(self) -> None:
        """Unregister and destroy the channel (its cm_ids must be gone)."""
        channel, self._channel = self._channel, None
        if channel is None:
            return
        if not self.loop.is_closed():
            with contextlib.suppress(RuntimeError, ValueError, OSError):
                self.loop.remove_reader(channel.fd)
        channel.close()
        if CMEventChannel._by_loop.get(self.loop) is self:
            del CMEventChannel._by_loop[self.loop]


class CMId:
    """One rdma_cm identifier: a listener, or one side of a connection.

    Events are queued for :meth:`next_event` until a ``handler`` is set,
    after which the handler receives them as they arrive.
    """

    def __init__(self, channel: CMEventChannel, ptr: int) -> None:
        self.channel = channel
        self.ptr: int | None = ptr
        self.handler: EventHandler | None = None
        self._backlog: collections.deque[tuple[Event, CMId | None]] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<CMId {self.ptr:#x}>" if self.ptr else "<CMId destroyed>"

    @property
    def id(self) -> int:
        if self.ptr is None:
            raise ResourceClosedError("rdma_cm id is destroyed")
        return self.ptr

    def set_handler(self, handler: EventHandler) -> None:
        """Deliver events to ``handler`` from now on, starting with any still queued."""
        self.handler = handler
        while self._backlog and self.handler is handler:
            handler(*self._backlog.popleft())

    def _deliver(self, event: Event, child: CMId | None) -> None:
        if self.handler is not None:
            self.handler(event, child)
            return
        self._backlog.append((event, child))
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_event(self) -> tuple[Event, CMId | None]:
        """The next event not yet consumed (waits for one)."""
        if asyncio.get_running_loop() is not self.channel.loop:
            raise WrongLoopError("this rdma_cm id belongs to another event loop")
        while not self._backlog:
            self._waiter = self.channel.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._backlog.popleft()

    def reject(self, private_data: bytes) -> None:
        _rdmacm.reject(self.id, private_data)

    def destroy(self) -> None:
        """Destroy the cm_id (idempotent). Nothing is delivered to it afterwards."""
        ptr, self.ptr = self.ptr, None
        if ptr is None:
            return
        self.handler = None
        self._backlog.clear()
        try:
            _rdmacm.destroy_id(ptr)
        finally:
            self.channel._forget(ptr)

    @property
    def device_name(self) -> str | None:
        return _rdmacm.device_name(self.id)

    @property
    def local_address(self) -> tuple[str, int]:
        return _rdmacm.local_addr(self.id)

    @property
    def peer_address(self) -> tuple[str, int]:
        return _rdmacm.peer_addr(self.id)


_RELEASE_DELAYS: Final = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


def release_removed_device(name: str) -> None:
    """Make librdmacm drop its context on the removed device ``name``.

    librdmacm notices a removal only when it re-reads the device list, and
    the device leaves that list only after rdma_cm has finished with it. So
    the list is re-read a few times with growing delays (about 9 s in all)
    until ``name`` is gone.
    """
    loop = asyncio.get_running_loop()

    def attempt(step: int) -> None:
        names = _rdmacm.device_names()
        if names is not None and name not in names:
            log.debug("librdmacm released removed device %s", name)
            return
        if step + 1 < len(_RELEASE_DELAYS):
            loop.call_later(_RELEASE_DELAYS[step + 1], attempt, step + 1)
        else:
            log.warning(
                "librdmacm still holds removed device %s (it cannot let go of the last "
                "device); its removal completes when this process exits",
                name,
            )

    loop.call_later(_RELEASE_DELAYS[0], attempt, 0)
