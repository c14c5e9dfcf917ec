"""A channel's options are checked before anything connects (host only).

The entry points below are given an address where nothing listens: an
option they checked only after connecting would show up as a connection
error (or, with a server there, as a connection failing during set-up, as
issue 41 saw), not as the ValueError or TypeError naming the option.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import aiordma
from aiordma import rpc, streams
from aiordma.channel.open import (
    OpenKeywords,
    OpenTuningKeywords,
    ServeChannelKeywords,
    ServeTuningKeywords,
)
from aiordma.channel.options import (
    DEFAULT_BUFFER,
    DEFAULT_CONTROL_WINDOW,
    DEFAULT_WINDOW,
    MAX_BUFFER,
    SHARED_SEND_SLOTS,
    ChannelKeywords,
    ChannelOptions,
    TuningKeywords,
)
from aiordma.channel.sizing import LOCAL_READ_PIECE, READ_PIECE, read_piece_for
from aiordma.channel.wire import MIN_BUFFER

NOWHERE = ("192.0.2.99", 9)
"""An address nothing listens on (TEST-NET-1), on the host and in the lab."""


def test_the_defaults_resolve_to_the_documented_sizes() -> None:
    layout = ChannelOptions().layout(128, 128, None)
    assert layout.buffer_size == DEFAULT_BUFFER
    assert (layout.window, layout.control_window) == (DEFAULT_WINDOW, DEFAULT_CONTROL_WINDOW)
    assert layout.send_slots == DEFAULT_WINDOW + DEFAULT_CONTROL_WINDOW


def test_a_shared_receive_queue_sets_the_buffer_size_and_fewer_send_slots() -> None:
    layout = ChannelOptions(window=64).layout(8, 128, 4096)  # no receive depth needed
    assert layout.buffer_size == 4096
    assert layout.send_slots == SHARED_SEND_SLOTS
    with pytest.raises(ValueError, match=r"buffer_size \(8192\) must be that of the shared"):
        ChannelOptions(buffer_size=8192).layout(8, 128, 4096)


BAD = [
    ({"window": 1}, ValueError, "window must be at least 2"),
    ({"buffer_size": 16}, ValueError, f"buffer_size must be at least {MIN_BUFFER}"),
    ({"control_window": 2}, ValueError, "control_window must be at least"),
    ({"window": 200}, ValueError, r"window \+ control_window \(208\) exceeds"),
    ({"send_slots": 500}, ValueError, r"send_slots \(500.*send depth"),
    ({"send_slots": 0}, ValueError, "send_slots must be at least 1"),
    ({"max_message": -1}, ValueError, "max_message must be at least 1"),
    ({"max_message": 0}, ValueError, "max_message must be at least 1"),  # issue 81: refused all
    ({"max_exposed": 10, "max_message": 100}, ValueError, r"max_exposed \(10\) must be"),
    ({"exposure_timeout": 0}, ValueError, "exposure_timeout must be positive"),
    ({"medium_limit": -1}, ValueError, "medium_limit must not be negative"),
    ({"registration_cache": -1}, ValueError, "registration_cache must not be negative"),
    ({"read_piece": 100}, ValueError, "read_piece must be at least"),
    ({"read_piece": 4096.0}, TypeError, "read_piece must be an int"),
    ({"read_ahead": -1}, ValueError, "read_ahead must not be negative"),
    ({"read_ahead": 1.5}, TypeError, "read_ahead must be an int"),
    ({"protocol": "x" * 200}, ValueError, "protocol name"),
    ({"window": "32"}, TypeError, "window must be an int, not str"),
    ({"buffer_size": 4096.0}, TypeError, "buffer_size must be an int, not float"),
    ({"windw": 4}, TypeError, "unknown MessageChannel option.*windw"),
]


@pytest.mark.parametrize(("options", "error", "match"), BAD, ids=lambda v: str(v)[:40])
def test_each_bad_option_is_named(options: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ChannelOptions.of(options).layout(128, 128, None)


MADE_BAD = [
    ({"window": "32"}, TypeError, "window must be an int, not str"),
    ({"window": 0}, ValueError, "window must be at least 2"),
    ({"max_message": -1}, ValueError, "max_message must be at least 1"),
    ({"exposure_timeout": "x"}, TypeError, "exposure_timeout must be a number of seconds"),
    ({"exposure_timeout": math.nan}, ValueError, "exposure_timeout must be a number .* not NaN"),
    ({"buffer_size": 1 << 40}, ValueError, f"buffer_size must be at most {MAX_BUFFER}"),
    ({"control_window": 1.5}, TypeError, "control_window must be an int, not float"),
]


@pytest.mark.parametrize(("options", "error", "match"), MADE_BAD, ids=lambda v: str(v)[:40])
def test_each_bad_option_is_refused_when_the_value_is_made(
    options: dict[str, Any], error: type, match: str
) -> None:
    """Issue 62: checked in ``__post_init__`` (so by ``dataclasses.replace``
    too), before the value exists, not at the first connection."""
    with pytest.raises(error, match=match):
        ChannelOptions(**options)
    with pytest.raises(error, match=match):
        dataclasses.replace(ChannelOptions(), **options)


def test_an_infinite_exposure_timeout_means_none() -> None:
    assert ChannelOptions(exposure_timeout=math.inf).exposure_timeout is None


def _open_channel(**kw: Any) -> Awaitable[object]:
    return aiordma.open_channel(*NOWHERE, timeout=5, **kw)


async def _ignore(channel: aiordma.MessageChannel) -> None:
    pass


def _channel_server(**kw: Any) -> Awaitable[object]:
    return aiordma.start_channel_server(_ignore, NOWHERE[0], 0, **kw)


def _rpc_connect(**kw: Any) -> Awaitable[object]:
    return rpc.connect(*NOWHERE, timeout=5, **kw)


def _rpc_server(**kw: Any) -> Awaitable[object]:
    return rpc.start_server(rpc.Service(), NOWHERE[0], 0, **kw)


def _stream_connect(**kw: Any) -> Awaitable[object]:
    return streams.open_connection(*NOWHERE, timeout=5, **kw)


def _stream_server(**kw: Any) -> Awaitable[object]:
    return streams.start_stream_server(lambda r, w: None, NOWHERE[0], 0, **kw)


ENTRY_POINTS: list[Callable[..., Awaitable[object]]] = [
    _open_channel, _channel_server, _rpc_connect, _rpc_server, _stream_connect, _stream_server,
]  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__.lstrip("_"))
@pytest.mark.parametrize(
    ("options", "match"),
    [({"window": 1}, "window must be at least 2"), ({"buffer_size": 16}, "buffer_size must be")],
    ids=["window=1", "buffer_size=16"],
)
async def test_a_bad_option_is_refused_before_connecting(
    entry: Callable[..., Awaitable[object]], options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        await entry(**options)


@pytest.mark.asyncio
async def test_sizes_are_checked_against_the_queue_pair_options_given() -> None:
    small = aiordma.QueuePairOptions(recv_depth=16, send_depth=16)
    with pytest.raises(ValueError, match=r"window \+ control_window \(40\) exceeds .* \(16\)"):
        await aiordma.open_channel(*NOWHERE, timeout=5, options=small)
    with pytest.raises(ValueError, match=r"send_slots \(12.*send depth \(8\)"):
        await aiordma.start_channel_server(
            _ignore,
            NOWHERE[0],
            0,
            options=aiordma.QueuePairOptions(send_depth=8),
            window=8,
            control_window=4,
        )


@pytest.mark.asyncio
async def test_a_channel_handler_that_is_not_async_is_refused_at_start() -> None:
    def plain(channel: aiordma.MessageChannel) -> None:
        pass

    for handler in (plain, lambda ch: None, None):
        with pytest.raises(TypeError, match="client_connected_cb must be an async function"):
            await aiordma.start_channel_server(handler, NOWHERE[0], 0)  # type: ignore[arg-type]
    partial = functools.partial(_ignore)  # partials and async __call__ are async too
    assert aiordma.lifecycle.is_async_callable(partial)


def test_the_keyword_types_name_every_option_once() -> None:
    """``**`` is typed by TypedDicts that must list ChannelOptions' fields:
    all of them for a channel, all but ``protocol`` for the layers above,
    with the connection's or the server's settings beside them."""
    fields = {field.name for field in dataclasses.fields(ChannelOptions)}
    connect = {field.name for field in dataclasses.fields(aiordma.ConnectOptions)}
    serve = {field.name for field in dataclasses.fields(aiordma.ServeOptions)}
    assert not fields & (connect | serve)  # one name, one meaning
    assert ChannelKeywords.__optional_keys__ == fields
    assert TuningKeywords.__optional_keys__ == fields - {"protocol"}
    assert OpenKeywords.__optional_keys__ == fields | connect
    assert ServeChannelKeywords.__optional_keys__ == fields | serve
    assert OpenTuningKeywords.__optional_keys__ == fields - {"protocol"} | connect
    assert ServeTuningKeywords.__optional_keys__ == fields - {"protocol"} | serve


def test_the_read_piece_follows_the_path_unless_set() -> None:
    assert ChannelOptions().read_piece is None
    assert read_piece_for(None, loopback=True) == LOCAL_READ_PIECE == 1 << 20
    assert read_piece_for(None, loopback=False) == READ_PIECE == 64 << 10
    assert read_piece_for(8192, loopback=True) == 8192
