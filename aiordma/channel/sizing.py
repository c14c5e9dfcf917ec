"""One-sided work sized by the path: read pieces and bulk windows.

A peer on the same device has no wire between: nothing to overrun, nothing
lost, so larger pieces and more of them in flight cost nothing and save
completions and wake-ups. Across a wire, a small window of modest pieces
paces the sender's adapter to what the receiver takes in. The channel's
large-message reads and the transfer agents' tables are sized here, and
only here; a caller's explicit choice always wins.
"""

from __future__ import annotations

READ_PIECE = 64 << 10
"""Large messages from a peer across a wire are read in pieces of this size
by default (see ``READS_IN_FLIGHT``): the size that read fastest across the
two-host lab's lossy link."""
LOCAL_READ_PIECE = 1 << 20
"""Large messages from a peer on the same device (no wire between: nothing
to overrun, nothing lost) are read in pieces of this size by default: four
times fewer reads, completions and wake-ups per megabyte than
:data:`READ_PIECE` pieces (``docs/decisions/0010-wake-up-path.md``)."""
MIN_READ_PIECE = 4096
READS_IN_FLIGHT = 4
"""Pieces of large messages being read at once (the one taken and the one
read ahead together): 1 MiB in flight paces the sender's adapter to what
the receiver takes in."""

WIRE_WINDOW = 16
"""Records of a bulk table in flight at once to a peer across a wire
(pieces of :data:`READ_PIECE`: 1 MiB in flight, which a lossy link carries)."""
LOCAL_WINDOW = 64
"""Records of a bulk table in flight at once to a peer on the same device
(no wire to overrun)."""


def read_piece_for(chosen: int | None, loopback: bool) -> int:
    """The read piece in force: ``chosen`` if the caller set one, else by the
    path (:data:`LOCAL_READ_PIECE` on a ``loopback`` link, else
    :data:`READ_PIECE`)."""
    if chosen is not None:
        return chosen
    return LOCAL_READ_PIECE if loopback else READ_PIECE


def bulk_window_for(chosen: int | None, loopback: bool) -> int:
    """Records of a bulk table in flight: ``chosen`` if the caller set one,
    else by the path (:data:`LOCAL_WINDOW` on a ``loopback`` link, else
    :data:`WIRE_WINDOW`)."""
    if chosen is not None:
        return chosen
    return LOCAL_WINDOW if loopback else WIRE_WINDOW
