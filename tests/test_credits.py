"""Credit accounting (no device): never send without a posted buffer, never deadlock."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import pytest

from aiordma.credits import CreditWindow


def test_last_credit_is_kept_for_credit_updates() -> None:
    w = CreditWindow(4)
    assert [w.take_for_data() for _ in range(3)] == [0, 0, 0]
    assert not w.can_send_data()
    with pytest.raises(RuntimeError):
        w.take_for_data()
    w.granted(2)
    assert w.available == 3


def test_owed_credits_ride_on_the_next_packet() -> None:
    w = CreditWindow(8)
    for _ in range(3):
        w.reposted(for_data=True)
    assert w.take_for_data() == 3
    assert w.owed == 0


def test_update_is_due_after_half_a_window_of_data() -> None:
    w = CreditWindow(8)
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
        CreditWindow(4).granted(1)
    with pytest.raises(ValueError, match="at least 4"):
        CreditWindow(3)


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
    a = Side(CreditWindow(window), window, rng.randrange(200))
    b = Side(CreditWindow(window), window, rng.randrange(200))
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
