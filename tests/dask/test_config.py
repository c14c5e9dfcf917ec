"""The rdma:// comm's settings from Dask's configuration.

Parsing is pure logic (host); that the settings reach the connections runs
on the lab device.
"""

from __future__ import annotations

import asyncio

import dask.config
import numpy as np
import pytest
from distributed.comm.core import FatalCommClosedError, connect, listen
from distributed.protocol.serialize import to_serialize

from aiordma import PresharedKey
from aiordma.dask.comm import RdmaComm
from aiordma.dask.config import settings
from tests.conftest import Lab
from tests.dask.test_comm import TIMEOUT, echo

KEY = "00112233445566778899aabbccddeeff"


def test_the_defaults() -> None:
    found = settings()
    assert found.exposure_timeout == 60.0
    assert found.max_exposed == 256 << 20
    assert found.piece_size == 64 << 20
    assert found.read_piece is None  # by the path (aiordma.channel.sizing.read_piece_for)
    assert found.landing_pool == 256 << 20
    assert found.auth is None
    options = found.channel_options()
    assert options.max_message == 64 << 20
    assert options.registration_cache == 0


def test_keys_are_read_from_dask_config_and_the_environment_spelling() -> None:
    with dask.config.set(
        {
            "distributed.comm.rdma.exposure-timeout": "2 minutes",
            "distributed.comm.rdma.piece-size": "8 MiB",
            "distributed.comm.rdma.read_piece": "256 KiB",  # "_" as environment variables spell it
            "distributed.comm.rdma.landing-pool": 0,
            "distributed.comm.rdma.auth-key": KEY,
        }
    ):
        found = settings()
    assert found.exposure_timeout == 120.0
    assert found.piece_size == 8 << 20
    assert found.read_piece == 256 << 10
    assert found.landing_pool == 0
    assert found.auth == PresharedKey.fromhex(KEY)
    with dask.config.set({"distributed.comm.rdma.exposure-timeout": None}):
        assert settings().exposure_timeout is None


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("exposure-timeout", "soon", "exposure-timeout must be a duration"),
        ("exposure-timeout", "0s", "exposure-timeout must be positive"),
        ("piece-size", "lots", "piece-size must be a size"),
        ("read-piece", "1 KiB", "read-piece must be at least 4096"),
        ("auth-key", "zz" * 16, "auth-key: not a hex-encoded key"),
        ("auth-key", "0011", "auth-key: .*at least 16 bytes"),
    ],
)
def test_a_bad_value_is_a_valueerror_naming_its_key(key: str, value: str, says: str) -> None:
    with (
        dask.config.set({f"distributed.comm.rdma.{key}": value}),
        pytest.raises(ValueError, match=says) as info,
    ):
        settings()
    if key == "auth-key":
        assert value not in str(info.value)


@pytest.mark.asyncio
async def test_pieces_and_reads_follow_the_configuration(lab: Lab) -> None:
    array = np.arange(3 << 20, dtype=np.uint8)
    with dask.config.set(
        {"distributed.comm.rdma.piece-size": "1 MiB", "distributed.comm.rdma.read-piece": "128 KiB"}
    ):
        listener = listen(f"rdma://{lab.addr}:0", echo)
        await listener.start()
        try:
            comm = await connect(listener.contact_address, timeout=TIMEOUT)
            assert isinstance(comm, RdmaComm)
            channel = comm.channel
            assert channel is not None
            assert channel.max_message == 1 << 20
            assert channel.read_piece == 128 << 10
            try:
                await comm.write({"a": to_serialize(array)})
                back = await asyncio.wait_for(comm.read(), TIMEOUT)
                sent = channel.stats()["counters"]["large_sent"]
            finally:
                await comm.close()
        finally:
            listener.stop()
            await asyncio.wait_for(listener.wait_closed(), TIMEOUT)
    assert np.array_equal(back["a"], array)
    assert sent == 3  # three pieces of 1 MiB


@pytest.mark.asyncio
async def test_an_auth_key_admits_only_peers_holding_it(lab: Lab) -> None:
    with dask.config.set({"distributed.comm.rdma.auth-key": KEY}):
        listener = listen(f"rdma://{lab.addr}:0", echo)
        await listener.start()
    try:
        with dask.config.set({"distributed.comm.rdma.auth-key": KEY}):
            comm = await connect(listener.contact_address, timeout=TIMEOUT)
        await comm.write({"ok": 1})
        assert await asyncio.wait_for(comm.read(), TIMEOUT) == {"ok": 1}
        await comm.close()
        # A wrong key or none fails at once, naming authentication: an OSError
        # would be retried by distributed until its timeout, reported as one.
        for other in ({"distributed.comm.rdma.auth-key": "ff" * 16}, {}):
            with (
                dask.config.set(other),
                pytest.raises(FatalCommClosedError, match=r"authentication .* failed"),
            ):
                await connect(listener.contact_address, timeout=60)
    finally:
        listener.stop()
        await asyncio.wait_for(listener.wait_closed(), TIMEOUT)
