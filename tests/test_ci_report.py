"""The CI report's reading of speed figures, recorded budgets and test costs (on the host)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.costs import program_name

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ci-report"


def _report() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("ci_report", str(SCRIPT))
    spec = importlib.util.spec_from_loader("ci_report", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["/x/.venv/bin/python", "-m", "pytest", "-q"], "python -m pytest"),
        (["python3", "examples/rpc_kv.py", "serve"], "python rpc_kv.py"),
        (["python3.11", "-c", "pass"], "python -c"),
        ([b"/usr/bin/ib_write_bw", b"-d"], "ib_write_bw"),
        ("ray", "ray"),
        ([], "?"),
    ],
)
def test_a_started_program_is_named_by_what_it_runs(argv: object, name: str) -> None:
    assert program_name(argv) == name


def test_each_part_is_scaled_by_its_own_machine() -> None:
    report = _report()
    assert report.machine("  one host: the suite") == "one host"
    assert report.machine("two hosts (boot, demo, tests)") == "two hosts"
    assert report.machine("lint") == "host"


def test_the_recorded_budgets_are_read_from_their_table(tmp_path: Path) -> None:
    page = tmp_path / "CONTRIBUTING.md"
    page.write_text(
        "| a table | before |\n| --- | --- |\n| lint | 9 |\n\n"
        f"{_report().MARKER}: read by scripts/ci-report -->\n\n"
        "| part | budget | recorded s | python s |\n| --- | ---: | ---: | ---: |\n"
        "| lint | 6 min | 40 | 0.03 |\n"
        "| one host (boot, demo, suite, pure path) | 15 min | 1,020 | 0.75 |\n"
        "\nafter\n| ignored | 1 | 2 | 3 |\n"
    )
    assert _report().recorded(page) == {
        "lint": (40.0, 0.03),
        "one host (boot, demo, suite, pure path)": (1020.0, 0.75),
    }


PART = "one host (boot, demo, suite, pure path)"


def _warnings(tmp_path: Path, lines: str, speeds: str) -> str:
    times, speed = tmp_path / "times.tsv", tmp_path / "speed.tsv"
    times.write_text(lines)
    speed.write_text(speeds)
    return subprocess.run([sys.executable, str(SCRIPT), str(times)], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip


def test_a_part_grown_past_its_scaled_record_is_warned_of(tmp_path: Path) -> None:
    recorded = _report().recorded()
    assert PART in recorded, "CONTRIBUTING.md's scaled budgets table names the parts"
    seconds, python = recorded[PART]
    # the same machine speed twice as slow: twice the time is no growth
    slow = f"one host\tpython\t{2 * python}\n"
    out = _warnings(tmp_path, f"{round(2 * seconds)}\t{PART}\n", slow)
    assert "machine speed (one host): python" in out
    assert "warning" not in out
    out = _warnings(tmp_path, f"{round(3 * seconds)}\t{PART}\n", slow)  # 1.5x the record
    assert f"warning: {PART}: " in out
    assert "1.50x" in out


def test_a_short_part_is_warned_of_only_past_a_floor(tmp_path: Path) -> None:
    seconds, python = _report().recorded()["lint"]
    assert seconds < 40  # 50% of it is under the 30 s floor
    host = f"host\tpython\t{python}\n"
    assert "warning" not in _warnings(tmp_path, f"{round(1.5 * seconds)}\tlint\n", host)
    out = _warnings(tmp_path, f"{round(seconds + 31)}\tlint\n", host)
    assert "warning: lint: " in out
