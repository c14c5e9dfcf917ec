"""Credit accounting (no device): never send without a posted buffer, never deadlock."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import pytest

from aiordma.channel.credits import (
    CONTROL_BASE,
    CreditWindow,
    DataCredits,
    SharedDataCredits,
)
from aiordma.verbs.srq import ReceivePool


def _window(size: int) -> CreditWindow:
    """A control window whose HELLO went both ways (same size on both sides)."""
    w = CreditWindow(size)
    w.piggyback()
    w.announced(size)
    w.granted(size - CONTROL_BASE)
    return w


def _data(size: int) -> DataCredits:
    """Data credits whose HELLO went both ways (same size on both sides)."""
    d = DataCredits(size)
    d.piggyback()
    d.announced(size)
    d.granted(size)
    return d


def test_last_credit_is_kept_for_credit_updates() -> None:
    w = _window(4)
    assert [w.take_for_data() for _ in range(3)] == [0, 0, 0]
    assert not w.can_send_data()
    with pytest.raises(RuntimeError):
        w.take_for_data()
    w.granted(2)
    assert w.available == 3


def test_owed_credits_ride_on_the_next_packet() -> None:
    w = _window(8)
    for _ in range(3):
        w.reposted(for_data=True)
    assert w.take_for_data() == 3
    assert w.owed == 0


def test_update_is_due_after_half_a_window_of_data() -> None:
    w = _window(8)
    for _ in range(3):
        w.reposted(for_data=True)
    assert not w.should_send_update()
    w.reposted(for_data=False)
    assert not w.should_send_update()  # credit-only packets never trigger one
    w.reposted(for_data=True)
    assert w.should_send_update()
    assert w.take_for_update() == 5


def test_over_granting_is_refused() -> None:
    with pytest.raises(ValueError, match="granted 1 credits"):
        _window(4).granted(1)
    with pytest.raises(ValueError, match="at least 4"):
        CreditWindow(3)


def test_data_credits_need_no_reserve_and_report_half_a_window() -> None:
    d = _data(4)
    for _ in range(4):
        d.take()
    assert not d.can_send()
    with pytest.raises(RuntimeError):
        d.take()
    d.reposted()
    assert not d.should_send_update()
    d.reposted()
    assert d.should_send_update()
    assert d.piggyback() == 2
    d.granted(4)
    with pytest.raises(ValueError, match="granted 1 data credits"):
        d.granted(1)


@dataclass
class Side:
    window: CreditWindow
    posted: int
    to_send: int
    inbox: deque[tuple[bool, int]] = field(default_factory=deque)
    received: int = 0


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("window", [4, 5, 16])
def test_random_exchanges_never_overrun_and_always_finish(seed: int, window: int) -> None:
    """Two peers send random amounts at random moments; receives are re-posted lazily."""
    rng = random.Random(seed)
    a = Side(_window(window), window, rng.randrange(200))
    b = Side(_window(window), window, rng.randrange(200))
    a_total, b_total = a.to_send, b.to_send
    peers = {id(a): b, id(b): a}
    for _ in range(100_000):
        if a.to_send == b.to_send == 0 and not a.inbox and not b.inbox:
            break
        side = rng.choice((a, b))
        peer = peers[id(side)]
        action = rng.random()
        if action < 0.4 and side.to_send and side.window.can_send_data():
            peer.posted -= 1
            assert peer.posted >= 0, "sent into an empty receive queue"
            peer.inbox.append((True, side.window.take_for_data()))
            side.to_send -= 1
        elif action < 0.5 and side.window.should_send_update():
            peer.posted -= 1
            assert peer.posted >= 0, "credit update into an empty receive queue"
            peer.inbox.append((False, side.window.take_for_update()))
        elif side.inbox:
            is_data, credits = side.inbox.popleft()
            side.window.granted(credits)
            side.received += is_data
            side.posted += 1
            side.window.reposted(for_data=is_data)
    else:
        pytest.fail(f"no progress: a={a.window} b={b.window}")
    assert (a.received, b.received) == (b_total, a_total)


@dataclass
class Peer:
    """One side of the message channel's two-window protocol, reduced to its counters."""

    data: DataCredits
    control: CreditWindow
    posted: int
    to_send: list[bool]  # True: a large message, whose sender waits for DONE
    inbox: deque[tuple[str, int, int]] = field(default_factory=deque)
    ready: deque[bool] = field(default_factory=deque)
    awaiting_done: bool = False
    dones_owed: int = 0
    received: int = 0

    def post(self, peer: Peer, kind: str, cost: str) -> None:
        peer.posted -= 1
        assert peer.posted >= 0, f"{kind} sent into an empty receive queue"
        data_credits = self.data.piggyback()
        if cost == "data":
            self.data.take()
            control_credits = self.control.piggyback()
        elif cost == "control":
            control_credits = self.control.take_for_data()
        else:
            control_credits = self.control.take_for_update()
        peer.inbox.append((kind, data_credits, control_credits))


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize(("window", "control"), [(2, 4), (4, 4), (8, 4), (32, 8)])
def test_two_window_protocol_with_rendezvous_and_slow_readers_always_finishes(
    seed: int, window: int, control: int
) -> None:
    """Both sides send eager and rendezvous messages at once and read them at random
    moments (a reader may fall far behind); every message arrives, nothing is sent
    into an empty receive queue, and no DONE or credit update is ever stuck."""
    rng = random.Random(seed)

    def peer() -> Peer:
        messages = [rng.random() < 0.3 for _ in range(rng.randrange(150))]
        return Peer(_data(window), _window(control), window + control, messages)

    a, b = peer(), peer()
    totals = (len(a.to_send), len(b.to_send))
    other = {id(a): b, id(b): a}
    for _ in range(200_000):
        if not any((s.to_send or s.inbox or s.ready or s.awaiting_done) for s in (a, b)):
            break
        side = rng.choice((a, b))
        peer_ = other[id(side)]
        action = rng.random()
        if action < 0.3:  # the sending task
            if side.to_send and not side.awaiting_done and side.data.can_send():
                large = side.to_send.pop(0)
                side.post(peer_, "RENDEZVOUS" if large else "EAGER", "data")
                side.awaiting_done = large
        elif action < 0.5:  # the protocol, on arrival of a packet
            if side.inbox:
                kind, data_credits, control_credits = side.inbox.popleft()
                side.data.granted(data_credits)
                side.control.granted(control_credits)
                if kind in ("EAGER", "RENDEZVOUS"):
                    side.ready.append(kind == "RENDEZVOUS")
                else:
                    side.posted += 1
                    side.control.reposted(for_data=kind != "CONTROL_CREDIT")
                    if kind == "DONE":
                        side.awaiting_done = False
        elif action < 0.6:  # the (slow) receiving task
            if side.ready:
                large = side.ready.popleft()
                side.posted += 1
                side.data.reposted()
                side.received += 1
                side.dones_owed += large
        elif side.dones_owed and side.control.can_send_data():  # the pump
            side.dones_owed -= 1
            side.post(peer_, "DONE", "control")
        elif side.data.should_send_update() and side.control.can_send_data():
            side.post(peer_, "CREDIT", "control")
        elif side.control.should_send_update():
            side.post(peer_, "CONTROL_CREDIT", "update")
    else:
        pytest.fail(f"stuck: a={a} b={b}")
    assert (a.received, b.received) == (totals[1], totals[0])


def test_a_pool_member_starts_with_its_base_and_borrows_when_its_peer_runs_dry() -> None:
    pool = ReceivePool(20)
    assert pool.take(2)
    member = SharedDataCredits(8, pool=pool, base=2)
    assert member.piggyback() == 2  # the HELLO grants the base
    member.arrived()
    assert member.share == 2
    member.arrived(last=True)  # the peer says it used everything: the share doubles
    assert member.share == 4
    member.reposted()  # one back, and two more borrowed
    assert (member.tokens, member.held, member.owed, pool.free) == (4, 3, 3, 16)
    assert member.should_send_update()


def test_a_pressed_pool_takes_borrowed_buffers_back_as_they_are_consumed() -> None:
    pool = ReceivePool(6)
    assert pool.take(4)
    a = SharedDataCredits(8, pool=pool, base=2)
    b = SharedDataCredits(8, pool=pool, base=2)
    a.piggyback()
    a.arrived()
    a.arrived(last=True)
    a.reposted()
    a.reposted()  # a borrowed the two free buffers
    assert (a.tokens, pool.free) == (4, 0)
    b.piggyback()
    b.arrived()
    b.arrived(last=True)
    b.reposted()  # b wants more: nothing to lend, the pool is pressed
    assert pool.pressed
    assert b.tokens == 2
    a.piggyback()
    for _ in range(4):
        a.arrived()
    a.reposted()
    a.reposted()  # a gives back what it borrowed, down to its base
    assert (a.tokens, pool.free, pool.pressed) == (2, 2, False)
    a.reposted()
    assert a.held >= 1  # its base it keeps granting


def test_a_member_refuses_a_message_it_gave_no_credit_for() -> None:
    pool = ReceivePool(2)
    member = SharedDataCredits(4, pool=pool, base=1)
    member.arrived()
    with pytest.raises(ValueError, match="without a credit"):
        member.arrived()


@dataclass
class Member:
    """A pool member's receiving side and the peer sending to it."""

    credits: SharedDataCredits
    to_send: int
    slow: bool
    available: int = 0
    in_flight: deque[bool] = field(default_factory=deque)
    ready: int = 0
    received: int = 0


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize(("members", "buffers", "base"), [(3, 8, 2), (10, 40, 2), (6, 12, 1)])
def test_members_of_a_pool_never_overrun_it_and_always_finish(
    seed: int, members: int, buffers: int, base: int
) -> None:
    """Peers send at random to members of one pool, some of which read slowly:
    no message finds the shared queue empty, every one arrives, and every
    buffer is accounted for at every step."""
    rng = random.Random(seed)
    pool = ReceivePool(buffers)
    posted = buffers
    group = []
    for _ in range(members):
        assert pool.take(base)
        credits = SharedDataCredits(16, pool=pool, base=base)
        group.append(Member(credits, rng.randrange(100), rng.random() < 0.3))
        group[-1].available = credits.piggyback()
    totals = [m.to_send for m in group]
    for _ in range(200_000):
        if not any(m.to_send or m.in_flight or m.ready for m in group):
            break
        m = rng.choice(group)
        action = rng.random()
        if action < 0.4 and m.to_send and m.available:
            m.available -= 1
            m.to_send -= 1
            posted -= 1
            assert posted >= 0, "a message found the shared receive queue empty"
            m.in_flight.append(m.available == 0)
        elif action < 0.6 and m.in_flight:
            m.credits.arrived(m.in_flight.popleft())
            m.ready += 1
        elif action < (0.62 if m.slow else 0.8) and m.ready:
            m.ready -= 1
            m.received += 1
            posted += 1
            m.credits.reposted()
        elif m.credits.should_send_update():
            m.available += m.credits.piggyback()
            assert m.available <= m.credits.window
        assert sum(x.credits.tokens for x in group) + pool.free == buffers
        assert posted >= sum(x.available for x in group)  # every credit has its buffer
    else:
        pytest.fail(f"stuck: {group}")
    assert [m.received for m in group] == totals


def test_a_sender_always_short_of_credit_is_lent_the_whole_window_soon() -> None:
    """A fast sender and a reader that keeps up: each message that spends the
    sender's last credit doubles the reader's share, so within a few rounds
    it grants its whole window and credit updates come every half window."""
    pool = ReceivePool(64)
    assert pool.take(2)
    member = SharedDataCredits(32, pool=pool, base=2)
    available = member.piggyback()
    updates = 0
    for _ in range(400):
        in_flight = []
        while available:
            available -= 1
            in_flight.append(available == 0)
        for last in in_flight:
            member.arrived(last)
            member.reposted()
            if member.should_send_update():
                available += member.piggyback()
                updates += 1
    assert member.tokens == 32
    assert updates < 400 * 3  # about two per window's worth of messages once lent
