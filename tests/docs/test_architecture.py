"""docs/architecture.md against the code: every private reach across modules is listed (host only).

A reach is ``obj._name`` where ``obj`` is not ``self``/``cls`` and the module
defines no ``_name`` of its own, or ``from aiordma... import _name`` of
something that is not a module (private modules are the import contracts'
business). Each one must be named in the page's "Internal interfaces".
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "aiordma"
PAGE = ROOT / "docs" / "architecture.md"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_here(tree: ast.AST) -> set[str]:
    """Names a module gives meaning to: its functions and classes, class
    attributes, ``self.x``/``cls.x`` assignments, variables and parameters."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def reaches(source: str, modules: set[str]) -> set[str]:
    """The private names ``source`` reaches in other modules (``modules``:
    the package's module names, whose private ones may be imported)."""
    tree = ast.parse(source)
    own = _defined_here(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
            target = node.value
            if isinstance(target, ast.Name) and target.id in ("self", "cls"):
                continue
            if isinstance(target, ast.Call) and getattr(target.func, "id", "") == "super":
                continue
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiordma"):
            for alias in node.names:
                if _private(alias.name) and f"{node.module}.{alias.name}" not in modules:
                    found.add(alias.name)
    return found


def documented(page: str) -> set[str]:
    """The private names in inline code of the page's "Internal interfaces"."""
    section = page.split("## Internal interfaces", 1)[1].split("\n## ", 1)[0]
    spans = re.findall(r"`([^`]+)`", section)
    return {name for span in spans for name in re.findall(r"(?<![\w])_[a-z]\w*", span)}


def undocumented(
    sources: Mapping[str, str], listed: Iterable[str], modules: set[str]
) -> dict[str, list[str]]:
    """Per module, the reaches ``listed`` does not name."""
    allowed = set(listed)
    out: dict[str, list[str]] = {}
    for module, source in sources.items():
        missing = reaches(source, modules) - allowed
        if missing:
            out[module] = sorted(missing)
    return out


def _package() -> tuple[dict[str, str], set[str]]:
    sources, modules = {}, set()
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules.add(name)
        sources[name] = path.read_text()
    for path in PACKAGE.rglob("*.pyx"):
        modules.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return sources, modules


def test_every_private_reach_is_a_documented_interface() -> None:
    sources, modules = _package()
    assert undocumented(sources, documented(PAGE.read_text()), modules) == {}


def test_an_undocumented_reach_is_caught() -> None:
    _, modules = _package()
    listed = documented(PAGE.read_text())
    added = {"aiordma.rpc.extra": "def peek(conn):\n    return conn._cm_id\n"}
    assert undocumented(added, listed, modules) == {"aiordma.rpc.extra": ["_cm_id"]}
    imported = {"aiordma.rpc.extra": "from aiordma.verbs.queue_pair import _OP_COUNTERS\n"}
    assert undocumented(imported, listed, modules) == {"aiordma.rpc.extra": ["_OP_COUNTERS"]}
    own = {"aiordma.rpc.extra": "class A:\n    def __init__(self):\n        self._x = 1\n"
           "def f(a):\n    return a._x\n"}  # fmt: skip
    assert undocumented(own, listed, modules) == {}  # its own module's name
    private_module = {"aiordma.cm.extra": "from aiordma.cm import _rdmacm\n"}
    assert undocumented(private_module, listed, modules) == {}  # the import contracts' business


def test_every_documented_interface_is_still_used() -> None:
    sources, modules = _package()
    used = set().union(*(reaches(source, modules) for source in sources.values()))
    defined = set().union(*(_defined_here(ast.parse(s)) for s in sources.values()))
    module_names = {module.rsplit(".", 1)[-1] for module in modules}
    listed = documented(PAGE.read_text()) - module_names
    assert listed - used - defined == set()  # a name the page lists that the code has not
