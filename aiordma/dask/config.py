"""The ``rdma://`` comm's settings, in Dask's own configuration.

Keys live under ``distributed.comm.rdma`` (so ``dask worker`` and ``dask
scheduler`` take them from a YAML file or the environment, such as
``DASK_DISTRIBUTED__COMM__RDMA__AUTH_KEY``):

- ``exposure-timeout``: how long a large frame stays readable for the peer
  (``60s``; ``null``: no limit);
- ``max-exposed``: bytes of large frames a connection holds readable at once
  (``256 MiB``);
- ``piece-size``: frames larger than this are sent as several messages
  (``64 MiB``); also the largest message a connection accepts;
- ``read-piece``: the size of each RDMA read of a large frame (``null``:
  by the path, 1 MiB between workers on one device and 64 KiB across a
  wire; larger reads move faster on a clean link, smaller ones lose less
  to a lossy one);
- ``landing-pool``: bytes of registered blocks that large frames land in,
  per device and process (``256 MiB``; ``0``: none);
- ``auth-key``: a pre-shared key as hex (at least 16 bytes), which both
  sides of every connection must hold (``null``: none).

They are read when a comm or listener is made, so ``dask.config.set``
applies to those made afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask.config
from dask.utils import parse_bytes, parse_timedelta

from aiordma.channel import Accept, ChannelOptions, ConnectOptions, PresharedKey, ServeOptions

PREFIX = "distributed.comm.rdma"

DEFAULTS: dict[str, Any] = {
    "exposure-timeout": "60s",
    "max-exposed": "256 MiB",
    "piece-size": "64 MiB",
    "read-piece": None,
    "landing-pool": "256 MiB",
    "auth-key": None,
}

dask.config.update_defaults({"distributed": {"comm": {"rdma": DEFAULTS}}})


@dataclass(frozen=True)
class Settings:
    """The settings in force, parsed and checked."""

    exposure_timeout: float | None
    max_exposed: int
    piece_size: int
    read_piece: int | None
    landing_pool: int
    auth: PresharedKey | None

    def channel_options(self) -> ChannelOptions:
        """The message channel's options for a Dask comm."""
        return ChannelOptions(
            max_message=self.piece_size,
            max_exposed=max(self.max_exposed, self.piece_size),
            exposure_timeout=self.exposure_timeout,
            read_piece=self.read_piece,
            # Nothing is kept registered for the frames (they are distributed's;
            # large ones land in the landing pool's blocks).
            registration_cache=0,
        )

    def connect_options(self, hello: bytes) -> ConnectOptions:
        """How a Dask comm connects: saying ``hello``, with no timeout of its
        own (distributed retries until its connect timeout)."""
        return ConnectOptions(private_data=hello, timeout=None, auth=self.auth)

    def serve_options(self, accept: Accept) -> ServeOptions:
        """How a Dask comm listener serves: ``accept`` checks each hello."""
        return ServeOptions(accept=accept, auth=self.auth)


def _get(name: str) -> Any:
    return dask.config.get(f"{PREFIX}.{name}", DEFAULTS[name])


def _size(name: str, minimum: int) -> int:
    raw = _get(name)
    try:
        value = int(parse_bytes(raw)) if isinstance(raw, str) else int(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{PREFIX}.{name} must be a size such as '64 MiB', not {raw!r}") from exc
    if value < minimum:
        raise ValueError(f"{PREFIX}.{name} must be at least {minimum} bytes, not {raw!r}")
    return value


def settings() -> Settings:
    """The settings in Dask's configuration now (ValueError naming a bad key)."""
    raw_timeout = _get("exposure-timeout")
    try:
        timeout = None if raw_timeout is None else float(parse_timedelta(raw_timeout, "s"))
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(
            f"{PREFIX}.exposure-timeout must be a duration such as '60s' (or null), "
            f"not {raw_timeout!r}"
        ) from exc
    if timeout is not None and timeout <= 0:
        raise ValueError(f"{PREFIX}.exposure-timeout must be positive, not {raw_timeout!r}")
    key = _get("auth-key")
    auth = None
    if key is not None:
        try:
            auth = PresharedKey.fromhex(str(key))
        except ValueError as exc:
            # The message names the rule, never the key.
            raise ValueError(f"{PREFIX}.auth-key: {exc}") from None
    return Settings(
        exposure_timeout=timeout,
        max_exposed=_size("max-exposed", 1),
        piece_size=_size("piece-size", 1),
        read_piece=None if _get("read-piece") is None else _size("read-piece", 4096),
        landing_pool=_size("landing-pool", 0),
        auth=auth,
    )
