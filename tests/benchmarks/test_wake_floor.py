"""The wake-up floor study's parsing and refusals (no device)."""

from __future__ import annotations

from pathlib import Path

import pytest

STRACE_TABLE = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 41.20    0.010000           5      2001           epoll_pwait
 30.00    0.007000           3      2000           read
  0.10    0.000020           1        12         3 openat
------ ----------- ----------- --------- --------- ----------------
100.00    0.017020           4      4013         3 total
"""


def test_strace_tables_are_counted_by_name(tmp_path: Path) -> None:
    from benchmarks.studies.wake_floor import strace_counts

    table = tmp_path / "trace"
    table.write_text(STRACE_TABLE)
    assert strace_counts(str(table)) == {
        "epoll_pwait": 2001, "read": 2000, "openat": 12, "total": 4013,
    }  # fmt: skip


def test_the_floor_refuses_the_ucxx_kind_without_its_interpreter_and_unknown_kinds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from benchmarks.studies import wake_floor

    for kinds, said in (("aiordma uvloop,ucxx uvloop", "needs --ucxx PYTHON"),
                        ("aiordma trio", "unknown kind 'aiordma trio'")):  # fmt: skip
        monkeypatch.setattr(sys, "argv", ["wake_floor", "--kinds", kinds])
        with pytest.raises(SystemExit) as exited:
            wake_floor.main()
        assert exited.value.code == 2
        assert said in capsys.readouterr().err


def test_the_floor_counts_no_packets_on_a_device_without_counters() -> None:
    from benchmarks.studies.wake_floor import machine_cpu, sent_packets

    assert sent_packets("no-such-device") == 0
    busy, softirq = machine_cpu()
    assert busy > 0
    assert 0 <= softirq <= busy
