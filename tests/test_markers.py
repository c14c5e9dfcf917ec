"""The formatter and type checker are switched off line by line only within
a budget (host only).

``# fmt: skip`` and ``# type: ignore`` are each a place the tools stopped
checking; they grew with every feature until nobody chose them. Each file's
count is written in ``tests/markers.txt``: a file may not gain one without
that table saying so, in the same change, and the table follows the files
down as markers go (run this module's ``python -m tests.test_markers`` to
rewrite it).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "markers.txt"
MARKERS = ("# fmt: skip", "# type: ignore")
TREES = ("aiordma", "tests", "examples", "benchmarks")
LEFT_OUT = ("benchmarks/records/",)  # scripts of their time (benchmarks/README.md)


def counted() -> dict[str, tuple[int, int]]:
    """``{path: (fmt skips, type ignores)}`` for every file with any."""
    found = {}
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name.startswith(LEFT_OUT) or name == "tests/test_markers.py":
                continue
            text = path.read_text(encoding="utf-8")
            counts = tuple(text.count(marker) for marker in MARKERS)
            if any(counts):
                found[name] = (counts[0], counts[1])
    return found


def budget() -> dict[str, tuple[int, int]]:
    rows = {}
    for line in TABLE.read_text().splitlines():
        if line and not line.startswith("#"):
            fmt, ignore, name = line.split()
            rows[name] = (int(fmt), int(ignore))
    return rows


def test_each_file_keeps_to_its_budget_of_markers() -> None:
    actual, allowed = counted(), budget()
    over = {n: (c, allowed.get(n, (0, 0))) for n, c in actual.items() if c != allowed.get(n)}
    gone = sorted(set(allowed) - set(actual))
    assert over == {}, "(found, tests/markers.txt) differ: python -m tests.test_markers"
    assert gone == [], "listed without markers: python -m tests.test_markers"


def test_the_library_holds_fewer_markers_than_when_the_budget_was_set() -> None:
    """Issue 83 counted 264 ``# fmt: skip`` and 42 ``# type: ignore`` in the library."""
    library = [c for n, c in counted().items() if n.startswith("aiordma/")]
    assert sum(c[0] for c in library) < 264
    assert sum(c[1] for c in library) < 42


if __name__ == "__main__":
    rows = counted()
    lines = ["# fmt-skips type-ignores path (tests/test_markers.py)"]
    lines += [f"{fmt} {ignore} {name}" for name, (fmt, ignore) in rows.items()]
    TABLE.write_text("\n".join(lines) + "\n")
    print(f"{TABLE.relative_to(ROOT)}: {len(rows)} files", file=sys.stderr)
