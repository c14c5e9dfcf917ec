"""The channel's packet path: what can be checked without a device.

Its behaviour with packets runs on a real device in test_channel.py (on
both paths, in CI); here, the C constants its source declares.
"""

from __future__ import annotations

import pytest

from aiordma.channel import packets
from aiordma.channel.wire import HEADER_SIZE, Kind


def test_the_c_constants_match_what_they_stand_for() -> None:
    # Compiled, they are C integers Python cannot see; the source (which the
    # build compiles) is checked here.
    if not hasattr(packets, "_EAGER"):
        pytest.skip("compiled: the constants are C globals")
    assert (packets._EAGER, packets._RENDEZVOUS, packets._HELLO_KIND) == (
        Kind.EAGER,
        Kind.RENDEZVOUS,
        Kind.HELLO,
    )
    assert packets._HEADER_SIZE == HEADER_SIZE
