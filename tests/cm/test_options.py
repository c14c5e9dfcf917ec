"""Connection settings as one value: checked when made, split from keywords (no device)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

import aiordma
from aiordma import rpc
from aiordma.cm.options import (
    ConnectKeywords,
    ConnectOptions,
    EndpointKeywords,
    EndpointOptions,
    ServeKeywords,
    ServeOptions,
)
from aiordma.transfer import Agent, AgentKeywords

KEY = bytes(range(16))


def spelt(annotations: dict[str, Any]) -> dict[str, str]:
    """Annotations as written (a TypedDict keeps them as forward references)."""
    return {name: getattr(a, "__forward_arg__", a) for name, a in annotations.items()}


@pytest.mark.parametrize(
    ("options", "keywords"),
    [
        (EndpointOptions, EndpointKeywords),
        (ConnectOptions, ConnectKeywords),
        (ServeOptions, ServeKeywords),
    ],
)
def test_the_keywords_are_the_values_fields(options: type[Any], keywords: type[Any]) -> None:
    fields = {field.name: field.type for field in dataclasses.fields(options)}
    assert spelt(keywords.__annotations__) == fields  # the same names, spelt with the same types


def test_the_agents_keywords_are_its_own() -> None:
    params = inspect.signature(Agent.__init__).parameters
    own = {name: p.annotation for name, p in params.items() if p.kind is p.KEYWORD_ONLY}
    assert spelt(AgentKeywords.__annotations__) == own


def test_auth_bytes_become_a_key_and_its_room_comes_off_the_private_data() -> None:
    settings = ConnectOptions(auth=KEY, private_data=bytearray(35))  # type: ignore[arg-type]
    assert settings.key == aiordma.PresharedKey(KEY) == settings.auth
    assert settings.private_data == bytes(35)
    assert type(settings.private_data) is bytes
    with pytest.raises(ValueError, match="36 bytes; rdma_cm carries at most 35"):
        ConnectOptions(auth=KEY, private_data=bytes(36))
    assert ConnectOptions(private_data=bytes(56)).key is None


@pytest.mark.parametrize(
    ("kind", "keywords", "error", "says"),
    [
        (ConnectOptions, {"auth": "key"}, TypeError, "auth must be a PresharedKey or bytes"),
        (ConnectOptions, {"device": "mlx5_0"}, TypeError, "device must be an aiordma.Device"),
        (ConnectOptions, {"options": {}}, TypeError, "options must be aiordma.QueuePairOptions"),
        (ConnectOptions, {"private_data": "hi"}, TypeError, "private data must be bytes"),
        (ConnectOptions, {"timeout": "5"}, TypeError, "timeout must be a number of seconds"),
        (ConnectOptions, {"timeout": float("nan")}, ValueError, "timeout must be a number"),
        (ServeOptions, {"handshake_timeout": float("nan")}, ValueError, "must be a number"),
        (ServeOptions, {"backlog": 0}, ValueError, "backlog must be at least 1"),
        (ServeOptions, {"backlog": 2.5}, TypeError, "backlog must be an int"),
        (ServeOptions, {"accept": 3}, TypeError, "accept must be callable"),
        (ServeOptions, {"handshake_timeout": 0}, ValueError, "handshake_timeout must be pos"),
        (ServeOptions, {"shutdown_grace": -1}, ValueError, "shutdown_grace must not be neg"),
        (ServeOptions, {"shutdown_grace": None}, TypeError, "shutdown_grace must be a number"),
        (ConnectOptions, {"backlog": 3}, TypeError, "backlog"),  # a server's, not a client's
        (ServeOptions, {"backlog": 10**12}, ValueError, "backlog must be at most 2147483647"),
        (ServeOptions, {"shutdown_grace": math.inf}, ValueError, "shutdown_grace must be a finite"),
        (
            ConnectOptions,
            {"shared_receive": 5},
            TypeError,
            "shared_receive must be an aiordma.SharedReceiveQueue .*not int",
        ),
        (ConnectOptions, {"shared_receive": "pool"}, TypeError, "shared_receive must be"),
        (
            ConnectOptions,
            {"shared_receive": ServeOptions()},
            TypeError,
            "shared_receive must be .*not ServeOptions",
        ),
    ],
)
def test_a_bad_setting_is_refused_when_the_value_is_made(
    kind: type[Any], keywords: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        kind(**keywords)


def test_an_infinite_timeout_is_no_bound() -> None:
    """Issue 62: ``math.inf`` once passed the check, then failed the connect
    with OverflowError; it means what None means."""
    assert ConnectOptions(timeout=math.inf).timeout is None
    assert ServeOptions(handshake_timeout=math.inf).handshake_timeout is None
    assert ConnectOptions(timeout=-math.inf).timeout == -math.inf  # expired, as 0 is


def test_the_values_are_frozen() -> None:
    settings = ServeOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.backlog = 3  # type: ignore[misc]


def test_take_splits_a_functions_keywords_and_checks_its_share() -> None:
    settings, rest = ConnectOptions.take({"auth": KEY, "timeout": 2.0, "window": 8})
    assert (settings.key, settings.timeout, rest) == (aiordma.PresharedKey(KEY), 2.0, {"window": 8})
    served, rest = ServeOptions.take({"backlog": 4, "accept": None, "buffer_size": 4096})
    assert (served.backlog, rest) == (4, {"buffer_size": 4096})
    with pytest.raises(ValueError, match="backlog must be at least 1"):
        ServeOptions.take({"backlog": -1})


def test_the_channel_layer_checks_both_values_before_connecting() -> None:
    from aiordma.channel import open_channel_with, split_keywords, start_channel_server_with

    settings, options = split_keywords(
        ConnectOptions, {"timeout": 1.0, "window": 8}, caller="f", protocol="p"
    )
    assert (settings.timeout, options.window, options.protocol) == (1.0, 8, "p")
    with pytest.raises(TypeError, match=r"f\(\) got unexpected keyword argument\(s\): windw is "
                       r"unknown \(it takes .*timeout, .*window\)"):  # fmt: skip
        split_keywords(ConnectOptions, {"windw": 8}, caller="f")
    too_wide = aiordma.ChannelOptions(window=200)
    with pytest.raises(ValueError, match="exceeds the queue pair's receive depth"):
        asyncio.run(open_channel_with("192.0.2.1", 9, ConnectOptions(), too_wide))

    async def handler(channel: aiordma.MessageChannel) -> None:
        pass

    with pytest.raises(ValueError, match="exceeds the queue pair's receive depth"):
        asyncio.run(start_channel_server_with(handler, None, 0, ServeOptions(), too_wide))


def test_the_with_functions_name_a_value_of_the_wrong_kind() -> None:
    """Issue 62: each once answered with an AttributeError of its insides."""
    from aiordma.channel import open_channel_with, start_channel_server_with
    from aiordma.cm.connect import connect_with
    from aiordma.cm.server import start_server_with

    async def handler(channel: aiordma.MessageChannel) -> None:
        pass

    options = aiordma.ChannelOptions()
    calls: list[tuple[Any, str]] = [
        (open_channel_with("192.0.2.1", 9, ServeOptions(), options),  # type: ignore[arg-type]
         "settings must be an aiordma.ConnectOptions, not ServeOptions"),
        (open_channel_with("192.0.2.1", 9, {}, options),  # type: ignore[arg-type]
         "settings must be an aiordma.ConnectOptions, not dict"),
        (open_channel_with("192.0.2.1", 9, ConnectOptions(), {}),  # type: ignore[arg-type]
         "options must be an aiordma.ChannelOptions, not dict"),
        (open_channel_with("192.0.2.1", 9, ConnectOptions(), None),  # type: ignore[arg-type]
         "options must be an aiordma.ChannelOptions, not None"),
        (start_channel_server_with(handler, None, 0, ConnectOptions(), options),  # type: ignore[arg-type]
         "settings must be an aiordma.ServeOptions, not ConnectOptions"),
        (start_channel_server_with(handler, None, 0, ServeOptions(), None),  # type: ignore[arg-type]
         "options must be an aiordma.ChannelOptions, not None"),
        (connect_with("192.0.2.1", 9, ServeOptions()),  # type: ignore[arg-type]
         "settings must be an aiordma.ConnectOptions, not ServeOptions"),
        (start_server_with(handler, None, 0, ConnectOptions()),  # type: ignore[arg-type]
         "settings must be an aiordma.ServeOptions, not ConnectOptions"),
    ]  # fmt: skip
    for call, says in calls:
        with pytest.raises(TypeError, match=says):
            asyncio.run(call)


def test_a_keyword_of_another_value_says_where_it_belongs() -> None:
    """Issue 62: these once said "unknown MessageChannel option(s)"."""
    from aiordma.channel import split_keywords

    with pytest.raises(TypeError, match=r"keepalive is a queue pair setting: pass "
                       r"options=aiordma.QueuePairOptions\(keepalive=...\)"):  # fmt: skip
        split_keywords(ConnectOptions, {"keepalive": None}, caller="f")
    with pytest.raises(TypeError, match=r"timeout is a client's setting \(ConnectOptions\)"):
        split_keywords(ServeOptions, {"timeout": 3}, caller="f")
    with pytest.raises(TypeError, match=r"backlog is a server's setting \(ServeOptions\)"):
        split_keywords(ConnectOptions, {"backlog": 3, "window": 8}, caller="f")


def wrong(**keywords: Any) -> Any:
    """Keywords a function does not take, past the type checker."""
    return keywords


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: aiordma.connect("192.0.2.1", 9, **wrong(keepalive=1)),
         r"aiordma.connect\(\) got unexpected keyword argument\(s\): keepalive is a queue pair "
         r"setting: pass options=aiordma.QueuePairOptions\(keepalive=...\)"),
        (lambda: aiordma.connect("192.0.2.1", 9, **wrong(backlog=4)),
         r"aiordma.connect\(\) .*: backlog is a server's setting \(ServeOptions\), not a client's"),
        (lambda: aiordma.connect("192.0.2.1", 9, **wrong(window=4)),
         r"aiordma.connect\(\) .*: window is unknown \(it takes auth, device, options, "
         r"private_data, shared_receive, timeout\)"),
        (lambda: aiordma.start_server(print, None, 0, **wrong(timeout=5)),
         r"aiordma.start_server\(\) .*: timeout is a client's setting \(ConnectOptions\), "
         r"not a server's"),
        (lambda: aiordma.open_channel("192.0.2.1", 9, **wrong(backlog=4)),
         r"aiordma.open_channel\(\) .*: backlog is a server's setting"),
        (lambda: rpc.connect("192.0.2.1", 9, **wrong(max_concurrency=4)),
         r"rpc.connect\(\) .*: max_concurrency is an argument of the server's "
         r"rpc.Service\(max_concurrency=...\), not a client's setting"),
        (lambda: rpc.connect("192.0.2.1", 9, **wrong(max_held=4)),
         r"rpc.connect\(\) .*: max_held is an argument of the server's rpc.Service"),
        (lambda: rpc.start_server(rpc.Service(), None, 0, **wrong(max_concurrency=4)),
         r"rpc.start_server\(\) .*: max_concurrency is an argument of rpc.Service: pass "
         r"rpc.Service\(max_concurrency=...\) as the service"),
        (lambda: rpc.start_server(rpc.Service(), None, 0, **wrong(codec=rpc.JsonCodec())),
         r"rpc.start_server\(\) .*: codec is an argument of rpc.Service"),
    ],
)  # fmt: skip
def test_every_public_function_says_where_a_misplaced_keyword_belongs(
    call: Callable[[], Coroutine[Any, Any, object]], says: str
) -> None:
    """Issue 81: connect() and start_server() named ConnectOptions.__init__ and
    ServeOptions.__init__, rpc.connect() "unknown MessageChannel option(s)"."""
    with pytest.raises(TypeError, match=says):
        asyncio.run(call())
