"""Layer 1: verbs resources on the event loop.

Devices, memory regions and windows, completion queues whose channel is on
the running loop, queue pairs whose verbs are coroutines, shared receive
queues. Nothing here knows rdma_cm or messages; ``_driver`` is the compile
boundary (the C core or pyverbs), chosen once.
"""

from aiordma.verbs._closing import Closable

Closable.__module__ = __name__  # documented, and linked as a base, from here
__all__ = ["Closable", "per_message_path"]


def per_message_path() -> str:
    """Which per-message path runs: the compiled core, or pure Python and why."""
    from aiordma.verbs import _driver

    return _driver.path
