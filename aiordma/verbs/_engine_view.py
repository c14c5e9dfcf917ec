"""What the work engine offers the compiled posters it makes (type checking only).

A packet lane (``_lane.py``) and a bulk run (``_bulk.py``) each hold the
work engine that made them through these Protocols, so neither imports
the engine (which imports them).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from aiordma.verbs._driver.base import QPDriver
from aiordma.verbs._room import QueueRoom


class Completions(Protocol):
    """The completion queue, as a poster sees it."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def handlers(self) -> dict[int, Any]: ...

    @property
    def polls(self) -> bool: ...

    @property
    def expects(self) -> bool: ...

    def kick(self) -> None: ...

    def expect(self) -> None: ...

    def claim_ids(self, count: int) -> int: ...


class EngineView(Protocol):
    """What every poster needs of the work engine that made it."""

    @property
    def driver(self) -> QPDriver: ...

    @property
    def cq(self) -> Completions: ...

    @property
    def sq(self) -> QueueRoom: ...

    def close_error(self) -> BaseException: ...

    def poster_idle(self) -> None: ...
