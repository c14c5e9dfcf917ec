"""The waiting policy's decisions and the polling setting (pure logic, on the host)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from aiordma.verbs._waiting import (
    AUTO_CAP,
    AUTO_START,
    DEFAULT,
    FLOOR,
    HIT_SHARE,
    MAX_BACKOFF,
    MAX_WINDOW,
    Polling,
    WaitPolicy,
)


def test_an_answer_that_keeps_coming_soon_keeps_the_spin_and_trims_the_window() -> None:
    policy = WaitPolicy(cpus=2)
    assert policy.start() == AUTO_START  # the first spin probes at the starting limit
    policy.hit(40e-6)
    assert policy.window == pytest.approx(max(FLOOR, 80e-6))
    for _ in range(50):
        assert policy.start() == policy.window > 0
        policy.hit(40e-6)
    assert (policy.spins, policy.hits, policy.misses) == (51, 51, 0)
    assert policy.window == pytest.approx(80e-6)


def test_a_miss_at_a_trimmed_window_retries_at_the_cap_before_backing_off() -> None:
    policy = WaitPolicy(cpus=2)
    policy.start()
    policy.hit(30e-6)
    assert policy.start() < AUTO_START
    policy.miss()
    policy.answered(200e-6)  # within the limit: nothing to grow
    assert policy.start() == AUTO_START  # no skip: the limit gets its try first
    policy.hit(30e-6)
    assert policy.skipped == 0


def test_misses_at_the_limit_back_off_exponentially_and_a_hit_ends_it() -> None:
    policy = WaitPolicy(cpus=2)
    assert policy.start() == AUTO_START
    policy.miss()
    gaps = []
    for _ in range(MAX_BACKOFF + 2):
        skipped = 0
        while policy.start() == 0:
            skipped += 1
        gaps.append(skipped)
        policy.miss()  # the probe (at the cap) that ended the skipping missed too
    # after the k-th miss in a row, 2**k - 1 expectations go unspun, k capped
    assert gaps == [(1 << min(k, MAX_BACKOFF)) - 1 for k in range(1, MAX_BACKOFF + 3)]
    assert policy.spins == policy.misses
    assert policy.hits == 0
    # a paced peer: at most one spin in 2**MAX_BACKOFF expectations once backed off
    before = policy.spins
    for _ in range(1 << MAX_BACKOFF):
        if policy.start():
            policy.miss()
    assert policy.spins - before == 1
    while not policy.start():
        pass
    policy.hit(100e-6)
    assert policy.start() > 0  # spinning again at once


def _spun_share(policy: WaitPolicy, hits: Callable[[int], bool], expectations: int = 4000) -> float:
    """Share of ``expectations`` spun for, when ``hits(n)`` says whether the
    n-th spin hits; the other spins' answers come later than the cap."""
    spun = 0
    for _ in range(expectations):
        if policy.start():
            spun += 1
            if hits(spun):
                policy.hit(100e-6)
            else:
                policy.miss()
                policy.answered(AUTO_CAP + 1e-3)
    return spun / expectations


def test_answers_that_come_soon_only_now_and_then_keep_the_backoff() -> None:
    # one spin in five hits: most spins miss, so a hit halves the backoff
    # rather than ending it, and the queue mostly sleeps, probing (a hit
    # that ended the backoff kept it spinning for 31% of the expectations)
    assert HIT_SHARE > 1 / 5
    assert _spun_share(WaitPolicy(cpus=2), lambda n: n % 5 == 0) < 0.15
    assert _spun_share(WaitPolicy(cpus=2), lambda n: n % 10 == 0) < 0.02


def test_answers_that_mostly_come_soon_keep_the_spin() -> None:
    # four spins in five hit: a hit ends the backoff, so a miss costs one
    # skipped expectation
    assert _spun_share(WaitPolicy(cpus=2), lambda n: n % 5 != 0) > 0.8


def test_late_answers_within_the_cap_grow_the_limit_and_forgive_the_miss() -> None:
    cap = 1e-3
    policy = WaitPolicy(cap=cap, cpus=2)
    assert policy.start() == AUTO_START
    policy.miss()
    policy.answered(500e-6)  # a near miss: the answer came before the cap
    assert policy.limit == pytest.approx(max(2 * AUTO_START, 750e-6))
    assert policy.late == 1
    assert policy.start() == policy.limit  # no backoff: spinning again, longer
    policy.miss()
    policy.answered(900e-6)
    assert policy.limit == cap  # never past the cap
    assert policy.start() == cap
    policy.hit(800e-6)
    assert policy.start() == cap  # twice the hits' mean is beyond the cap
    assert (policy.spins, policy.hits, policy.misses, policy.skipped) == (4, 1, 2, 0)


def test_an_answer_later_than_the_cap_backs_off_and_resets_the_limit() -> None:
    policy = WaitPolicy(cpus=2)
    policy.start()
    policy.miss()
    policy.answered(600e-6)
    assert policy.limit > AUTO_START
    policy.start()
    policy.miss()
    policy.answered(AUTO_CAP + 10e-3)  # a paced peer: a long wait is not a near miss
    assert policy.limit == AUTO_START
    assert policy.late == 1
    assert policy.start() == 0  # the miss's backoff stands
    assert policy.skipped == 1


def test_a_cap_below_the_start_bounds_the_limit() -> None:
    policy = WaitPolicy(cap=100e-6, cpus=2)
    assert policy.start() == 100e-6
    policy.miss()
    policy.answered(90e-6)
    assert policy.limit == 100e-6


def test_one_usable_cpu_never_spins() -> None:
    policy = WaitPolicy(cpus=1)
    assert not policy.enabled
    assert [policy.start() for _ in range(10)] == [0.0] * 10
    assert policy.spins == policy.skipped == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("auto", Polling("auto", AUTO_CAP)),
        ("auto:1000", Polling("auto", 1e-3)),
        ("off", Polling("off", 0.0)),
        ("0", Polling("off", 0.0)),
        ("300", Polling("fixed", 300e-6)),
        (250, Polling("fixed", 250e-6)),
        (Polling("fixed", 1e-3), Polling("fixed", 1e-3)),
    ],
)
def test_the_setting_reads_auto_off_and_microseconds(value: object, expected: Polling) -> None:
    setting = Polling.parse(value)  # type: ignore[arg-type]
    assert setting == expected
    assert setting.spins is (expected.mode != "off")


@pytest.mark.parametrize(
    "value",
    ["-5", "abc", "inf", "nan", "", -1, float("inf"), "auto:0", "auto:", "auto:x",
     "1e9", "100001", 1e9, "auto:1e9"],  # issue 81: a 1,000-second spin was taken
)  # fmt: skip
def test_a_bad_setting_names_itself(value: object) -> None:
    with pytest.raises(ValueError, match=f"not {value!r}"):
        Polling.parse(value)  # type: ignore[arg-type]


def test_the_window_is_bounded() -> None:
    assert Polling.parse("100000") == Polling("fixed", MAX_WINDOW)  # 0.1 s: the most
    with pytest.raises(ValueError, match=r"0 to 0.1 seconds \(MAX_WINDOW\), not 1000.0"):
        Polling("fixed", 1000.0)


def test_a_setting_of_the_wrong_kind_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not None"):
        Polling.parse(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seconds, not '1'"):
        Polling("fixed", "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'sometimes'"):
        Polling("sometimes")  # type: ignore[arg-type]


def test_the_environment_chooses_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIORDMA_POLL", raising=False)
    monkeypatch.delenv("AIORDMA_POLL_US", raising=False)
    assert Polling.from_environment() == DEFAULT == Polling("auto")
    monkeypatch.setenv("AIORDMA_POLL_US", "300")  # the older name: a fixed window
    assert Polling.from_environment() == Polling("fixed", 300e-6)
    monkeypatch.setenv("AIORDMA_POLL", "off")  # the newer one wins
    assert Polling.from_environment() == Polling("off")
    monkeypatch.setenv("AIORDMA_POLL", "often")
    with pytest.raises(ValueError, match=r"AIORDMA_POLL: .*'often'"):
        Polling.from_environment()
    monkeypatch.delenv("AIORDMA_POLL")
    monkeypatch.setenv("AIORDMA_POLL_US", "-5")
    with pytest.raises(ValueError, match=r"AIORDMA_POLL_US must be .* not '-5'"):
        Polling.from_environment()
