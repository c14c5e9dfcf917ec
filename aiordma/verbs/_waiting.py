# cython: annotation_typing=True
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
  (at least :data:`FLOOR`, at most the limit);
- a miss at a trimmed window tries the limit on the next expectation;
- a miss at the limit stops spinning for the next ``2**k - 1``
  expectations (``k`` grows by one a miss, up to :data:`MAX_BACKOFF`),
  then probes at the limit again;
- a hit ends the backoff while most spins hit, and halves ``k`` while most
  miss (a running share of the spins, :data:`HIT_SHARE`): a
  spin pays when the wake-up it saves, times the chance of a hit, outweighs
  the spin lost on a miss, and with windows about as long as a wake-up
  that is when more spins hit than miss. So answers that come soon only
  now and then (a slow responder, a mixed pace) cost a probe in up to 128
  expectations, not a spin after every lucky hit;
- the limit starts at :data:`AUTO_START` and moves between it and the
  setting's cap as KVM's halt-polling window does: an answer that came
  *late* (after a miss, through the sleeping path) but within the cap
  grows the limit to half as much again as that wait and cancels the
  backoff the miss began; one later than the cap takes the limit back to
  its start. So the window fits a machine whose round trips are slower
  than the starting limit, and only the cap bounds what one spin may cost.

So a ping-pong whose answers come within the cap spins on both sides,
while a paced or idle exchange probes once in up to 128 expectations.
Call order: ``start -> (hit | miss [-> answered])``, per expectation.

:class:`WaitPolicy` decides on every message's path, so the module is
compiled when the build could (``_waiting.pxd``; see
:mod:`aiordma._compiled`); ``_waiters.py`` acts on its decisions.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

__all__ = ["AUTO_CAP", "AUTO_START", "DEFAULT", "FLOOR", "HIT_SHARE", "MAX_BACKOFF", "MAX_WINDOW",
           "Polling", "WaitPolicy", "usable_cpus"]  # fmt: skip

AUTO_CAP: Final = 2e-3
"""Seconds ``auto`` spins at most for one expected answer: longer spins paid
for themselves in the lab's emulated guests, where sleeping and waking
costs more CPU than a spin of that length (record 0019)."""
AUTO_START: Final = 300e-6
"""Seconds of ``auto``'s first spins, before late answers grow the limit: a
little more than a 64 B round trip between two spinning peers on Soft-RoCE
in a quiet boot (record 0014)."""
FLOOR: Final = 50e-6
"""The shortest window ``auto`` trims to."""
MAX_BACKOFF: Final = 7
"""At most, ``auto`` backs off to probing once in ``2**7`` expectations."""
HIT_SHARE: Final = 0.5
"""While fewer than this share of recent spins hit, a hit halves the backoff
instead of ending it."""
MAX_WINDOW: Final = 0.1
"""Seconds a setting may spin at most (100,000 microseconds): far beyond any
round trip a spin could catch, and a longer one only burns a CPU that a
sleep and a wake-up (tens of microseconds) would have left free."""
_EWMA_WEIGHT: Final = 1 / 8

Mode = Literal["auto", "off", "fixed"]


@dataclass(frozen=True)
class Polling:
    """How completion queues wait for completions (``AIORDMA_POLL`` or
    :func:`aiordma.verbs.completion.set_polling`).

    ``auto`` (the default, see ``DEFAULT``) spins up to ``window`` seconds
    where an answer is expected soon and learns per queue when that pays;
    ``off`` always arms the channel and sleeps; ``fixed`` polls for
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
        if not 0 <= window <= MAX_WINDOW:
            raise ValueError(
                f"polling window must be 0 to {MAX_WINDOW} seconds (MAX_WINDOW), not {window!r}"
            )
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
        if not 0 <= micros <= MAX_WINDOW * 1e6:
            raise ValueError(
                "polling must be 'auto', 'off' or a number of microseconds from 0 to "
                f"{MAX_WINDOW * 1e6:.0f}, not {value!r}"
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


DEFAULT: Final = Polling("auto", AUTO_CAP)
"""The setting when none is given (record 0019)."""


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@cython.cclass
class WaitPolicy:
    """``auto``'s decision for one completion queue (see the module's text)."""

    def __init__(self, cap: float = AUTO_CAP, cpus: int | None = None) -> None:
        self._cap = cap
        self._start = min(AUTO_START, cap)
        self.limit = self._start
        """The longest spin now: from :data:`AUTO_START` up to the cap."""
        cpus = usable_cpus() if cpus is None else cpus
        self._enabled = cpus > 1 and cap > 0
        self._mean = 0.0
        self._share = 1.0  # of recent spins that hit: optimistic until spins miss
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
        self.late = 0
        """Misses whose answer came within the cap (each grew the limit)."""

    @property
    def enabled(self) -> bool:
        """Whether this queue may spin at all (more than one usable CPU)."""
        return self._enabled

    @cython.ccall
    def start(self) -> cython.double:
        """An answer is expected: seconds to spin for it (0: sleep)."""
        if not self._enabled:
            return 0.0
        if self._skip > 0:
            self._skip -= 1
            self.skipped += 1
            return 0.0
        self.spins += 1
        self._current = self.window or self.limit
        return self._current

    @cython.ccall
    def hit(self, waited: cython.double) -> None:
        """The expected answer came after ``waited`` seconds of spinning."""
        self.hits += 1
        share = self._share = self._share + (1 - self._share) * _EWMA_WEIGHT
        self._backoff = 0 if share >= HIT_SHARE else self._backoff // 2
        mean = self._mean
        self._mean = waited if mean == 0 else mean + (waited - mean) * _EWMA_WEIGHT
        self.window = min(self.limit, max(FLOOR, 2 * self._mean))

    @cython.ccall
    def miss(self) -> None:
        """The window ran out before the answer."""
        self.misses += 1
        self._share -= self._share * _EWMA_WEIGHT
        if self._current < self.limit:
            self.window = self.limit  # try the limit next time before backing off
            return
        self.window = 0.0
        self._backoff = min(self._backoff + 1, MAX_BACKOFF)
        self._skip = (1 << self._backoff) - 1

    @cython.ccall
    def answered(self, waited: cython.double) -> None:
        """The answer a miss gave up on came ``waited`` seconds after its spin
        began: within the cap it grows the limit (and forgives the miss),
        beyond it takes the limit back to its start."""
        if waited > self._cap:
            self.limit = self._start
            return
        if waited <= self.limit:
            return  # a trimmed window's miss: the limit gets its try next
        self.late += 1
        self.limit = min(self._cap, max(1.5 * waited, 2 * self.limit))
        self.window = 0.0
        self._share /= 1 - _EWMA_WEIGHT  # the share the miss took, given back
        self._backoff = max(0, self._backoff - 1)
        self._skip = 0
