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
    if (low is not None and number < low) or (high is not None and number > high):
        if high is None:
            rule = f"at least {low}"
        elif low is None:
            rule = f"at most {high}"
        else:
            rule = f"from {low} to {high}"
        raise ValueError(f"{name} must be {rule}, not {number}")
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
