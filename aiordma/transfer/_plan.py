"""A transfer's work: pairs of local and remote descriptors made into a table of records.

:func:`fill` pairs the ``i``-th local descriptor with the ``i``-th remote
one (their lengths must be equal), joins neighbours that continue each other
on both sides (same keys, adjacent addresses) up to ``piece`` bytes, and
splits longer ones into ``piece``-sized records of :mod:`aiordma.bulk_table`
(the tag is the index of the record's first descriptor, so a failure names
it). Compiled (types in ``_plan.pxd``), the loops run in C: no Python per
descriptor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiordma.bulk_table import LAYOUT, Layout

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

_LAYOUT = cython.declare(Layout, LAYOUT)  # bulk_table's words as C integers


def records_needed(lengths: Any, count: int, piece: int) -> int:
    """At most how many records ``count`` descriptors of ``lengths`` make
    (each split into ``piece``-sized records, none joined)."""
    total = 0
    for i in range(count):
        length = lengths[i]
        total += (length + piece - 1) // piece
    return total


def mismatch(llens: Any, rlens: Any, count: int) -> int:
    """The first index whose local and remote lengths differ (-1: none)."""
    for i in range(count):
        if llens[i] != rlens[i]:
            return i
    return -1


def fill(
    laddrs: Any, llens: Any, lregion: Any, lkeys: Any,
    raddrs: Any, rregion: Any, rkeys: Any,
    count: int, piece: int, out: Any,
) -> int:  # fmt: skip
    """Write the records of ``count`` descriptor pairs into ``out``; how many.

    ``lregion[i]`` / ``rregion[i]`` index ``lkeys`` / ``rkeys``: the key of
    each descriptor's region. Zero-length pairs move nothing and make no record.
    """
    n = 0
    end_l = 0
    end_r = 0
    last_lkey = 0
    last_rkey = 0
    for i in range(count):
        length = llens[i]
        if length == 0:
            continue
        la = laddrs[i]
        ra = raddrs[i]
        lkey = lkeys[lregion[i]]
        rkey = rkeys[rregion[i]]
        if n > 0 and la == end_l and ra == end_r and lkey == last_lkey and rkey == last_rkey:
            # join the previous record as far as a piece goes
            last = _LAYOUT.record_words * (n - 1) + _LAYOUT.length_lkey
            prev = out[last] & 0xFFFFFFFF
            take = min(length, piece - prev)
            if take > 0:
                out[last] = (prev + take) | (lkey << 32)
                la += take
                ra += take
                length -= take
        while length > 0:
            take = min(length, piece)
            base = _LAYOUT.record_words * n  # the words in bulk_table's order
            out[base + _LAYOUT.local_addr] = la
            out[base + _LAYOUT.remote_addr] = ra
            out[base + _LAYOUT.length_lkey] = take | (lkey << 32)
            out[base + _LAYOUT.rkey_tag] = rkey | (i << 32)
            n += 1
            la += take
            ra += take
            length -= take
        end_l = la
        end_r = ra
        last_lkey = lkey
        last_rkey = rkey
    return n
