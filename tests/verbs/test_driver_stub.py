"""The compiled driver's stub takes its members from the protocols, and the
compiled classes have them, with the same parameters (no device needed).

The driver interface is stated once, in ``_driver/base.py`` (Protocols);
the stub ``_core.pyi`` (what mypy sees of the compiled module) derives its
classes from them, and ``_core.pyx`` implements them: a method added to the
protocols and not to the compiled core fails here, not in a user's process.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

DRIVER = Path(__file__).resolve().parents[2] / "aiordma" / "verbs" / "_driver"
CLASSES = ("CQDriver", "QPDriver", "SRQDriver")


def _members(path: Path) -> dict[str, dict[str, tuple[str, ...] | None]]:
    """Per class of ``CLASSES``: member name -> its parameters (None: an attribute)."""
    tree = ast.parse(path.read_text())
    found: dict[str, dict[str, tuple[str, ...] | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in CLASSES:
            members: dict[str, tuple[str, ...] | None] = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name != "__init__":
                    params = [*item.args.posonlyargs, *item.args.args, *item.args.kwonlyargs]
                    members[item.name] = tuple(a.arg for a in params)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members[item.target.id] = None
            found[node.name] = members
    return found


def test_the_stub_types_each_class_as_its_protocol_and_restates_none_of_it() -> None:
    tree = ast.parse((DRIVER / "_core.pyi").read_text())
    made = {
        node.name: ast.unparse(node.returns) if node.returns else None
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in CLASSES
    }
    assert made == {name: f"base.{name}" for name in CLASSES}
    assert not _members(DRIVER / "_core.pyi"), "a driver class restated in the stub"


def test_the_compiled_classes_have_every_member_of_their_protocols() -> None:
    core = pytest.importorskip("aiordma.verbs._driver._core")
    protocols = _members(DRIVER / "base.py")
    for name in CLASSES:
        cls = getattr(core, name)
        missing = sorted(m for m in protocols[name] if not hasattr(cls, m))
        assert not missing, f"the compiled {name} lacks {missing}"
        for member, params in protocols[name].items():
            if params is None:
                continue
            try:
                signature = inspect.signature(getattr(cls, member))
            except (TypeError, ValueError):  # no signature kept for this method
                continue
            assert tuple(signature.parameters) == params, f"compiled {name}.{member}"
