"""An event loop of its own in a daemon thread, for callers that are not async.

Ray calls a transport from its own threads, synchronously; aiordma's agents
live on an event loop. Each process keeps one loop thread, and every call
hops onto it (:meth:`LoopThread.submit`) and waits for the answer in the
calling thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def default_loop_factory() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed, asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class LoopThread:
    """A running event loop in a daemon thread: start, submit coroutines, close.

    Contract: ``submit`` from any thread but the loop's own; ``close`` once.
    """

    def __init__(
        self,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
        name: str = "aiordma-loop",
    ) -> None:
        self.loop = (loop_factory or default_loop_factory)()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        self.loop.run_forever()

    @property
    def native_id(self) -> int | None:
        """The thread's id in the kernel (``/proc/<pid>/task/<id>``)."""
        return self._thread.native_id

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its result (or error) in a future of this thread's kind."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("the loop thread cannot wait for itself")
        if self.loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise RuntimeError("this loop thread is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result here."""
        return self.submit(coro).result()

    def close(self) -> None:
        """Stop the loop (after its running callbacks), join the thread, close the loop."""
        if not self._thread.is_alive():
            return

        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        asyncio.run_coroutine_threadsafe(drain(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
