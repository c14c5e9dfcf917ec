"""Argument checks every layer shares: a ``TypeError`` or ``ValueError``
naming the argument, raised where a value is made, never a failure later.

Pure functions, no I/O: each layer's options (queue pair, connection,
channel, RPC, transfer) call them from ``__post_init__`` or at its public
edge.
"""

from __future__ import annotations

import math
from typing import Any


def check_type(name: str, value: object, kind: type | tuple[type, ...], wanted: str) -> None:
    """TypeError unless ``value`` is a ``kind``; ``wanted`` says what was
    expected (``"an aiordma.ConnectOptions"``), the message what was given."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be {wanted}, not {_kind(value)}")


def check_int(name: str, value: object, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int (anything with ``__index__``, never a bool):
    TypeError otherwise, ValueError outside ``low``..``high`` (inclusive)."""
    if not hasattr(type(value), "__index__") or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {_kind(value)}")
    number: int = value.__index__()  # type: ignore[attr-defined]
    if low is not None and number < low:
        raise ValueError(f"{name} must be at least {low}, not {number}")
    if high is not None and number > high:
        raise ValueError(f"{name} must be at most {high}, not {number}")
    return number


def check_seconds(
    name: str, value: object, *, zero: bool = True, expired: bool = False, bound: bool = True
) -> float | None:
    """``value`` as seconds: None (no bound) stays None, and so does infinity
    when None is allowed (``bound=False`` refuses both: a bound is needed).

    TypeError unless a real number; ValueError for NaN, and for a negative
    number (or zero, unless ``zero``) unless ``expired`` (a timeout of 0
    or less has expired already, as for :func:`asyncio.timeout`).
    """
    if value is None:
        if bound:
            return None
        raise TypeError(f"{name} must be a number of seconds, not None")
    if not isinstance(value, int | float) or isinstance(value, bool):
        either = " or None" if bound else ""
        raise TypeError(f"{name} must be a number of seconds{either}, not {_kind(value)}")
    if math.isnan(value):
        raise ValueError(f"{name} must be a number of seconds, not NaN")
    if math.isinf(value) and value > 0:
        if bound:
            return None
        raise ValueError(f"{name} must be a finite number of seconds, not {value}")
    if not expired and (value < 0 or (value == 0 and not zero)):
        rule = "must not be negative" if zero else "must be positive"
        raise ValueError(f"{name} {rule}, not {value}")
    return float(value)


def _kind(value: Any) -> str:
    return "None" if value is None else type(value).__name__


DEADLINE_HORIZON = 1e8
"""Seconds ahead (about three years) beyond which a ``deadline=`` on the
loop's clock is taken for a wall-clock time (``time.time()``) and refused."""


def check_deadline(deadline: float, now: float) -> None:
    """ValueError if ``deadline`` (on the loop's clock, whose time is ``now``)
    is further ahead than any real bound: a wall-clock time given by mistake."""
    if deadline - now > DEADLINE_HORIZON:
        raise ValueError(
            f"deadline={deadline} is {deadline - now:.3g} s ahead of the event loop's "
            f"clock (loop.time() is {now:.3f} now): deadlines are on that clock, not "
            "time.time(); give loop.time() + seconds, or timeout=seconds"
        )


def check_bytes_like(name: str, value: object) -> None:
    """TypeError unless ``value`` is ``bytes``, a ``bytearray`` or a ``memoryview``
    (a ``str`` is told to encode itself)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return
    if isinstance(value, str):
        raise TypeError(f"{name} must be bytes, not str: encode it ({name}={value!r}.encode())")
    raise TypeError(f"{name} must be bytes (or a bytearray or memoryview), not {_kind(value)}")
