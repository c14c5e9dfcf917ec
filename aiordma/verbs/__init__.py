"""Layer 1: verbs resources on the event loop.

Devices, memory regions and windows, completion queues whose channel is on
the running loop, queue pairs whose verbs are coroutines, shared receive
queues. Nothing here knows rdma_cm or messages; ``_driver`` is the compile
boundary (the C core or pyverbs), chosen once.
"""

__all__ = ["per_message_path"]


def per_message_path() -> str:
    """Which per-message path runs: compiled (the driver core and the
    per-message modules), or pure Python, and why."""
    from aiordma import _compiled
    from aiordma.verbs import _driver

    if _driver.core is None:
        return _driver.path
    built, total = len(_compiled.compiled), len(_compiled.MODULES)
    if built == total:
        modules = f" and {total} per-message module{'s' * (total != 1)}" if total else ""
        return f"compiled (aiordma.verbs._driver._core{modules})"
    why = f"stale build: {_driver.REBUILD}" if _compiled.stale else "not built"
    return f"{_driver.path}; {total - built} of {total} per-message modules interpreted ({why})"
