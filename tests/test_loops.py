"""Which event loops the async tests run on (host only).

An async test runs on uvloop, the loop the docs recommend, unless the loop
is its subject: then it is marked ``both_loops(AREA)`` and runs on asyncio's
loop as well. Each area of :data:`tests.conftest.LOOP_SUBJECTS` must keep
tests on both loops; the check below reads the test sources, so it holds
whatever subset of the suite a run selects.
"""

from __future__ import annotations

import ast
import asyncio
import collections
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import DEFAULT_LOOP, LOOP_SUBJECTS, pytest_asyncio_loop_factories

TESTS = Path(__file__).parent


def _both_loops_area(node: ast.expr) -> str | None:
    """The area of a ``pytest.mark.both_loops("area")`` expression, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "both_loops"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None


def loop_subject_tests() -> dict[str, list[str]]:
    """Async test functions on both loops, by area: ``path::name``."""
    found: dict[str, list[str]] = collections.defaultdict(list)
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        module_areas = [
            area
            for stmt in tree.body
            if isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets)
            for value in (stmt.value.elts if isinstance(stmt.value, ast.List) else [stmt.value])
            if (area := _both_loops_area(value)) is not None
        ]
        for node in ast.walk(tree):
            if isinstance(node, ast.AsyncFunctionDef) and node.name.startswith("test_"):
                areas = [a for d in node.decorator_list if (a := _both_loops_area(d)) is not None]
                for area in areas + module_areas:
                    found[area].append(f"{path.relative_to(TESTS.parent)}::{node.name}")
    return found


def test_each_loop_subject_keeps_tests_on_both_loops() -> None:
    found = loop_subject_tests()
    assert set(found) <= set(LOOP_SUBJECTS), f"unknown areas: {set(found) - set(LOOP_SUBJECTS)}"
    missing = [area for area in LOOP_SUBJECTS if not found.get(area)]
    assert not missing, f"no test runs on both loops for: {missing} (mark some both_loops)"


@dataclass
class _Item:
    markers: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


@dataclass
class _Config:
    loops: list[str] | None = None

    def getoption(self, name: str) -> list[str] | None:
        assert name == "loops"
        return self.loops


def test_the_loop_subject_runs_on_both_loops_and_everything_else_on_uvloop() -> None:
    def loops(config: _Config, item: _Item) -> list[str]:
        return list(pytest_asyncio_loop_factories(config, item))  # type: ignore[arg-type]

    assert loops(_Config(), _Item({"both_loops"})) == ["asyncio", "uvloop"]
    assert loops(_Config(), _Item()) == [DEFAULT_LOOP] == ["uvloop"]
    assert loops(_Config(["asyncio"]), _Item()) == ["asyncio"]  # --loop chooses for all
    assert loops(_Config(["asyncio"]), _Item({"both_loops"})) == ["asyncio"]


@pytest.mark.asyncio
async def test_an_async_test_runs_on_the_default_loop(pytestconfig: pytest.Config) -> None:
    running = type(asyncio.get_running_loop()).__module__.split(".")[0]
    assert running == (pytestconfig.getoption("loops") or [DEFAULT_LOOP])[0]
