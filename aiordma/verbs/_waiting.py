"""How a completion queue waits: spin a while before sleeping, or sleep at once.

Pure logic, no verbs: :class:`Polling` is the setting (``auto``, ``off`` or a
fixed window), :class:`WaitPolicy` is ``auto``'s decision for one CQ.

``auto`` spins only where an answer is expected soon: after a two-sided
send is posted (a request whose reply will arrive, or a reply after which
the next request may come), never for one-sided work, and never when the
process has one usable CPU (the spinner would take it from the device's
own work on a software device, and from the peer on a shared core). Each
expectation is either a *hit* (a receive completion arrived while
spinning) or a *miss* (the window ran out). Only hits are measured, so a
miss that woke through the slow path never inflates the window (the
"latency shelving" trap of estimators fed with overslept samples):

- a hit trims the window to twice the running mean of the waits that hit
  (at least :data:`FLOOR`, at most the cap);
- a miss at a trimmed window tries the cap on the next expectation;
- a miss at the cap stops spinning for the next ``2**k - 1``
  expectations (``k`` counts misses in a row, up to :data:`MAX_BACKOFF`),
  then probes at the cap again; a hit ends the backoff.

So a ping-pong whose answers come within the cap spins on both sides,
while a paced or idle exchange probes once in up to 128 expectations.
Call order: ``start -> (hit | miss)``, per expectation.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["AUTO_CAP", "DEFAULT", "FLOOR", "MAX_BACKOFF", "Polling", "WaitPolicy", "usable_cpus"]

AUTO_CAP: Final = 300e-6
"""Seconds ``auto`` spins at most for one expected answer: a little more
than a 64 B round trip between two spinning peers on Soft-RoCE (record 0019)."""
FLOOR: Final = 50e-6
"""The shortest window ``auto`` trims to."""
MAX_BACKOFF: Final = 7
"""After this many misses in a row ``auto`` probes once in ``2**7`` expectations."""
_EWMA_WEIGHT: Final = 1 / 8

Mode = Literal["auto", "off", "fixed"]


@dataclass(frozen=True)
class Polling:
    """How completion queues wait for completions (``AIORDMA_POLL`` or
    :func:`aiordma.verbs.completion.set_polling`).

    ``auto`` spins up to ``window`` seconds where an answer is expected soon
    and learns per queue when that pays; ``off`` (the default, see
    ``DEFAULT``) always arms the channel and sleeps; ``fixed`` polls for
    ``window`` seconds after any post or completion, whatever the work.
    """

    mode: Mode = "auto"
    window: float = AUTO_CAP
    """Seconds: the longest spin of ``auto``, the window of ``fixed``."""

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "off", "fixed"):
            raise ValueError(f"polling mode must be 'auto', 'off' or 'fixed', not {self.mode!r}")
        window = self.window
        if isinstance(window, bool) or not isinstance(window, int | float):
            raise TypeError(f"polling window must be a number of seconds, not {window!r}")
        if not 0 <= window < math.inf:
            raise ValueError(f"polling window must be finite and 0 or more, not {window!r}")
        if self.mode == "off":
            object.__setattr__(self, "window", 0.0)

    @property
    def spins(self) -> bool:
        """Whether this setting ever spins."""
        return self.mode != "off" and self.window > 0

    @classmethod
    def parse(cls, value: str | float | Polling) -> Polling:
        """A setting from ``"auto"`` (``"auto:N"``: spinning at most N
        microseconds), ``"off"``, a number of microseconds (a fixed window;
        ``0`` is ``off``), or a :class:`Polling`; ValueError naming anything else."""
        if isinstance(value, Polling):
            return value
        if isinstance(value, str):
            text = value.strip().lower()
            if text == "auto":
                return cls()
            if text.startswith("auto:"):
                try:
                    cap = cls.parse(text[5:])
                except ValueError:
                    cap = cls("off")
                if cap.mode != "fixed":
                    raise ValueError(f"polling 'auto:N' takes N > 0 microseconds, not {value!r}")
                return cls("auto", cap.window)
            if text == "off":
                return cls("off", 0.0)
            try:
                micros = float(text)
            except ValueError:
                micros = math.nan
        elif isinstance(value, int | float) and not isinstance(value, bool):
            micros = float(value)
        else:
            raise TypeError(f"polling must be 'auto', 'off' or microseconds, not {value!r}")
        if not 0 <= micros < math.inf:
            raise ValueError(
                "polling must be 'auto', 'off' or a finite number of microseconds, 0 or "
                f"more, not {value!r}"
            )
        return cls("fixed", micros / 1e6) if micros > 0 else cls("off", 0.0)

    @classmethod
    def from_environment(cls) -> Polling:
        """``AIORDMA_POLL`` (``auto``, ``off`` or microseconds), else the older
        ``AIORDMA_POLL_US`` (microseconds of a fixed window), else ``DEFAULT``."""
        value = os.environ.get("AIORDMA_POLL", "")
        if value.strip():
            try:
                return cls.parse(value)
            except ValueError as exc:
                raise ValueError(f"AIORDMA_POLL: {exc}") from None
        micros = os.environ.get("AIORDMA_POLL_US", "")
        if micros.strip():
            try:
                return cls.parse(micros)
            except ValueError:
                raise ValueError(
                    "AIORDMA_POLL_US must be a finite number of microseconds, 0 (never poll) "
                    f"or more, not {micros!r}"
                ) from None
        return DEFAULT


DEFAULT: Final = Polling("off", 0.0)
"""The setting when none is given: ``off`` until ``auto`` is measured to meet
issue 63's targets in a quiet lab boot (record 0019)."""


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class WaitPolicy:
    """``auto``'s decision for one completion queue (see the module's text)."""

    __slots__ = ("_backoff", "_cap", "_cpus", "_current", "_mean", "_skip", "hits", "misses",
                 "skipped", "spins", "window")  # fmt: skip

    def __init__(self, cap: float = AUTO_CAP, cpus: int | None = None) -> None:
        self._cap = cap
        self._cpus = usable_cpus() if cpus is None else cpus
        self._mean = 0.0
        self._backoff = 0
        self._skip = 0
        self._current = 0.0
        self.window = 0.0
        """The trimmed window (0: none yet; the next spin uses the cap)."""
        self.spins = 0
        """Expectations the queue spun for."""
        self.hits = 0
        """Spins that a receive completion ended."""
        self.misses = 0
        """Spins whose window ran out."""
        self.skipped = 0
        """Expectations not spun for during a backoff."""

    @property
    def enabled(self) -> bool:
        """Whether this queue may spin at all (more than one usable CPU)."""
        return self._cpus > 1 and self._cap > 0

    def start(self) -> float:
        """An answer is expected: seconds to spin for it (0: sleep)."""
        if not self.enabled:
            return 0.0
        if self._skip > 0:
            self._skip -= 1
            self.skipped += 1
            return 0.0
        self.spins += 1
        self._current = self.window or self._cap
        return self._current

    def hit(self, waited: float) -> None:
        """The expected answer came after ``waited`` seconds of spinning."""
        self.hits += 1
        self._backoff = 0
        mean = self._mean
        self._mean = waited if mean == 0 else mean + (waited - mean) * _EWMA_WEIGHT
        self.window = min(self._cap, max(FLOOR, 2 * self._mean))

    def miss(self) -> None:
        """The window ran out before the answer."""
        self.misses += 1
        if self._current < self._cap:
            self.window = self._cap  # try the cap next time before backing off
            return
        self.window = 0.0
        self._backoff = min(self._backoff + 1, MAX_BACKOFF)
        self._skip = (1 << self._backoff) - 1
