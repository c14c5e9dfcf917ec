"""Metrics: the counting logic on the host, and counts against real traffic on rxe."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import aiordma
import aiordma.prometheus
from aiordma import Access, metrics, rpc
from aiordma.metrics import Stats
from aiordma.verbs.completion import default_polling
from tests.conftest import Lab


def _sample(text: str, name: str, **labels: str) -> float | None:
    """The value of sample ``name`` in exposition ``text`` that has each of
    ``labels`` (an empty value too) and every other label empty: sources
    still open elsewhere in the process, such as a loop's completion queue,
    add labels of their own."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == name
                and labels.keys() <= sample.labels.keys()
                and all(sample.labels[key] == labels.get(key, "") for key in sample.labels)
            ):
                return float(sample.value)
    return None


# -- logic (host) --------------------------------------------------------------


class _Source:
    """A watched object, as servers, client connections and pools are."""

    def __init__(self, labels: dict[str, str], stats: Stats) -> None:
        self.labels, self.stats = labels, stats

    def _metric_sources(self) -> Iterator[tuple[dict[str, str], Stats]]:
        yield self.labels, self.stats


def test_each_sample_is_labelled_by_its_own_source(recording: None) -> None:
    sources = []
    for label, sent in (("server", 5), ("peer", 7), ("pool", 2)):
        stats = Stats(label)
        stats.add("messages_sent", sent)
        stats.add("errors:IBV_WC_REM_ACCESS_ERR")
        sources.append(_Source({label: f"{label}-1"}, stats))
        metrics.watch(sources[-1])
    registry = CollectorRegistry()
    aiordma.prometheus.register(registry)
    try:
        text = generate_latest(registry).decode()
    finally:
        for source in sources:
            metrics.unwatch(source)
    for label, sent in (("server", 5), ("peer", 7), ("pool", 2)):
        # each sample has every kind's label, the others empty
        mine = {k: f"{k}-1" if k == label else "" for k in ("peer", "pool", "server")}
        assert _sample(text, "aiordma_messages_sent_total", **mine) == sent
        status = "IBV_WC_REM_ACCESS_ERR"
        assert _sample(text, "aiordma_errors_total", **mine, status=status) == 1
    table = metrics.format_exposition(text)
    assert "server=server-1" in table
    assert "pool=pool-1" in table


def test_a_scrape_with_nothing_open_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 41: `aiordma stats URL` printed nothing once no connection was open.
    monkeypatch.setattr(metrics, "collect", lambda: iter(()))  # what earlier tests left
    registry = CollectorRegistry()
    aiordma.prometheus.register(registry)
    text = generate_latest(registry).decode()
    assert "aiordma_sources 0.0" in text
    assert "no server, client connection or pool is open" in metrics.format_exposition(text)
    unregistered = generate_latest(CollectorRegistry()).decode()
    assert "register() called?" in metrics.format_exposition(unregistered)


def test_each_new_registry_is_served_though_an_old_one_was_freed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A registry freed by an earlier caller leaves its id to the next one:
    # register() must still add the collector to the new registry.
    monkeypatch.setattr(metrics, "collect", lambda: iter(()))
    for _ in range(20):
        registry = CollectorRegistry()
        aiordma.prometheus.register(registry)
        assert "aiordma_sources 0.0" in generate_latest(registry).decode()
        del registry


def test_stats_count_merge_and_switch_off(recording: None) -> None:
    a, b = Stats("a", lambda: {"exposed_bytes": 5}), Stats("b", lambda: {"exposed_bytes": 2})
    a.count("messages_sent", "bytes_sent", 100)
    b.add("bytes_sent", 11)
    b.observe("call", 2e-3)
    total = metrics.merged("t", [a, b])
    assert total.snapshot()["counters"] == {"messages_sent": 1, "bytes_sent": 111}
    assert total.snapshot()["gauges"] == {"exposed_bytes": 7}
    assert total.snapshot()["latency"]["call"]["count"] == 1
    closed = Stats("server")
    closed.merge(a, gauges=False)
    assert closed.gauges() == {}
    metrics.enable(False)
    a.add("messages_sent")
    a.count("messages_sent", "bytes_sent", 5)
    a.observe("call", 1.0)
    assert a.counters["messages_sent"] == 1
    assert a.counters["bytes_sent"] == 100
    assert "call" not in a.histograms


# -- on rxe --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_queue_pair_counts_verbs_latency_and_errors(
    device: aiordma.Device, recording: None
) -> None:
    a, b = await aiordma.connect_loopback_pair(device)
    try:
        target = device.alloc(
            64, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
        )
        local = device.alloc(64)
        for _ in range(3):
            await a.rdma_write(local[:8], target.remote()[:8])
        for _ in range(2):
            await a.rdma_read(local[:8], target.remote()[:8])
        if device.attributes.atomic:
            await a.atomic_fetch_add(target.remote()[:8], 1)
        receives = await b.post_recv_batch([local[:8], local[8:16]])
        bad = aiordma.RemoteBuffer(target.addr, 8, target.rkey ^ 0xFF)
        with pytest.raises(aiordma.RemoteAccessError):
            await a.rdma_read(local[:8], bad)
        counters = a.stats()["counters"]
        assert counters["ops:rdma_write"] == 3
        assert counters["ops:rdma_read"] == 3  # the refused one included
        assert counters.get("ops:atomic_fetch_add", 0) == (1 if device.attributes.atomic else 0)
        assert counters["errors:IBV_WC_REM_ACCESS_ERR"] == 1
        latency = a.stats()["latency"]
        assert latency["rdma_write"]["count"] == 3
        assert latency["rdma_read"]["count"] == 3
        assert 0 < latency["rdma_write"]["sum"] < 60
        assert b.stats()["counters"]["ops:recv"] == 2
        b.close()
        flushed = await asyncio.gather(*receives, return_exceptions=True)
        assert all(isinstance(r, aiordma.RdmaError) for r in flushed)
    finally:
        for qp in (a, b):
            qp.close()
            await qp.wait_closed()


SMALL = [0, 10, 1000, 100_000]
"""Sent by copy (eager, or a medium message in pieces): not counted large."""
LARGE = [300_000, 400_000]
"""Above the default medium_limit: sent by rendezvous."""


@pytest.mark.asyncio
async def test_channel_counters_match_the_traffic_on_both_sides(lab: Lab, recording: None) -> None:
    served, gone = asyncio.Event(), asyncio.Event()

    async def handle(channel: aiordma.MessageChannel) -> None:
        for _ in SMALL + LARGE:
            await channel.recv_message()
        await channel.send_message(b"x" * 50)
        served.set()
        await channel.conn.wait_closed()
        gone.set()  # the server retired the connection first (an earlier callback)

    async with await aiordma.start_channel_server(handle, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with await aiordma.open_channel(lab.addr, port) as channel:
            for size in SMALL + LARGE:
                await channel.send_message(bytes(size))
            assert await asyncio.wait_for(channel.recv_message(), 30) == b"x" * 50
            await asyncio.wait_for(served.wait(), 30)
            mine = channel.conn.stats()["counters"]
            assert mine["messages_sent"] == 6
            assert mine["bytes_sent"] == sum(SMALL + LARGE)
            assert mine["large_sent"] == 2
            assert mine["messages_received"] == 1
            assert mine["bytes_received"] == 50
            assert "large_received" not in mine
            assert channel.stats()["counters"]["messages_sent"] == 6
            theirs = server.stats()
            assert theirs["counters"]["messages_received"] == 6
            assert theirs["counters"]["bytes_received"] == sum(SMALL + LARGE)
            assert theirs["counters"]["large_received"] == 2
            assert theirs["counters"]["messages_sent"] == 1
            assert theirs["gauges"]["connections"] == 1
        await asyncio.wait_for(gone.wait(), 30)
        assert not server.connections
        # Closed connections' counts stay in the server's.
        after = server.stats()
        assert after["counters"]["messages_received"] == 6
        assert after["counters"]["connections_accepted"] == 1
        assert after["gauges"] == {"connections": 0}
        # A clean close flushes the channel's posted receives: not errors.
        assert not [k for k in after["counters"] if k.startswith("errors:")], after
        assert after["counters"]["flushed"] >= 1
    assert not [k for k in channel.conn.stats()["counters"] if k.startswith("errors:")]


@pytest.mark.asyncio
async def test_exposed_bytes_gauge_follows_a_large_send(lab: Lab, recording: None) -> None:
    size = 300_000  # above the default medium_limit: exposed, not copied
    announced, release = asyncio.Event(), asyncio.Event()

    async def late(channel: aiordma.MessageChannel) -> None:
        await channel.wait_message()
        announced.set()
        await release.wait()
        await channel.recv_message()
        await channel.conn.wait_closed()

    async with await aiordma.start_channel_server(late, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with await aiordma.open_channel(lab.addr, port) as channel:
            sending = asyncio.ensure_future(channel.send_message(bytes(size)))
            await asyncio.wait_for(announced.wait(), 30)
            assert channel.stats()["gauges"] == {
                "exposed_bytes": size, "exposures": 1, "kept_registrations": 0, "kept_bytes": 0,
            }  # fmt: skip
            release.set()
            await asyncio.wait_for(sending, 30)
            assert channel.stats()["gauges"] == {
                "exposed_bytes": 0, "exposures": 0, "kept_registrations": 0, "kept_bytes": 0,
            }  # fmt: skip


@pytest.mark.asyncio
async def test_rpc_counts_and_prometheus_export(lab: Lab, recording: None) -> None:
    service = rpc.Service()

    @service.method()
    async def echo(data: bytes) -> bytes:
        return data

    registry = CollectorRegistry()
    aiordma.prometheus.register(registry)
    async with await rpc.start_server(service, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with await rpc.connect(lab.addr, port) as client:
            for _ in range(2):
                await asyncio.wait_for(client.call("echo", b"hi"), 30)
            with pytest.raises(rpc.UnknownMethodError):
                await asyncio.wait_for(client.call("nope", b""), 30)
            counters = client.stats()["counters"]
            assert counters["calls"] == 3
            assert counters["calls_failed"] == 1
            assert client.stats()["latency"]["call"]["count"] == 3
            served = server.stats()["counters"]
            assert served["requests"] == 3
            assert served["requests_failed"] == 1
            text = generate_latest(registry).decode()
            # A server and a client connection in one process: every sample
            # has both labels, the one that does not apply empty. Completion
            # queues that may spin (the default policy) are sources too.
            if default_polling().spins:
                assert 'aiordma_arms_total{completion_queue="' in text
                assert 'completion_queue="",peer="",server="' in text
            where = {"server": f"{lab.addr}:{port}", "peer": ""}
            assert _sample(text, "aiordma_requests_total", **where) == 3
            assert _sample(text, "aiordma_connections", **where) == 1
            mine = {"peer": "{}:{}".format(*client.conn.peer_address), "server": ""}
            assert _sample(text, "aiordma_calls_total", **mine) == 3
            assert _sample(text, "aiordma_call_seconds_count", **mine) == 3
            # Families both have are labelled per source, not as the first one.
            assert _sample(text, "aiordma_messages_sent_total", **mine) == 3
            assert _sample(text, "aiordma_messages_sent_total", **where) == 3


@pytest.mark.asyncio
async def test_nothing_is_counted_while_metrics_are_off(lab: Lab) -> None:
    async def handle(channel: aiordma.MessageChannel) -> None:
        await channel.send_message(await channel.recv_message())

    was = metrics.enabled()
    metrics.enable(False)
    try:
        async with await aiordma.start_channel_server(handle, lab.addr, 0) as server:
            port = server.addresses[0][1]
            async with await aiordma.open_channel(lab.addr, port) as channel:
                await channel.send_message(b"quiet")
                assert await asyncio.wait_for(channel.recv_message(), 30) == b"quiet"
                assert channel.stats()["counters"] == {}
                assert channel.conn.stats()["latency"] == {}
    finally:
        metrics.enable(was)


class _Changing:
    """A source whose loop changes it while the exporter's thread reads it."""

    def _metric_sources(self) -> Iterator[tuple[dict[str, str], Stats]]:
        raise RuntimeError("Set changed size during iteration")
        yield  # (a generator, as the real ones are)


def test_a_source_changed_while_read_is_left_out_of_that_scrape_alone(
    recording: None,
) -> None:
    """Issue 62 (the metrics test's "no aiordma metrics there"): the scrape
    runs in the exporter's thread while the loops change their sources; one
    source's failure once emptied the whole scrape."""
    stats = Stats("server")
    stats.add("messages_sent", 3)
    source, changing = _Source({"server": "192.0.2.1:7471"}, stats), _Changing()
    metrics.watch(changing)
    metrics.watch(source)
    try:
        registry = CollectorRegistry()
        aiordma.prometheus.register(registry)
        text = generate_latest(registry).decode()
    finally:
        metrics.unwatch(source)
        metrics.unwatch(changing)
    assert _sample(text, "aiordma_messages_sent_total", server="192.0.2.1:7471") == 3


def test_the_stats_command_prints_a_running_processs_metrics(
    recording: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``aiordma stats URL`` reads what the exporter serves over HTTP."""
    from prometheus_client import start_http_server

    from aiordma.cli import main

    stats = Stats("server", lambda: {"connections": 2})
    stats.add("messages_sent", 7)
    stats.add("errors:IBV_WC_REM_ACCESS_ERR")
    stats.observe("call", 0.002)
    stats.observe("call", 0.004)
    source = _Source({"server": "192.0.2.1:7471"}, stats)
    metrics.watch(source)
    registry = CollectorRegistry()
    aiordma.prometheus.register(registry)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        port = server.server_address[1]
        assert main(["stats", f"http://127.0.0.1:{port}/metrics"]) == 0
    finally:
        server.shutdown()
        server.server_close()  # (shutdown alone leaves the socket open)
        thread.join(5)
        metrics.unwatch(source)
    out = capsys.readouterr().out
    assert "server=192.0.2.1:7471" in out
    assert "messages_sent_total" in out
    assert "errors_total:IBV_WC_REM_ACCESS_ERR" in out
    assert "call_seconds" in out
    assert "mean 3,000.0 us" in out
    assert main(["stats", "http://127.0.0.1:9/metrics", "--timeout", "1"]) == 1
    assert "cannot read metrics" in capsys.readouterr().err
